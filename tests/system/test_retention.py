"""Retention of the embedded log (issue 35): ``retention.ms`` / ``retention.bytes`` drop a
partition's oldest records (copied as bytes, offsets kept and never reused), never past what a
job reading the stream has committed unless forced (then with an ERROR naming the job); a
running job keeps its input bounded while it reads everything it has not committed."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError, UserError
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.system.retention import retention_of, trim
from sparkpoint.tools.streams import trim_stream
from tests.conftest import EXAMPLE_DIR, pageviews_config
from tests.helpers import committed_counts, generate

STREAM = SystemStream("filelog", "events")
SSP = SystemStreamPartition("filelog", "events", 0)


def setup(tmp_path: Path, **overrides: str) -> tuple[Config, Systems]:
    config = load_config(None, pageviews_config(tmp_path, **overrides))
    systems = Systems(config)
    systems.admin("filelog").create_stream(StreamSpec("events", 1))
    return config, systems


def append(systems: Systems, n: int, first_ts: int = 1_000) -> None:
    """``n`` records of 100-byte values, timestamps ``first_ts`` + 10 * i."""
    producer = systems.producer("filelog")
    for i in range(n):
        key = f"k{i}".encode()
        producer.send("events", 0, Record("", key, bytes([i % 256]) * 100, first_ts + 10 * i))
    producer.flush()


def records(systems: Systems) -> list[Record]:
    admin, consumer = systems.admin("filelog"), systems.consumer("filelog")
    meta = admin.get_metadata([SSP])[SSP]
    return consumer.read(SSP, meta.oldest, meta.upcoming, 10_000)


def log_bytes(data_dir: Path, stream: str) -> int:
    return sum(f.stat().st_size for f in (data_dir / "streams" / "filelog" / stream).rglob("*.log"))


def test_by_bytes_keeps_the_newest_records_as_they_were(tmp_path: Path) -> None:
    config, systems = setup(tmp_path, **{"streams.events.retention.bytes": "2000"})
    append(systems, 100)
    before = {int(r.offset): r for r in records(systems)}
    (t,) = trim(config, systems, [STREAM], {}, job="j")
    kept = records(systems)
    assert t.dropped == 100 - len(kept) and 0 < len(kept) < 100
    assert log_bytes(tmp_path / "data", "events") <= 2000
    assert t.oldest == kept[0].offset and kept[-1].offset == "99"
    for r in kept:  # offsets, keys, values and timestamps unchanged
        assert (r.key, r.value, r.timestamp) == (
            before[int(r.offset)].key,
            before[int(r.offset)].value,
            before[int(r.offset)].timestamp,
        )
    admin = systems.admin("filelog")
    assert admin.offset_for_timestamp(SSP, 1_000 + 10 * 99) == "99"
    append(systems, 1)  # an append after the cut takes the next offset
    assert records(systems)[-1].offset == "100"


NO_NUMPY = """
import sys
from sparkpoint.config import load_config, read_job_file
from sparkpoint.model import SystemStream
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.system.retention import trim

values = read_job_file(sys.argv[1])
values.update({"job.data.dir": sys.argv[2], "streams.events.retention.bytes": "2000"})
config = load_config(None, values)
systems = Systems(config)
systems.admin("filelog").create_stream(StreamSpec("events", 1))
producer = systems.producer("filelog")
producer.send_many("events", 0, [Record("", b"k", b"v" * 100, i) for i in range(100)])
producer.flush()
(t,) = trim(config, systems, [SystemStream("filelog", "events")], {}, job="j")
assert t.dropped > 0, t
print(sorted(m for m in ("numpy", "pyarrow") if m in sys.modules))
"""


def test_a_retention_pass_leaves_numpy_and_arrow_unimported(tmp_path: Path) -> None:
    """A retention pass needs neither numpy nor pyarrow: the `sparkpoint stream trim` command
    and a driver without Spark's Python libraries loaded run it too."""
    out = subprocess.run(
        [sys.executable, "-c", NO_NUMPY, str(EXAMPLE_DIR / "job.yaml"), str(tmp_path / "data")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_retention_pass_copies_the_kept_records_outside_python_memory(tmp_path: Path) -> None:
    """The kept records go from the old log file to the new one by the kernel: a pass over a
    16 MB partition allocates about its index, not the records (reading them whole left a
    one-time step of about 30 MB in a long run's driver RSS), and they read back as before."""
    import tracemalloc

    config, systems = setup(tmp_path, **{"streams.events.retention.bytes": str(8 << 20)})
    producer = systems.producer("filelog")
    producer.send_many("events", 0, [Record("", b"k%d" % i, b"v" * 1000, i) for i in range(16_000)])
    producer.flush()
    tracemalloc.start()
    try:
        (t,) = trim(config, systems, [STREAM], {}, job="j")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 7_000 < t.dropped < 9_000, t
    assert peak < 2 << 20, peak  # the 8 MB kept stayed out of Python
    kept = records(systems)
    assert [int(r.offset) for r in kept] == list(range(t.dropped, 16_000))
    assert all(r.value == b"v" * 1000 and r.key == b"k%d" % int(r.offset) for r in kept)


def test_by_age_and_everything_expired_never_reuses_offsets(tmp_path: Path) -> None:
    config, systems = setup(tmp_path, **{"streams.events.retention.ms": "100"})
    append(systems, 50)  # timestamps 1000 .. 1490
    (t,) = trim(config, systems, [STREAM], {}, job="j", now_ms=1_000 + 10 * 40 + 100)
    assert records(systems)[0].offset == "40" and t.dropped == 40
    trim(config, systems, [STREAM], {}, job="j", now_ms=10**12)
    assert records(systems) == []
    admin = systems.admin("filelog")
    assert admin.get_metadata([SSP])[SSP].oldest == "50"
    # a timestamp startpoint on the emptied partition resolves to where it starts (not 0,
    # an offset retention removed, which a reader would report as out of range)
    assert admin.offset_for_timestamp(SSP, 0) == "50"
    append(systems, 1)
    assert records(systems)[0].offset == "50"


def test_a_job_s_uncommitted_records_are_held_back_unless_forced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, systems = setup(tmp_path, **{"streams.events.retention.bytes": "1000"})
    append(systems, 100)
    (t,) = trim(config, systems, [STREAM], {SSP: "30"}, job="pageviews-1")
    assert records(systems)[0].offset == "30"  # the job reads 30 next: nothing at or after it
    assert t.dropped == 30 and t.held_back > 0
    with caplog.at_level(logging.ERROR):
        (t,) = trim(config, systems, [STREAM], {SSP: "30"}, job="pageviews-1", force=True)
    assert int(records(systems)[0].offset) > 30 and t.held_back == 0
    assert "pageviews-1" in caplog.text and "has not committed" in caplog.text


def test_compacted_streams_and_bad_settings(tmp_path: Path) -> None:
    config, systems = setup(tmp_path, **{"streams.table.retention.bytes": "10"})
    systems.admin("filelog").create_stream(StreamSpec("table", 1, compacted=True))
    assert trim(config, systems, [SystemStream("filelog", "table")], {}, job="j") == []
    with pytest.raises(UserError, match="compacted"):
        trim_stream(config, systems, SystemStream("filelog", "table"))
    with pytest.raises(UserError, match="has no retention"):
        trim_stream(config, systems, STREAM)
    bad, _ = setup(tmp_path / "bad", **{"streams.events.retention.ms": "a week"})
    with pytest.raises(ConfigError, match=r"streams.events.retention.ms='a week'"):
        retention_of(bad, STREAM)
    unlimited, _ = setup(tmp_path / "u", **{"systems.filelog.default.stream.retention.ms": "-1"})
    assert retention_of(unlimited, STREAM) is None


def test_a_running_job_keeps_its_input_bounded_and_counts_everything(tmp_path: Path) -> None:
    """Rounds of input past retention.bytes: after each run the stream is within it; a run
    that stops behind (one batch) deletes nothing it has not committed; the counts are exact."""
    limit = 20_000
    config = load_config(
        None,
        pageviews_config(
            tmp_path,
            **{
                "streams.pageviews.retention.bytes": str(limit),
                "job.retention.check.ms": "0",
                "task.commit.ms": "0",
                "task.batch.max.messages": "200",
            },
        ),
    )
    systems = Systems(config)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "job.yaml", 3000, seed=1)
    behind = JobCoordinator(config, InlineRunner())
    behind.run(max_batches=1)  # 800 of 3000 read and committed
    behind.close()
    stream = SystemStream("filelog", "pageviews")
    protected = trim_stream(config, systems, stream)  # what the CLI does: held back
    assert protected and all(t.held_back > 0 for t in protected)
    for seed in (2, 3, 4):
        run = JobCoordinator(config, InlineRunner())
        run.run(until_caught_up=True)
        run.close()
        assert committed_counts(config) == dict(expected)  # nothing unread was deleted
        for p in range(4):
            assert log_bytes(tmp_path / "data", f"pageviews/{p}") <= limit
        expected += generate(config, tmp_path / "job.yaml", 3000, seed=seed)
    assert log_bytes(tmp_path / "data", "pageviews") > 4 * limit  # the last round, unread


def test_the_trim_command(tmp_path: Path) -> None:
    from tests.e2e.cli import JOB, sp

    sets = ["--set", f"job.data.dir={tmp_path / 'data'}"]
    config = load_config(JOB, {"job.data.dir": str(tmp_path / "data")})
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *sets)
    generate(config, tmp_path / "job.yaml", 2000, seed=5)
    limit = ["--set", "streams.pageviews.retention.bytes=10000"]
    # the example reads pageviews and has committed nothing: every record is kept
    held = sp("stream", "trim", str(JOB), "pageviews", *sets, *limit).stdout
    assert held.count("dropped 0 records") == 4 and "has not committed" in held
    forced = sp("stream", "trim", str(JOB), "pageviews", "--force", *sets, *limit)
    assert "job pageviews-1 has not committed (--force)" in forced.stderr  # an ERROR record
    for p in range(4):
        assert log_bytes(tmp_path / "data", f"pageviews/{p}") <= 10_000
    none = sp("stream", "trim", str(JOB), "pageviews", *sets, check=False)
    assert none.returncode == 2 and "retention.bytes" in none.stderr


def test_protection_is_the_slowest_task_s_and_an_unread_partition_is_kept_whole(
    tmp_path: Path,
) -> None:
    """A broadcast partition has one committed offset per task: retention keeps from the
    smallest. A partition no task has a checkpoint for (one just added) is kept whole."""
    from sparkpoint.system.retention import earliest, protected

    config, systems = setup(tmp_path, **{"streams.events.retention.ms": "0"})
    admin = systems.admin("filelog")
    admin.add_partitions("events", 2)
    append(systems, 50)
    one = SystemStreamPartition("filelog", "events", 1)
    producer = systems.producer("filelog")
    for i in range(10):
        producer.send("events", 1, Record("", b"k", b"v", 1_000 + i))
    producer.flush()
    reads = [{SSP: "40"}, {SSP: "12"}, {SSP: "33"}]  # three tasks reading events.0
    committed = earliest(reads, lambda _ssp, a, b: admin.offset_comparator(a, b))
    protect = protected(admin, STREAM, committed)
    assert protect == {SSP: "12", one: "0"}
    trimmed = trim(config, systems, [STREAM], protect, job="pageviews-1", now_ms=10**12)
    assert records(systems)[0].offset == "12"
    assert admin.get_metadata([one])[one].oldest == "0"  # nothing of it committed: all kept
    assert {t.ssp: t.dropped for t in trimmed} == {SSP: 12, one: 0}


def test_the_trim_command_keeps_what_a_broadcast_input_has_not_committed(tmp_path: Path) -> None:
    from sparkpoint.checkpoint.checkpoint import CheckpointId, CheckpointV2
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.model import TaskName

    config, systems = setup(
        tmp_path,
        **{"task.broadcast.inputs": "filelog.events", "streams.events.retention.ms": "0"},
    )
    append(systems, 40)
    manager = CheckpointManager(config, systems)
    manager.create_resources()
    for task, offset in (("Partition 0", "29"), ("Partition 1", "9")):  # each read events.0
        manager.write_checkpoint(TaskName(task), CheckpointV2(CheckpointId.create(), {SSP: offset}))
    manager.close()
    (t,) = trim_stream(config, systems, STREAM)
    assert records(systems)[0].offset == "10"  # Partition 1 reads 10 next
    assert t.dropped == 10 and t.held_back == 30


@pytest.mark.parametrize("emptied", [False, True], ids=["repaired", "repaired-then-emptied"])
def test_a_job_passes_over_the_records_a_repair_removed_at_the_end(
    tmp_path: Path, emptied: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that had read up to the record before those a repair removed at the end of a
    partition (and, after retention emptied it) resumes there: it passes over the removed
    offsets with an ERROR saying their messages are lost, is caught up, and counts what
    comes next (before, it read nothing there batch after batch and never caught up)."""
    from sparkpoint.system.filelog.partition import PartitionLog

    config = load_config(None, pageviews_config(tmp_path, **{"task.commit.ms": "0"}))
    generate(config, tmp_path / "a.yaml", 200, seed=91)
    JobCoordinator(config, InlineRunner()).run(until_caught_up=True)
    systems = Systems(config)
    ssp = SystemStreamPartition("filelog", "pageviews", 2)
    admin = systems.admin("filelog")
    producer = systems.producer("filelog")
    producer.send("pageviews", 2, Record("", b"u", b'{"user": "lost", "page": "/"}', 0))
    producer.flush()
    removed = admin.get_metadata([ssp])[ssp].newest
    part_dir = config.data_dir / "streams" / "filelog" / "pageviews" / "2"
    partition = PartitionLog(part_dir, "filelog.pageviews partition 2")
    log = part_dir / f"{partition._gen()}.log"
    log.write_bytes(log.read_bytes()[:-3])  # the last record lost its tail
    assert partition.repair() == [(int(str(removed)), int(str(removed)))]
    if emptied:
        partition.delete_before(int(str(removed)))
    with caplog.at_level(logging.ERROR):
        JobCoordinator(config, InlineRunner()).run(until_caught_up=True)
    assert f"records {removed}..{removed} were damaged and removed" in caplog.text
    producer.send("pageviews", 2, Record("", b"u", b'{"user": "next", "page": "/"}', 0))
    producer.flush()
    JobCoordinator(config, InlineRunner()).run(until_caught_up=True)
    assert committed_counts(config).get("next") == 1 and "lost" not in committed_counts(config)
