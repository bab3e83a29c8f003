"""A class-data-sharing (AppCDS) archive of the Spark driver JVM, to start Spark faster.

A Spark session takes seconds to start, most of it the JVM loading and verifying thousands of
classes from pyspark's jars. Java 13+ can dump the classes a run loaded into an archive
(``-XX:ArchiveClassesAtExit``) and map them at the next start (``-XX:SharedArchiveFile``).
The archive belongs to one pyspark installation (its jar paths) and one JVM build; the JVM
checks both and ignores an archive that does not match, so a stale one costs nothing but the
lost speed-up.

:func:`create` makes it once, in a child process that starts a local session and runs a small
RDD job and an Arrow DataFrame job (so their classes are archived too); ``scripts/bootstrap.sh``
calls it after installing (``python -m sparkpoint.runtime.spark.jvm_archive``). :func:`java_options`
is what :func:`sparkpoint.runtime.spark.session.spark_session` adds to the driver's options when the
archive exists and ``job.spark.class.archive`` is true (the default).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

_CHILD = """
import os, sys
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession
spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.extraJavaOptions", sys.argv[1])
    .getOrCreate()
)
spark.sparkContext.parallelize(range(8), 4).map(lambda x: x + 1).collect()
df = spark.range(1000).selectExpr("id", "cast(id as string) as s")
df.mapInArrow(lambda batches: batches, df.schema).count()
print("sparkpoint-jvm-pid", spark.sparkContext._gateway.proc.pid, flush=True)
spark.stop()
"""


def archive_path() -> Path:
    """Where this installation's archive lives: inside the Python environment that holds the
    pyspark jars it was made from."""
    import pyspark

    return Path(sys.prefix) / "share" / "sparkpoint" / f"spark-{pyspark.__version__}.jsa"


def java_options() -> str:
    """The driver JVM option that maps the archive, or ``""`` when there is none."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else ""


def create(path: Path | None = None, *, timeout: float = 300) -> Path:
    """Make the archive (replacing any), atomically: the JVM writes a temporary file as it
    exits, renamed once that JVM is gone."""
    path = path or archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, f"-XX:ArchiveClassesAtExit={tmp}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the JVM archive run failed: {done.stderr.strip()[-800:]}")
    found = re.search(r"sparkpoint-jvm-pid (\d+)", done.stdout)
    if found is None:
        raise RuntimeError(f"the JVM archive run printed no JVM pid: {done.stdout[-800:]}")
    jvm = int(found.group(1))
    deadline = time.monotonic() + timeout
    while _alive(jvm):  # the dump happens as the JVM exits, after the Python side has gone
        if time.monotonic() > deadline:
            raise RuntimeError(f"the JVM (pid {jvm}) did not exit within {timeout:.0f}s")
        time.sleep(0.1)
    if not tmp.is_file() or tmp.stat().st_size == 0:
        raise RuntimeError(f"the JVM wrote no archive at {tmp}")
    tmp.replace(path)
    return path


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


if __name__ == "__main__":
    started = time.monotonic()
    made = create()
    size = made.stat().st_size / 1e6
    print(f"Spark JVM class archive: {made} ({size:.0f} MB, {time.monotonic() - started:.0f}s)")
