"""A Python worker that dies mid-batch is retried (local[N,F] by default), and a task that keeps
failing ends the run with one line saying so (issue 11)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from generate import events

from sparkpoint.config import load_config, parse_overrides
from tests.e2e.cli import JOB, sp
from tests.helpers import assert_committed_state_matches_its_offsets, emitted_counts, generate

pytestmark = pytest.mark.slow


def _job(tmp_path: Path, *extra: str, partitions: int = 4) -> tuple[list[str], object]:
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=0",
        "task.batch.max.messages=500",
        "stores.user-counts.changelog=filelog.user-counts-changelog",
        *extra,
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", str(partitions), *set_args)
    generate(config, tmp_path / "job.yaml", 6_000, seed=13, users=40)
    return set_args, config


@pytest.mark.parametrize("partitions", [4, 12])
def test_a_python_worker_killed_mid_commit_is_retried(tmp_path: Path, partitions: int) -> None:
    """12 tasks on 2 cores run in 4 Spark partitions of 3 (SparkRunner's task groups): the
    retried partition re-runs tasks that had finished the batch; they restore and re-read."""
    flag = tmp_path / "crash"
    flag.write_text("3" if partitions == 4 else "7")  # a later snapshot kills its worker
    set_args, config = _job(
        tmp_path,
        "testing.crash.at=after-snapshot",
        f"testing.crash.flag={flag}",
        "testing.crash.mode=exit",
        partitions=partitions,
    )
    run = sp("run", str(JOB), "--until-caught-up", *set_args, timeout=400)
    assert "local[*,4]" in run.stderr
    assert not flag.exists()  # the crash happened, and the retried task went on
    assert_committed_state_matches_its_offsets(config)  # type: ignore[arg-type]


def test_a_retried_task_attempt_publishes_nothing_twice(tmp_path: Path) -> None:
    """Exactly-once output (issue 34): the killed attempt's group had staged output of tasks
    that finished the batch; the retry stages its own, and only the parts of the attempt whose
    result the driver took are ever published."""
    flag = tmp_path / "crash"
    flag.write_text("7")
    set_args, config = _job(
        tmp_path,
        "testing.crash.at=after-snapshot",
        f"testing.crash.flag={flag}",
        "testing.crash.mode=exit",
        "job.processing.guarantee=exactly-once",
        partitions=12,
    )
    sp("run", str(JOB), "--until-caught-up", *set_args, timeout=400)
    assert not flag.exists()
    expected = Counter(str(e["user"]) for e in events(6_000, 13, 40))
    emitted = emitted_counts(config)  # type: ignore[arg-type]
    assert {u: sorted(c) for u, c in emitted.items()} == {
        u: list(range(1, n + 1)) for u, n in expected.items()
    }


def test_a_task_that_keeps_failing_ends_the_run_with_one_line(tmp_path: Path) -> None:
    set_args, _ = _job(tmp_path, "task.class=faulty_task:DyingTask")
    run = sp("run", str(JOB), "--until-caught-up", *set_args, check=False, timeout=400)
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: SparkpointError: batch 1: a task failed 4 times"), last
    assert "Traceback" not in run.stderr
