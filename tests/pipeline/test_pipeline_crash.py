"""The DataFrame example killed with SIGKILL mid-run and run again: state exact, stream output
at-least-once, and the Parquet sink holds every view exactly once (no batch written twice)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from generate import events

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import load_config, parse_overrides
from sparkpoint.runtime.pipeline import ParquetSink
from tests.e2e.cli import JOB, popen, sp
from tests.helpers import assert_at_least_once, committed_counts, emitted_counts, generate

pytestmark = pytest.mark.slow

PIPELINE = "pageviews_pipeline:job"
N = 60_000


def _views(path: Path) -> Counter[tuple[str, int]]:
    table = pq.read_table(path)
    users, stamps = table.column("user").to_pylist(), table.column("ts").to_pylist()
    return Counter(zip(users, stamps, strict=True))


def test_kill_9_mid_run_then_restart_exact_state_and_parquet_once(tmp_path: Path) -> None:
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=1500",
        "task.batch.max.messages=1000",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    expected = generate(config, tmp_path / "job.yaml", N, seed=13, users=150)
    sink = ParquetSink(tmp_path / "data" / "enriched-views")

    driver = popen("run", PIPELINE, "--until-caught-up", "-v", *set_args, log=tmp_path / "r1.log")
    manager = CheckpointManager(config)
    deadline = time.monotonic() + 240
    while True:
        assert driver.poll() is None, (
            "the job finished before it could be killed: "
            + (tmp_path / "r1.log").read_text()[-3000:]
        )
        checkpoints = manager.read_all()
        written = sink.last_committed() or 0
        if len(checkpoints) == 4 and written >= 4:
            break
        assert time.monotonic() < deadline, "no checkpoints within 240 s"
        time.sleep(0.05)
    time.sleep(0.7)  # land somewhere inside a later batch
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert driver.returncode == -signal.SIGKILL
    partial = committed_counts(config)
    assert 0 < sum(partial.values()) < N

    result = sp("run", PIPELINE, "--until-caught-up", "-v", *set_args, timeout=600)
    assert "done (caught up)" in result.stderr
    assert "replaying batches" in result.stderr, result.stderr[-3000:]
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
    want = Counter((str(e["user"]), int(str(e["ts"]))) for e in events(N, 13, 150))
    assert _views(tmp_path / "data" / "enriched-views") == want
