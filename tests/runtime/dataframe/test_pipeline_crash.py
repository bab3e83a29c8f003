"""The DataFrame example killed with SIGKILL mid-run and run again (exactly-once: state exact,
each count once on the stream, each view once in Parquet); and Python workers that die in a
fused output, retried by Spark (at-least-once: state exact, output repeated)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from generate import events

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config, parse_overrides
from sparkpoint.failpoints import FRAME_POINTS
from sparkpoint.runtime.dataframe.sinks import ParquetSink
from tests.e2e.cli import JOB, popen, sp
from tests.helpers import (
    assert_at_least_once,
    assert_committed_state_matches_its_offsets,
    assert_exactly_once,
    committed_counts,
    emitted_counts,
    generate,
)

pytestmark = pytest.mark.slow

PIPELINE = "pageviews_pipeline:job"
N = 16_000


def _views(path: Path) -> Counter[tuple[str, int]]:
    table = pq.read_table(path)
    users, stamps = table.column("user").to_pylist(), table.column("ts").to_pylist()
    return Counter(zip(users, stamps, strict=True))


def test_kill_9_mid_run_then_restart_exact_state_and_output_once(tmp_path: Path) -> None:
    """The default master (local[*,4]: Spark retries tasks), the default commit interval's
    order of magnitude, exactly-once output: the kill lands inside a later batch."""
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=1500",
        "task.batch.max.messages=500",
        "job.processing.guarantee=exactly-once",
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
    assert_exactly_once(config, expected)
    want = Counter((str(e["user"]), int(str(e["ts"]))) for e in events(N, 13, 150))
    assert _views(tmp_path / "data" / "enriched-views") == want


def _worker_exits(
    tmp_path: Path, pipeline: str, point: str, *, seed: int, guarantee: str = "at-least-once"
) -> tuple[Config, Counter[str], subprocess.CompletedProcess[str]]:
    """6,000 views run by ``pipeline`` on the default master (Spark retries a task up to 4
    times), a Python worker exiting (os._exit) the 3rd time it passes ``point``; the config,
    the expected counts and the run."""
    flag = tmp_path / "crash"
    flag.write_text("2")
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=0",
        "task.batch.max.messages=500",
        f"job.processing.guarantee={guarantee}",
        f"testing.crash.at={point}",
        f"testing.crash.flag={flag}",
        "testing.crash.mode=exit",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    expected = generate(config, tmp_path / "job.yaml", 6_000, seed=seed, users=60)
    run = sp("run", pipeline, "--until-caught-up", "-v", *set_args, timeout=600)
    assert not flag.exists()  # the worker died once, and the run went on
    return config, expected, run


@pytest.mark.parametrize(
    ("pipeline", "point"),
    # the example's output after its flush: its exactly-once twin below covers that path
    [("counts_pipeline:job", p) for p in FRAME_POINTS] + [(PIPELINE, "during-stateful-step")],
)
def test_a_fused_output_whose_worker_dies_is_retried_and_drops_the_batch(
    tmp_path: Path, pipeline: str, point: str
) -> None:
    """The stream output of the counts runs fused with its step (and, alone, finishes the
    tasks). A Python worker killed after sending, before its task finished, is retried by
    Spark: the retry finds the step already ran, drops that batch's progress for the task, and
    the next batch reads the input again, so state still matches its offsets exactly."""
    config, expected, run = _worker_exits(tmp_path, pipeline, point, seed=17)
    assert "ran before in a failed attempt; the batch's progress is dropped" in run.stderr
    assert committed_counts(config) == dict(expected)
    assert_committed_state_matches_its_offsets(config)
    assert_at_least_once(emitted_counts(config), expected)


def test_a_worker_lost_mid_batch_with_exactly_once_is_replayed_without_a_restart(
    tmp_path: Path,
) -> None:
    """Exactly-once, on the default master (Spark retries the task): a Python worker exits
    after staging its part of the fused output. The retry drops the task's progress, so the
    batch's output (rows of every task) cannot be kept: none of the batch's checkpoints is
    written, and the driver rewinds every task to its last checkpoint and replays the batches
    no checkpoint covers. Each count goes out once, each view is in Parquet once."""
    config, expected, run = _worker_exits(
        tmp_path, PIPELINE, "after-output-flush", seed=18, guarantee="exactly-once"
    )
    assert "dropped its progress" in run.stderr, run.stderr[-3000:]
    assert "every task starts again from its last checkpoint" in run.stderr
    assert "from the tasks' last checkpoints" in run.stderr
    assert committed_counts(config) == dict(expected)
    assert_exactly_once(config, expected)
    want = Counter((str(e["user"]), int(str(e["ts"]))) for e in events(6_000, 18, 60))
    assert _views(tmp_path / "data" / "enriched-views") == want
