"""``sparkpoint submit``: the ``spark-submit`` command that runs a job where Spark users run jobs
(YARN, Kubernetes, a standalone cluster, ``local``), built from the job file.

The command runs sparkpoint's CLI (``sparkpoint/__main__.py run JOB``) as the application.
It ships the job file (``--files``) and the ``*.py`` modules next to it, zipped
(``--py-files``), so the driver and the executors import the job's tasks or pipeline wherever
they run. With ``--env-archive`` (a packed virtual env holding pyspark and sparkpoint, a zip:
``sparkpoint pack``, :mod:`sparkpoint.runtime.driver.pack`) the environment itself is shipped
(``--archives ARCHIVE#environment``) and Python on the executors (and, in cluster mode, the
driver) is ``./environment/bin/python``: the workers need nothing installed but Java. A
client-mode driver runs here, on this Python (the one with sparkpoint). In cluster
mode the job file is named by its base name (it sits in the driver's working directory).
Everything is checked before spark-submit runs: a missing job file or archive is an error.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import sparkpoint
from sparkpoint.config import load_config
from sparkpoint.errors import UserError
from sparkpoint.runtime.spark.session import log4j_config

DEPLOY_MODES = ("client", "cluster")
ENV_PYTHON = "./environment/bin/python"


def spark_submit_path() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"


def modules_zip(job: Path, staging: Path) -> Path | None:
    """The ``*.py`` files next to ``job``, zipped into ``staging`` (``None``: there are none)."""
    modules = sorted(job.resolve().parent.glob("*.py"))
    if not modules:
        return None
    staging.mkdir(parents=True, exist_ok=True)
    target = staging / f"{job.stem}-modules.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for module in modules:
            try:
                archive.write(module, module.name)
            except OSError as exc:
                raise UserError(
                    f"cannot ship the job's module {module} ({exc.strerror or exc}): every "
                    f"*.py file next to the job file goes with it; fix or remove that file"
                ) from None
    return target


def submit_command(
    job: Path,
    *,
    master: str,
    deploy_mode: str = "client",
    env_archive: Path | None = None,
    conf: Sequence[str] = (),
    run_args: Sequence[str] = (),
    staging: Path,
    spark_args: Sequence[str] = (),
) -> list[str]:
    """The spark-submit command for ``job`` (see the module docstring); ``conf``: ``k=v``
    Spark settings, ``run_args``: options of ``sparkpoint run``, ``spark_args``: more
    options of spark-submit, passed as they are."""
    if not job.is_file():
        raise UserError(f"job file {job} does not exist: nothing to submit")
    if deploy_mode not in DEPLOY_MODES:
        raise UserError(f"--deploy-mode {deploy_mode!r}: use client or cluster")
    if env_archive is not None and not env_archive.is_file():
        raise UserError(
            f"--env-archive {env_archive} does not exist: pack the job's environment first "
            "(sparkpoint pack -o env.zip)"
        )
    config = load_config(job)  # a job file that does not load fails here, not on the cluster
    command = [
        str(spark_submit_path()),
        "--master",
        master,
        "--deploy-mode",
        deploy_mode,
        "--name",
        f"sparkpoint-{config.job_name}-{config.job_id}",
        "--files",
        str(job.resolve()),
    ]
    zipped = modules_zip(job, staging)
    if zipped is not None:
        command += ["--py-files", str(zipped)]
    if env_archive is not None:
        command += ["--archives", f"{env_archive.resolve()}#environment"]
        command += ["--conf", f"spark.pyspark.python={ENV_PYTHON}"]
        if deploy_mode == "cluster":
            command += ["--conf", f"spark.pyspark.driver.python={ENV_PYTHON}"]
    if deploy_mode == "client":
        # the driver runs here: on this Python (with sparkpoint), and Spark's INFO lines stay
        # out of the terminal, as in run
        command += ["--conf", f"spark.pyspark.driver.python={sys.executable}"]
        command += ["--driver-java-options", f"-Dlog4j2.configurationFile=file:{log4j_config()}"]
    for setting in conf:
        if "=" not in setting:
            raise UserError(f"--conf {setting!r}: give key=value")
        command += ["--conf", setting]
    main = Path(sparkpoint.__file__).resolve().parent / "__main__.py"
    where = job.name if deploy_mode == "cluster" else str(job.resolve())
    return [*command, *spark_args, str(main), "run", where, *run_args]


__all__ = ["DEPLOY_MODES", "modules_zip", "spark_submit_path", "submit_command"]
