"""The Python worker daemon of sparkpoint's Spark jobs (``spark.python.daemon.module``).

Spark starts its Python daemon with its own ``pyspark.zip`` first on the path. A zip holds no
compiled bytecode, so the daemon compiled pyspark from source at every job start, and every
worker it forked compiled ``pyspark.worker`` again: about 0.6 s per process here, against
0.16 s for the same modules from the installed package's cached bytecode.

When that zip lies inside the installed pyspark package itself (pyspark installed by pip: the
same files, the same version), this daemon takes it off the path and imports pyspark from the
package. It then imports the workers' modules once, before it forks, so every worker starts
with them. A zip from a separate Spark installation (``SPARK_HOME`` elsewhere) stays first, as
Spark intends.

Only modules that start no threads are imported before the fork (a fork copies one thread):
pyarrow and pandas start threads when imported, so workers import those themselves, as
pyspark intends. Before it forks, it freezes what it imported (``gc.freeze``), so that the
workers' garbage collections neither walk nor copy it.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from pathlib import Path


def installed_package_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are zips inside the installed pyspark package's directory
    (its ``python/lib/pyspark.zip`` and py4j's source zip)."""
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in saved if not p.endswith(".zip")]
        spec = importlib.util.find_spec("pyspark")
    finally:
        sys.path[:] = saved
    if spec is None or spec.origin is None:
        return []
    package = Path(spec.origin).resolve().parent
    return [p for p in path if p.endswith(".zip") and package in Path(p).resolve().parents]


def main() -> None:
    for entry in installed_package_zips(sys.path):
        sys.path.remove(entry)
    import pyspark.worker  # noqa: F401  (every worker imports it)
    from pyspark.daemon import manager

    import sparkpoint.runtime.executor.task_batch  # noqa: F401  (the task API's whole batch path)

    gc.freeze()  # see runtime/executor/worker_heap.py: the workers' collections skip all this
    manager()


if __name__ == "__main__":
    main()
