"""Making a job's own modules importable by the driver and by every Python worker.

A job file names its task class (``task.class: module:Class``) or pipeline by module; the
modules live next to the job file (or the pipeline's module). The CLI and the test kit's
:class:`~sparkpoint.testing.JobTestDriver` both put that directory on the import path here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sparkpoint.config import Config


def with_dir_on_path(config: Config, directory: Path) -> Config:
    """``config`` with ``directory`` importable by the driver (``sys.path``), local workers
    (``PYTHONPATH``) and Spark executors (``spark.executorEnv.PYTHONPATH``). Idempotent."""
    job_dir = str(directory)
    if job_dir not in sys.path:
        sys.path.insert(0, job_dir)
    paths = list(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    if job_dir not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([job_dir, *paths])
    key = "spark.executorEnv.PYTHONPATH"
    extra = [p for p in (config.get(key) or "").split(os.pathsep) if p and p != job_dir]
    return config.with_overrides({key: os.pathsep.join([job_dir, *extra])})
