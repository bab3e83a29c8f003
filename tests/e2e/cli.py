"""Running the ``sparkpoint`` CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLE_DIR

JOB = EXAMPLE_DIR / "job.yaml"
SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYSPARK_PYTHON"] = sys.executable
    e["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return e


def sp(
    *args: str, check: bool = True, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [SPARKPOINT, *args], input=stdin, capture_output=True, text=True, env=env(), timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"sparkpoint {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
        )
    return proc


def popen(*args: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 - closed by the OS when the child exits
    return subprocess.Popen([SPARKPOINT, *args], stdout=out, stderr=subprocess.STDOUT, env=env())
