"""Running the ``sparkpoint`` CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from sparkpoint.config import Config
from tests.conftest import EXAMPLE_DIR

JOB = EXAMPLE_DIR / "job.yaml"
SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")


def env() -> dict[str, str]:
    """The test's environment, less the terminal size pytest-xdist's workers set (80 columns):
    a user's piped run has none."""
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    e["PYSPARK_PYTHON"] = sys.executable
    e["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return e


def sp(
    *args: str,
    check: bool = True,
    stdin: str | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [SPARKPOINT, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env(),
        timeout=timeout,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"sparkpoint {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
        )
    return proc


def popen(*args: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 - closed by the OS when the child exits
    return subprocess.Popen([SPARKPOINT, *args], stdout=out, stderr=subprocess.STDOUT, env=env())


def wait_for_checkpoints(
    config: Config,
    driver: subprocess.Popen[bytes],
    log: Path,
    tasks: int,
    timeout: float = 240,
    *,
    progress: int = 0,
) -> None:
    """Wait until ``tasks`` tasks of the running ``driver`` have a checkpoint, covering at
    least ``progress`` input messages in all (fails the test, with the end of its log, if it
    exits or takes longer than ``timeout`` seconds): a kill test's moment to kill."""
    from sparkpoint.checkpoint.manager import CheckpointManager
    from tests.helpers import input_progress

    manager = CheckpointManager(config)
    deadline = time.monotonic() + timeout
    while True:
        checkpoints = manager.read_all()
        if len(checkpoints) >= tasks and input_progress(checkpoints, config) >= progress:
            return
        alive = driver.poll() is None
        assert alive and time.monotonic() < deadline, (
            f"{'no' if alive else 'the driver ended with no'} {tasks} checkpoints covering "
            f"{progress} messages within {timeout:.0f} s: " + log.read_text()[-3000:]
        )
        time.sleep(0.1)


def locality_wait() -> float:
    """``spark.locality.wait`` on a cluster, in seconds. A batch that waited for a lost
    executor took at least this long (31 to 35 s seen before the fix), so a test asserts its
    slowest batch is shorter: a bound the bug cannot meet however loaded the machine is
    (12 s was seen for a good batch with two test workers on two cores)."""
    from sparkpoint.runtime.spark.session import CLUSTER_DEFAULTS

    return float(CLUSTER_DEFAULTS["spark.locality.wait"].removesuffix("s"))


def slowest_batch(text: str) -> float:
    """The longest batch of a run's progress lines, in seconds."""
    return max(float(s) for s in re.findall(r"^batch \d+: .*? in ([\d.]+)s", text, re.M))
