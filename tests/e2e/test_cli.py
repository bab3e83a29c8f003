"""The CLI as a user runs it: stream write/read, checkpoint show, and SIGTERM during a run."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import load_config, parse_overrides
from tests.e2e.cli import JOB, popen, sp
from tests.helpers import committed_counts, generate


def test_stream_write_then_read(tmp_path: Path) -> None:
    s = ["--set", f"job.data.dir={tmp_path}"]
    lines = "\n".join(
        json.dumps({"key": f"u{i}", "value": {"n": i}, "timestamp": 1000 + i}) for i in range(10)
    )
    proc = sp("stream", "write", str(JOB), "pageviews", *s, stdin=lines)
    assert "wrote 10 records to filelog.pageviews" in proc.stderr
    listed = sp("stream", "list", str(JOB), *s).stdout
    assert "filelog.pageviews\tpartitions=4\tmessages=10" in listed
    rows = [
        json.loads(x) for x in sp("stream", "read", str(JOB), "pageviews", *s).stdout.splitlines()
    ]
    assert sorted(r["value"]["n"] for r in rows) == list(range(10))
    assert all(r["key"] == f"u{r['value']['n']}" for r in rows)
    one = sp("stream", "read", str(JOB), "pageviews", "--partition", "2", "--from", "1", *s).stdout
    assert all(json.loads(x)["partition"] == 2 for x in one.splitlines())
    bad = sp(
        "stream", "write", str(JOB), "pageviews", *s, stdin='{"key": "a"}\nnot json\n', check=False
    )
    assert bad.returncode == 2 and "stdin line 2" in bad.stderr


def test_every_subcommand_has_help_with_an_example() -> None:
    for cmd in (
        ["run"],
        ["stream", "create"],
        ["stream", "list"],
        ["stream", "write"],
        ["stream", "read"],
        ["checkpoint", "show"],
        ["checkpoint", "set"],
        ["state", "dump"],
        ["state", "show"],
        ["state", "check"],
        ["config", "show"],
        ["config", "keys"],
        ["startpoint", "set"],
        ["startpoint", "list"],
        ["startpoint", "delete"],
        ["job", "show"],
        ["job", "reset"],
        ["stream", "repair"],
        ["dlq", "show"],
        ["dlq", "replay"],
    ):
        out = sp(*cmd, "--help").stdout  # piped, as in a log or a pager
        assert "Example" in out, cmd
        assert "…" not in out, cmd  # no table cut at 80 columns


@pytest.mark.slow
def test_a_startpoint_applied_at_start_is_shown_in_the_progress(tmp_path: Path) -> None:
    s = ["--set", f"job.data.dir={tmp_path}"]
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "2", *s)
    lines = "".join(json.dumps({"key": "u", "value": {"user": "u"}}) + "\n" for _ in range(8))
    sp("stream", "write", str(JOB), "pageviews", "--partition", "1", *s, stdin=lines)
    sp("run", str(JOB), "--until-caught-up", *s)
    sp("startpoint", "set", str(JOB), "--stream", "pageviews", "-p", "1", "--offset", "5", *s)
    rerun = sp("run", str(JOB), "--until-caught-up", *s).stderr
    assert "startpoint: Partition 1 reads filelog.pageviews.1 from offset 5 (specific" in rerun
    assert "startpoint: Partition 0" not in rerun


@pytest.mark.slow
def test_sigterm_finishes_the_batch_commits_and_exits_0(tmp_path: Path) -> None:
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=3600000",
        "task.batch.max.messages=500",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    generate(config, tmp_path / "job.yaml", 200_000, seed=12)
    driver = popen("run", str(JOB), *set_args, log=tmp_path / "run.log")
    log = tmp_path / "run.log"
    deadline = time.monotonic() + 120
    while "batch 2:" not in log.read_text():
        assert driver.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(60) == 0, log.read_text()
    assert "done (signal SIGTERM)" in log.read_text()
    checkpoints = CheckpointManager(config).read_all()
    assert len(checkpoints) == 4  # commit.ms is an hour: only the shutdown committed
    done = sum(int(o) + 1 for c in checkpoints.values() for o in c.input_offsets.values())
    assert done == sum(committed_counts(config).values()) > 0
    show = json.loads(sp("checkpoint", "show", str(JOB), "--json", *set_args).stdout)
    assert set(show) == {f"Partition {p}" for p in range(4)}


def test_the_readme_commands_give_the_same_result_from_any_directory(tmp_path: Path) -> None:
    """Issue 16: examples/ copied elsewhere, the README's commands run from another directory:
    the data lands next to the job file, and every command finds it."""
    import shutil
    import subprocess
    import sys
    from collections import Counter

    from tests.conftest import EXAMPLE_DIR
    from tests.e2e.cli import env

    copy = tmp_path / "copy" / "examples" / "pageviews"
    shutil.copytree(EXAMPLE_DIR, copy, ignore=shutil.ignore_patterns(".sparkpoint", "__pycache__"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job = "../copy/examples/pageviews/job.yaml"
    sp("stream", "create", job, "pageviews", "--partitions", "4", cwd=elsewhere)
    generate = [sys.executable, "../copy/examples/pageviews/generate.py", job, "3000"]
    subprocess.run([*generate, "--seed", "7"], cwd=elsewhere, env=env(), check=True)
    run = sp("run", job, "--until-caught-up", cwd=elsewhere).stderr
    assert "done (caught up)" in run
    assert "incubator" not in run  # the JVM's start-up noise: shown with -v only (issue 36)
    dumped = sp(
        "state", "dump", "copy/examples/pageviews/job.yaml", "--store", "user-counts", cwd=tmp_path
    ).stdout
    counts = {r["key"]: r["value"] for r in map(json.loads, dumped.splitlines())}
    from generate import events  # the example's generator (on the path: tests/conftest.py)

    assert counts == dict(Counter(str(e["user"]) for e in events(3000, 7, 1000)))
    assert (copy / ".sparkpoint" / "pageviews" / "state").is_dir()
    assert not (elsewhere / ".sparkpoint").exists()
    shown = sp("checkpoint", "show", str(copy / "job.yaml"), cwd=tmp_path).stdout
    assert shown.count("checkpoint ") == 4
    # a job with no data where the command looks: say where, exit 2
    missing = sp(
        "checkpoint", "show", job, "--set", "job.data.dir=nowhere", cwd=elsewhere, check=False
    )
    assert missing.returncode == 2
    assert "no data of job pageviews" in missing.stderr
    assert str(elsewhere / "nowhere") in missing.stderr
    for command in (["state", "dump", job, "--store", "user-counts"], ["job", "show", job]):
        gone = sp(*command, "--set", "job.data.dir=nowhere", cwd=elsewhere, check=False)
        assert gone.returncode == 2 and "Run the job first" in gone.stderr, command
