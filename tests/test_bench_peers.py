"""bench/peers/run.py's own checks: the shared input and the final-count check that makes
`make bench-peers` fail when a variant counts wrong."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    """A bench/peers script as module ``peers_<name>`` (their own names are too generic)."""
    path = ROOT / "bench" / "peers" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"peers_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"peers_{name}"] = module
    spec.loader.exec_module(module)
    return module


peers = _load("run")
recovery = _load("recovery")
common = _load("common")

VARIANT = """
import json, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
counts = json.load(open(args["--data"] + "/../counts.json"))
counts["user-00000"] += int(args["--off-by"])
json.dump({"counts": counts, "first_output": time.time(), "finished": time.time()},
          open(args["--result"], "w"))
"""


def _run(tmp_path: Path, off_by: int) -> tuple[float, float]:
    data = tmp_path / "data"
    expected = peers.write_input(data, 500, 20, seed=3)
    (tmp_path / "counts.json").write_text(json.dumps(expected))
    script = tmp_path / "variant.py"
    script.write_text(VARIANT)
    variant = peers.Variant("fake", "project", str(script), ("--off-by", str(off_by)))
    args = argparse.Namespace(checkpoint_ms=1000, events=500)
    result: tuple[float, float] = peers.run_variant(
        variant, data, tmp_path / "work", args, expected
    )
    return result


def test_every_partition_holds_the_views_of_its_users(tmp_path: Path) -> None:
    expected = peers.write_input(tmp_path, 2000, 50, seed=1)
    seen = 0
    for p in range(peers.PARTITIONS):
        for line in (tmp_path / f"part-{p}.jsonl").open():
            user = json.loads(line)["user"]
            assert zlib.crc32(user.encode()) % peers.PARTITIONS == p
            seen += 1
    assert seen == sum(expected.values()) == 2000


def test_a_variant_with_the_right_counts_is_timed(tmp_path: Path) -> None:
    seconds, steady = _run(tmp_path, 0)
    assert seconds >= steady >= 0


def test_a_variant_with_a_wrong_count_fails_the_benchmark(tmp_path: Path) -> None:
    with pytest.raises(peers.CountError, match="fake: 1 users have wrong final counts"):
        _run(tmp_path, 1)


def test_progress_lines_give_the_first_output_and_when_every_new_view_was_counted(
    tmp_path: Path,
) -> None:
    write = common.Progress(tmp_path)
    other = common.Progress(tmp_path)  # another task or process: a file of its own
    write("user-1", 2)
    other("user-2", 2)
    wanted = Counter({"user-1": 3, "user-2": 2})
    assert recovery.timings(recovery.read_progress(tmp_path), wanted) is None  # user-1 at 2 of 3
    write("user-1", 3)
    rows = recovery.read_progress(tmp_path)
    assert len(list((tmp_path / "progress").glob("*.tsv"))) == 2
    found = recovery.timings(rows, wanted)
    assert found is not None
    times = sorted(ts for ts, _u, _c in rows)
    assert found["first"] == times[0]
    assert found["caught_up"] == times[-1]  # user-1 reached 3 last
    assert found["stall"] == max(b - a for a, b in itertools.pairwise(times))


def test_a_half_written_progress_line_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "a.tsv").write_text("1.5\tuser-1\t2\n2.5\tuser-1\t")
    assert recovery.read_progress(tmp_path) == [(1.5, "user-1", 2)]


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ((1.0, "user-1", 5), "user-1 counted 5, expected 2: not restored"),
        ((1.0, "user-9", 1), "an output for user-9, which no new view names"),
    ],
)
def test_a_count_the_restore_got_wrong_fails_the_recovery_figure(
    row: tuple[float, str, int], error: str
) -> None:
    with pytest.raises(recovery.WrongCounts, match=error):  # fails the benchmark for anyone
        recovery.timings([row], Counter({"user-1": 2}))


def test_a_lost_state_that_counts_from_zero_again_never_catches_up() -> None:
    # user-1 had 1 view before the loss and 1 after: a job that lost it outputs 1, never 2
    assert recovery.timings([(1.0, "user-1", 1)], Counter({"user-1": 2})) is None


def test_a_job_is_killed_with_its_whole_process_group(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    job = recovery.Job([sys.executable, "-c", script], tmp_path)
    job.wait_for("the child", lambda: child.exists() and child.read_text() != "", 30)
    pid = int(child.read_text())
    job.kill()
    assert job.proc.returncode == -9
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the child outlived the SIGKILL of its group"
        time.sleep(0.05)


def test_a_job_that_dies_before_its_condition_names_its_exit_and_log(tmp_path: Path) -> None:
    job = recovery.Job([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path)
    with pytest.raises(recovery.RecoveryError, match="exited with 3 before the commit(.|\n)*boom"):
        job.wait_for("the commit", lambda: False, 30)


def test_the_recovery_report_sets_spark_floor_beside_the_5x_target() -> None:
    def row(variant: str, caught_up: float) -> dict[str, object]:
        return {
            "variant": variant,
            "kept": "",
            "first_output_s": caught_up - 0.5,
            "caught_up_s": caught_up,
            "restore_s": 1.0,
            "plain_copy_s": 2.0,
            "checkpoint_pause_s": 0.05,
            "longest_stall_s": 0.1,
            "checkpoint_bytes": 1e6,
            "state_bytes": 1e9,
        }

    rows = [
        row("sparkpoint-task (blobstore)", 5.0),
        row("pyflink", 10.0),
        {"variant": "reference: Spark's floor", "caught_up_s": 3.4},
    ]
    args = argparse.Namespace(recovery_users=1000, pad=1000)
    text = "\n".join(peers.recovery_table(rows, args))
    assert "sparkpoint from the blob store is 2.00x faster (issue 15's target: 5x)" in text
    assert "Spark's floor here" in text and ": 3.4 s; 5x the fastest peer needs 2.0 s" in text
    assert "| reference" not in text  # a reference, not a row of the table
