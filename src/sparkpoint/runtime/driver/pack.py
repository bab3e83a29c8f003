"""``sparkpoint pack``: the running virtual env as an archive for ``sparkpoint submit
--env-archive`` (PySpark's "Python Package Management" recipe: ``venv-pack``, shipped with
``--archives ARCHIVE#environment``), so a cluster's workers need nothing installed but Java.

venv-pack (made for exactly this) does the packing: the env's files with their scripts' shebangs
made relocatable. The archive does not hold Python itself: the workers need the same Python
version at the same path. Spark's jars (``pyspark/jars``, about 460 MB of the env) are left out
by default: executors, and a cluster-mode driver's Python, run in the cluster's own Spark JVM and
import only pyspark's Python modules.

The archive is a zip, because of how Spark unpacks ``--archives`` (Hadoop's Java untar, measured
with Spark 4 on a standalone cluster): a tar's file modes are dropped (``./environment/bin/python``
is then not executable: "error=13, Permission denied"), and a link that leads out of the unpacked
directory is refused ("expanding bin/python3.11 would create entry outside of ..."). A venv's
Python is such a link (to the interpreter it was made from), so links that lead out of the env
are packed as the files they lead to (the interpreter's small launcher, which loads the Python
library from its install: hence the same Python at the same path); a zip's modes are kept.

venv-pack cannot pack an env with editable installs (``pip install -e``): the files live
outside it. The error names the way out: install sparkpoint from a wheel into a fresh env
(``docker/install.sh VENV``) and pack that one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sparkpoint.errors import UserError

#: the archive's suffix (see the module docstring: why not a tar)
SUFFIX = ".zip"
#: Spark's JVM files in the pyspark package, left out unless asked for (the cluster has its own)
SPARK_JARS = "lib/python*/site-packages/pyspark/jars/*"
#: never packed: a venv's ``lib64`` link to ``lib`` (a zip would hold ``lib`` twice), and
#: ``pyvenv.cfg`` (venv-pack writes it itself; its listing would add it a second time)
LEFT_OUT = ("lib64", "pyvenv.cfg")


def current_env() -> Path:
    """The virtual env this Python runs in; an error outside one."""
    if sys.prefix == sys.base_prefix:
        raise UserError(
            f"this Python ({sys.executable}) is not in a virtual env: sparkpoint pack packs "
            "the virtual env sparkpoint runs from (python -m venv ENV; ENV/bin/pip install "
            "sparkpoint; ENV/bin/sparkpoint pack)"
        )
    return Path(sys.prefix)


def inside(env: Path, files: list[Any]) -> list[Any]:
    """venv-pack's ``files`` of ``env`` with each symlink that leads out of the env replaced
    by the file it leads to (see the module docstring)."""
    from venv_pack import File

    root = env.resolve()
    kept = []
    for f in files:
        source = Path(f.source)
        if source.is_symlink() and not source.resolve().is_relative_to(root):
            f = File(str(source.resolve()), f.target)
        kept.append(f)
    return kept


def pack_env(
    output: Path,
    *,
    env: Path | None = None,
    spark_jars: bool = False,
    force: bool = False,
    progress: bool = False,
) -> Path:
    """Pack ``env`` (default: the running one) into the zip ``output``; its path."""
    from venv_pack import Env, VenvPackException

    if output.suffix != SUFFIX:
        raise UserError(
            f"{output}: name the archive *{SUFFIX}: Spark unpacks a tar's files without their "
            "modes (Python would not be executable on the workers)"
        )
    if output.exists() and not force:
        raise UserError(f"{output} exists: remove it, or pass --force to overwrite it")
    prefix = env or current_env()
    try:
        packed = Env(str(prefix))
        for pattern in LEFT_OUT if spark_jars else (*LEFT_OUT, SPARK_JARS):
            packed = packed.exclude(pattern)
        if not any(f.target.endswith("/sparkpoint/__init__.py") for f in packed.files):
            raise UserError(f"sparkpoint is not installed in {prefix}: nothing would run it")
        packed.files = inside(prefix, packed.files)
        written = packed.pack(output=str(output), force=force, verbose=progress)
    except VenvPackException as exc:
        message = " ".join(str(exc).split())
        if "editable" in message:
            message += (
                f". The env {prefix} has editable installs (pip install -e), whose files are "
                "not in it: install sparkpoint from a wheel into a fresh env "
                "(docker/install.sh VENV) and run VENV/bin/sparkpoint pack"
            )
        raise UserError(f"cannot pack {prefix}: {message}") from exc
    return Path(written)


__all__ = ["LEFT_OUT", "SPARK_JARS", "SUFFIX", "current_env", "inside", "pack_env"]
