"""The example job end to end on local Spark, killed with SIGKILL mid-run and run again."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sparkpoint.config import load_config, parse_overrides
from tests.e2e.cli import JOB, popen, sp, wait_for_checkpoints
from tests.helpers import (
    assert_at_least_once,
    committed_counts,
    emitted_counts,
    generate,
)

pytestmark = pytest.mark.slow


def test_kill_9_mid_run_then_restart_gives_exact_state(tmp_path: Path) -> None:
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=300",
        "task.batch.max.messages=1500",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    expected = generate(config, tmp_path / "job.yaml", 120_000, seed=11, users=200)

    driver = popen("run", str(JOB), "--until-caught-up", *set_args, log=tmp_path / "run1.log")
    wait_for_checkpoints(config, driver, tmp_path / "run1.log", 4, 180, progress=20_000)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert driver.returncode == -signal.SIGKILL
    partial = committed_counts(config)
    assert 0 < sum(partial.values()) < sum(expected.values())

    result = sp("run", str(JOB), "--until-caught-up", *set_args)
    assert "done (caught up)" in result.stderr
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
