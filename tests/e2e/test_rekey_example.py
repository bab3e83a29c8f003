"""The re-key example (``examples/rekey``) end to end on local Spark, as its README runs it:
killed with SIGKILL at a random moment of its run (seeded; the seed is in the test's output),
then run again, its per-user counts are exact, and ``state dump`` prints them."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from generate import events, write

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import load_config, parse_overrides
from tests.conftest import REKEY_DIR
from tests.e2e.cli import popen, sp
from tests.helpers import committed_counts, input_progress

pytestmark = pytest.mark.slow
JOB = REKEY_DIR / "job.yaml"


def run_seed() -> int:
    """A new seed each run (it is in the test's id); pytest-xdist's workers must all collect the
    same one, so under it the seed comes from the run's id, which they share."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return int(run[:8], 16) % 1_000_000 if run else random.randrange(1_000_000)


@pytest.mark.parametrize("seed", [run_seed()])
def test_kill_9_at_a_random_moment_then_restart_counts_each_view_once(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=300",
        "task.batch.max.messages=1500",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews-by-page", "--partitions", "4", *set_args)
    gen = tmp_path / "gen.yaml"
    gen.write_text(json.dumps(dict(config.items())))
    n = 40_000
    write(str(gen), n, 13, 300, "pageviews-by-page", key_field="page")
    expected = Counter(str(e["user"]) for e in events(n, 13, 300))

    # of 2n (stage 1 and stage 2 each read n), short of the end by more than a batch reads
    kill_at = rng.randrange(3_000, 2 * n - 15_000)
    log = tmp_path / "run1.log"
    driver = popen("run", str(JOB), "--until-caught-up", *set_args, log=log)
    manager = CheckpointManager(config)
    deadline = time.monotonic() + 240
    while input_progress(manager.read_all(), config) < kill_at:
        assert driver.poll() is None, f"ended before {kill_at}: " + log.read_text()[-2000:]
        assert time.monotonic() < deadline, f"no progress to {kill_at} in 240 s"
        time.sleep(0.05)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert driver.returncode == -signal.SIGKILL
    assert sum(committed_counts(config).values()) < n

    result = sp("run", str(JOB), "--until-caught-up", *set_args)
    assert "done (caught up)" in result.stderr
    assert committed_counts(config) == dict(expected)
    dumped = sp("state", "dump", str(JOB), "--store", "user-counts", *set_args).stdout
    rows = [json.loads(line) for line in dumped.splitlines()]
    assert {r["key"]: r["value"] for r in rows} == dict(expected)


def test_a_python_worker_dying_after_its_commit_snapshot_is_retried_and_the_run_ends(
    tmp_path: Path,
) -> None:
    """A Spark task attempt that staged its re-keyed part and then died (its worker exits at
    the commit's snapshot): Spark retries it, the dead attempt's part is never published,
    and --until-caught-up still ends with every view counted once."""
    flag = tmp_path / "crash"
    flag.write_text("3")
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=0",
        "task.batch.max.messages=300",
        "testing.crash.at=after-snapshot",
        f"testing.crash.flag={flag}",
        "testing.crash.mode=exit",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews-by-page", "--partitions", "4", *set_args)
    gen = tmp_path / "gen.yaml"
    gen.write_text(json.dumps(dict(config.items())))
    write(str(gen), 3000, 13, 40, "pageviews-by-page", key_field="page")
    result = sp("run", str(JOB), "--until-caught-up", "--max-batches", "150", *set_args)
    assert not flag.exists(), "the worker never died"
    assert "done (caught up)" in result.stderr
    assert committed_counts(config) == dict(Counter(str(e["user"]) for e in events(3000, 13, 40)))
