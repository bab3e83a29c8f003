"""``sparkpoint run --supervise``: the driver killed with SIGKILL three times mid-run is
restarted each time, and the job ends caught up with exact state, exit 0; a user error (exit 2)
is not restarted; the supervisor's own options never reach the driver."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config, parse_overrides
from sparkpoint.runtime.driver.supervise import backoff_s, child_command
from tests.e2e.cli import JOB, popen, sp
from tests.helpers import committed_counts, generate, input_progress

pytestmark = pytest.mark.slow

STARTED = re.compile(r"supervisor: driver started \(pid (\d+), restart (\d+)\)")


def progress(manager: CheckpointManager, config: Config) -> int:
    return input_progress(manager.read_all(), config)


def test_a_driver_killed_three_times_is_restarted_and_ends_exact(tmp_path: Path) -> None:
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=200",
        "task.batch.max.messages=1000",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    expected = generate(config, tmp_path / "job.yaml", 150_000, seed=12, users=200)
    log = tmp_path / "supervised.log"
    supervisor = popen(
        "run",
        str(JOB),
        "--until-caught-up",
        "--supervise",
        "--max-restarts",
        "5",
        *set_args,
        log=log,
    )
    manager = CheckpointManager(config)
    try:
        for restart in range(3):
            deadline = time.monotonic() + 120
            while True:  # this restart's driver, once it has committed progress of its own
                assert supervisor.poll() is None, log.read_text()[-2000:]
                started = [m for m in STARTED.finditer(log.read_text()) if int(m[2]) == restart]
                done = progress(manager, config)
                if started and done > (restart + 1) * 4_000:
                    break
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.05)
            os.kill(int(started[0][1]), signal.SIGKILL)
        assert supervisor.wait(timeout=240) == 0, log.read_text()[-2000:]
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    text = log.read_text()
    assert "driver died (signal SIGKILL); restart 3 in 4s" in text
    assert "done (caught up)" in text
    assert committed_counts(config) == dict(expected)


def test_a_user_error_is_not_restarted(tmp_path: Path) -> None:
    result = sp(
        "run",
        str(JOB),
        "--supervise",
        "--set",
        "task.commit.ms=soon",
        "--set",
        f"job.data.dir={tmp_path}",
        check=False,
    )
    assert result.returncode == 2
    assert "user error (exit 2): not restarted" in result.stderr
    assert result.stderr.count("driver started") == 1


def test_the_driver_s_command_drops_the_supervisor_s_options() -> None:
    argv = ["run", "job.yaml", "--supervise", "--max-restarts", "3", "--until-caught-up"]
    assert child_command(argv) == [
        sys.executable,
        "-m",
        "sparkpoint",
        "run",
        "job.yaml",
        "--until-caught-up",
    ]
    assert child_command(["run", "j", "--max-restarts=2", "--supervise"])[3:] == ["run", "j"]
    assert [backoff_s(n) for n in (1, 2, 3, 6, 9)] == [1.0, 2.0, 4.0, 30.0, 30.0]
