"""filelog: the system contract, plus crash recovery, corruption, concurrency and compaction."""

from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.errors import CorruptRecordError, UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.filelog import FileLogSystemFactory, columnar
from sparkpoint.system.filelog import format as fmt
from tests.system.appender import append
from tests.system.contract import SystemContract, SystemUnderTest, rec


@pytest.fixture
def system(tmp_path: Path) -> SystemUnderTest:
    return SystemUnderTest(FileLogSystemFactory(), "fl", {"systems.fl.path": str(tmp_path / "fl")})


class TestFileLogContract(SystemContract):
    pass


SSP = SystemStreamPartition("fl", "s", 0)


def fill(system: SystemUnderTest, n: int, stream: str = "s") -> None:
    system.factory.get_admin("fl", system.config).create_stream(StreamSpec(stream, 1))
    producer = system.factory.get_producer("fl", system.config)
    for i in range(n):
        producer.send(stream, 0, rec(f"k{i}", f"value-{i}", i))
    producer.flush()


def part_dir(system: SystemUnderTest) -> Path:
    return Path(system.config["systems.fl.path"]) / "s" / "0"


def damage_the_middle(system: SystemUnderTest) -> bytes:
    """20 records written, one byte in the middle of the log flipped; the log's bytes."""
    fill(system, 20)
    log = part_dir(system) / "0.log"
    raw = bytearray(log.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    log.write_bytes(bytes(raw))
    return bytes(raw)


def test_a_creation_killed_before_its_rename_leaves_no_stream(system: SystemUnderTest) -> None:
    """Found by the re-key kill test (CI, seed 76494): a driver killed while it created a
    stream left its staging directory ``.user-counts.<random>`` with a ``stream.json``, and
    every later start failed on it as an invalid stream name."""
    root = Path(system.config["systems.fl.path"])
    staging = root / ".user-counts.yr6om52b"
    (staging / "0").mkdir(parents=True)
    (staging / "stream.json").write_text(json.dumps({"partitions": 1, "compacted": False}))
    admin = system.factory.get_admin("fl", system.config)
    assert admin.list_streams() == []
    assert admin.create_stream(StreamSpec("user-counts", 2))  # made whole, beside the leftover
    assert admin.list_streams() == ["user-counts"]
    assert admin.partition_count("user-counts") == 2


def test_torn_tail_is_cut_and_never_read(system: SystemUnderTest) -> None:
    fill(system, 10)
    log = part_dir(system) / "0.log"
    size = log.stat().st_size
    with open(log, "ab") as f:
        f.write(b"\xa7\x00\x00\x00\x01\x00\x00\x00\x50partial-record")  # a crash mid-append
    consumer = system.factory.get_consumer("fl", system.config)
    assert len(consumer.read(SSP, "0", "100")) == 10
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("new", "after-crash", 99))
    producer.flush()
    got = consumer.read(SSP, "0", "100")
    assert [r.offset for r in got] == [str(i) for i in range(11)]
    assert got[-1].value == b"after-crash"
    assert log.stat().st_size > size  # the torn bytes were cut before appending


def test_a_damaged_indexed_record_is_never_cut_as_a_torn_tail(system: SystemUnderTest) -> None:
    """Issue 37: the last record lost its tail though the index listed it (readers may have
    read it and committed past it); the next append cut it as a "torn tail" and handed its
    offset out again, so a reader whose checkpoint passed it skipped the new record."""
    fill(system, 5)
    log = part_dir(system) / "0.log"
    log.write_bytes(log.read_bytes()[:-3])
    damaged = log.read_bytes()
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("x", "y", 1))
    with pytest.raises(CorruptRecordError, match=r"fl\.s partition 0 at offset 4: .*stream repair"):
        producer.flush()
    assert log.read_bytes() == damaged  # nothing cut, nothing written


def test_repair_removes_damaged_records_and_never_reuses_their_offsets(
    system: SystemUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    from sparkpoint.system.filelog.partition import PartitionLog

    fill(system, 20)
    log = part_dir(system) / "0.log"
    raw = bytearray(log.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a record in the middle fails its checksum
    log.write_bytes(bytes(raw[:-3]))  # and the last one lost its tail
    partition = PartitionLog(part_dir(system), "fl.s partition 0")
    lost = partition.repair()
    assert len(lost) == 2 and lost[-1] == (19, 19)
    middle = lost[0][0]
    assert partition.lost_ranges() == lost
    # what readers are told comes next is where the next record goes: 20, not 19 (a reader
    # that committed past 19 would otherwise be out of range), also once retention empties it
    admin = system.factory.get_admin("fl", system.config)
    assert admin.get_metadata([SSP])[SSP].upcoming == "20"
    assert admin.offset_for_timestamp(SSP, 10**12) == "20"
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("x", "after-repair", 1))
    producer.flush()
    consumer = system.factory.get_consumer("fl", system.config)
    with caplog.at_level("ERROR"):
        got = consumer.read(SSP, "0", "100")
    offsets = [int(r.offset) for r in got]
    assert offsets == [o for o in range(21) if o not in (middle, 19)]
    assert got[-1].value == b"after-repair"  # at 20: offset 19 was handed out once already
    assert f"records {middle}..{middle} were damaged and removed" in caplog.text
    assert "records 19..19 were damaged and removed" in caplog.text
    caplog.clear()
    with caplog.at_level("ERROR"):
        consumer.read(SSP, "20", "100")  # reads past the lost ranges say nothing
    assert "damaged" not in caplog.text
    assert partition.repair() == []  # idempotent


def repaired_at_19(system: SystemUnderTest) -> Any:
    """20 records whose last (19) a repair removed: the next append gets 20. Returns the
    partition's log and a check that a reader resuming at an offset is in range."""
    from sparkpoint.checkpoint.offsets import check_in_range
    from sparkpoint.model import TaskName
    from sparkpoint.system.filelog.partition import PartitionLog

    fill(system, 20)
    log = part_dir(system) / "0.log"
    log.write_bytes(log.read_bytes()[:-3])  # the last record lost its tail
    partition = PartitionLog(part_dir(system), "fl.s partition 0")
    assert partition.repair() == [(19, 19)]
    admin = system.factory.get_admin("fl", system.config)

    def in_range(*resumes: str) -> None:
        meta = admin.get_metadata([SSP])[SSP]
        for resume in resumes:
            check_in_range(admin, TaskName("Partition 0"), SSP, resume, meta)

    return partition, in_range


def test_readers_on_either_side_of_a_repair_s_floor_stay_in_range_during_a_publish(
    system: SystemUnderTest,
) -> None:
    """A reader that had not read the removed 19 resumes there, one that had at 20: both
    are in range, also while records are published (held back from 20)."""
    from sparkpoint.system.filelog.files import PUBLISHING

    _partition, in_range = repaired_at_19(system)
    admin = system.factory.get_admin("fl", system.config)
    assert admin.get_metadata([SSP])[SSP].upcoming == "20"
    in_range("19", "20")
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("x", "published", 1))
    producer.flush()
    (part_dir(system) / PUBLISHING).write_text(json.dumps({"first": 20}))  # a publish from 20
    meta = admin.get_metadata([SSP])[SSP]
    assert (meta.newest, meta.upcoming) == ("18", "20")  # not 19, below the held-back records
    in_range("19", "20")
    consumer = system.factory.get_consumer("fl", system.config)
    assert consumer.read(SSP, "19", "21") == []  # nothing at 19, 20 is held back
    assert consumer.skipped_through(SSP) == "19"  # the reader moves on to 20 (not stuck)


def test_readers_on_either_side_of_a_repair_s_floor_stay_in_range_once_retention_empties_it(
    system: SystemUnderTest,
) -> None:
    partition, in_range = repaired_at_19(system)
    # retention that keeps nothing starts at the offset readers are told comes next (20), not
    # at the last record + 1 (19, which a repair removed): its counts match theirs
    assert partition.retention_start(0, None, now_ms=2**62) == 20
    partition.delete_before(19)  # retention drops every record left
    assert partition.retention_start(0, None, now_ms=2**62) == 20
    admin = system.factory.get_admin("fl", system.config)
    meta = admin.get_metadata([SSP])[SSP]
    assert (meta.oldest, meta.newest, meta.upcoming) == ("19", None, "20")
    in_range("19", "20")
    consumer = system.factory.get_consumer("fl", system.config)
    assert consumer.read(SSP, "19", "20") == []
    assert consumer.skipped_through(SSP) == "19"  # 19 never gets a record: past it
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("x", "next", 1))
    producer.flush()
    meta = admin.get_metadata([SSP])[SSP]
    assert (meta.oldest, meta.newest, meta.upcoming) == ("19", "20", "21")  # still from 19
    in_range("19", "20")
    assert [r.offset for r in consumer.read(SSP, "19", "21")] == ["20"]


def test_index_entries_the_os_never_wrote_are_dropped_and_rebuilt(
    system: SystemUnderTest,
) -> None:
    """A power loss after the log's fsync can leave the index's newest entries as zeros: they
    are not records anyone read, so they are indexed again from the (durable) log."""
    fill(system, 6)
    index = part_dir(system) / "0.index"
    raw = index.read_bytes()
    index.write_bytes(raw[: -2 * fmt.INDEX_SIZE] + bytes(2 * fmt.INDEX_SIZE))
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("x", "y", 1))
    producer.flush()
    got = system.factory.get_consumer("fl", system.config).read(SSP, "0", "100")
    assert [r.offset for r in got] == [str(i) for i in range(7)]
    assert got[-1].value == b"y"


def test_corrupt_record_in_the_middle_names_stream_partition_offset(
    system: SystemUnderTest,
) -> None:
    damage_the_middle(system)
    consumer = system.factory.get_consumer("fl", system.config)
    with pytest.raises(CorruptRecordError, match=r"fl\.s partition 0 at offset \d+: checksum"):
        consumer.read(SSP, "0", "100")
    with pytest.raises(CorruptRecordError, match=r"fl\.s partition 0 at offset \d+: checksum"):
        consumer.read_columns(SSP, "0", "100")
    with pytest.raises(CorruptRecordError, match=r"fl\.s partition 0 at offset \d+: checksum"):
        consumer.read_entries(SSP, "0", "100")
    assert len(consumer.read(SSP, "0", "5")) == 5  # records before it still read
    assert len(consumer.read_columns(SSP, "0", "5")) == 5
    assert len(consumer.read_entries(SSP, "0", "5")) == 5


def test_index_is_rebuilt_when_lost(system: SystemUnderTest) -> None:
    fill(system, 30)
    (part_dir(system) / "0.index").write_bytes(b"")
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("k", "v", 100))
    producer.flush()
    got = system.factory.get_consumer("fl", system.config).read(SSP, "0", "100")
    assert [r.offset for r in got] == [str(i) for i in range(31)]


def test_two_processes_append_to_one_partition(system: SystemUnderTest) -> None:
    root = system.config["systems.fl.path"]
    system.factory.get_admin("fl", system.config).create_stream(StreamSpec("shared", 1))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=append, args=(root, w, 2000, 7)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    ssp = SystemStreamPartition("fl", "shared", 0)
    got = system.factory.get_consumer("fl", system.config).read(ssp, "0", "100000")
    assert [int(r.offset) for r in got] == list(range(4000))
    for w in range(2):
        mine = [int(r.value.split(b":")[1]) for r in got if r.key == f"w{w}".encode() and r.value]
        assert mine == list(range(2000))  # all there, once, in the writer's order


def test_bounded_compaction_keeps_everything_from_the_bound_on(system: SystemUnderTest) -> None:
    admin = system.factory.get_admin("fl", system.config)
    admin.create_stream(StreamSpec("s", 1, compacted=True))
    producer = system.factory.get_producer("fl", system.config)
    for i in range(10):
        producer.send("s", 0, rec(f"k{i % 3}", f"v{i}", i))
    producer.flush()
    consumer = system.factory.get_consumer("fl", system.config)

    def replay(end: int) -> dict[bytes | None, bytes | None]:
        return {r.key: r.value for r in consumer.read(SSP, "0", str(end))}

    before = {end: replay(end) for end in range(6, 11)}
    assert admin.compact("s", 0, "6") == (10, 7)  # offsets 0-5: one record per key is left
    got = consumer.read(SSP, "0", "100")
    assert [r.offset for r in got] == ["3", "4", "5", "6", "7", "8", "9"]
    assert {end: replay(end) for end in range(6, 11)} == before  # same state at every end
    assert admin.compact("s", 0, "6") == (7, 7)  # nothing more to drop: left as it is


def test_compaction_keeps_newest_per_key_with_offsets(system: SystemUnderTest) -> None:
    admin = system.factory.get_admin("fl", system.config)
    admin.create_stream(StreamSpec("s", 1, compacted=True))
    producer = system.factory.get_producer("fl", system.config)
    for i in range(10):
        producer.send("s", 0, rec(f"k{i % 3}", f"v{i}", i))
    producer.send("s", 0, rec("k1", None, 10))  # delete k1
    producer.flush()
    assert admin.compact("s", 0) == (11, 3)
    consumer = system.factory.get_consumer("fl", system.config)
    got = consumer.read(SSP, "0", "100")
    assert [(r.offset, r.key, r.value) for r in got] == [
        ("8", b"k2", b"v8"),
        ("9", b"k0", b"v9"),
        ("10", b"k1", None),
    ]
    meta = admin.get_metadata([SSP])[SSP]
    assert (meta.oldest, meta.upcoming) == ("8", "11")
    producer.send("s", 0, rec("k5", "after", 11))
    producer.flush()
    assert consumer.read(SSP, "11", "12")[0].value == b"after"
    assert admin.offset_for_timestamp(SSP, 9) == "9"


def _random_log(
    system: SystemUnderTest,
    rng: random.Random,
    n: int,
    *,
    keys: int,
    tombstones: float,
    repeat: int,
) -> tuple[Any, Any, list[Record]]:
    """A compacted stream ``s`` of ``n`` random records (5% keyless, ``tombstones`` of them
    deletes, values up to ``repeat`` times their text, random timestamps): its admin, a
    consumer, and the records as read."""
    admin = system.factory.get_admin("fl", system.config)
    admin.create_stream(StreamSpec("s", 1, compacted=True))
    producer = system.factory.get_producer("fl", system.config)
    for i in range(n):
        key = None if rng.random() < 0.05 else f"k{rng.randrange(keys)}"
        value = None if rng.random() < tombstones else f"v{i}" * rng.randrange(1, repeat + 1)
        producer.send("s", 0, rec(key, value, rng.randrange(10**6)))
    producer.flush()
    consumer = system.factory.get_consumer("fl", system.config)
    return admin, consumer, consumer.read(SSP, "0", str(n))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compaction_matches_newest_per_key_and_keeps_every_end_s_state(
    system: SystemUnderTest, seed: int
) -> None:
    """Random keys, tombstones and keyless records, compacted up to a random bound: exactly
    the newest record per key before the bound (and every keyless one) is left, with every
    record from the bound on, at its offset, bytes unchanged; replaying to any end at or
    after the bound gives the same state as before."""
    rng = random.Random(seed)
    n = 3_000
    admin, consumer, before = _random_log(system, rng, n, keys=200, tombstones=0.1, repeat=39)
    bound = rng.randrange(n)
    newest = {r.key: i for i, r in enumerate(before[:bound]) if r.key is not None}
    want = [r for i, r in enumerate(before) if i >= bound or r.key is None or newest[r.key] == i]

    def replay(end: int) -> dict[bytes | None, bytes | None]:
        return {r.key: r.value for r in consumer.read(SSP, "0", str(end)) if r.key is not None}

    states = {end: replay(end) for end in (bound, (bound + n) // 2, n)}
    assert admin.compact("s", 0, str(bound)) == (n, len(want))
    assert consumer.read(SSP, "0", str(n)) == want
    assert {end: replay(end) for end in states} == states
    assert consumer.read_entries(SSP, "0", str(n)).keys == [r.key for r in want]
    top, running = -1, []  # the index's timestamps are the kept records' running maximum
    for r in want:
        top = max(top, r.timestamp)
        running.append(top)
    for ts in rng.sample([r.timestamp for r in want], 5):
        first = next(r.offset for r, t in zip(want, running, strict=True) if t >= ts)
        assert admin.offset_for_timestamp(SSP, ts) == first


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_compaction_drops_tombstones_older_than_a_cut_off_and_says_how_far(
    system: SystemUnderTest, seed: int
) -> None:
    """``delete.retention.ms``: a key whose newest record before the bound is a tombstone
    older than the cut-off goes altogether (the last record before the bound stays, so the
    log keeps its next offset); replaying from the start to any end at or after the bound
    gives the same live entries as before; ``TOMBSTONES`` says the largest offset dropped."""
    rng = random.Random(seed)
    n = 2_000
    admin, consumer, before = _random_log(system, rng, n, keys=150, tombstones=0.3, repeat=1)
    producer = system.factory.get_producer("fl", system.config)
    bound, cut = rng.randrange(n // 2, n), 500_000
    newest = {r.key: i for i, r in enumerate(before[:bound]) if r.key is not None}
    gone = {
        i
        for i in newest.values()
        if before[i].value is None and before[i].timestamp < cut and i != bound - 1
    }
    want = [
        r
        for i, r in enumerate(before)
        if i >= bound or r.key is None or (newest[r.key] == i and i not in gone)
    ]

    def live(end: int) -> dict[bytes | None, bytes | None]:
        state = {r.key: r.value for r in consumer.read(SSP, "0", str(end)) if r.key is not None}
        return {k: v for k, v in state.items() if v is not None}

    states = {end: live(end) for end in (bound, (bound + n) // 2, n)}
    assert gone  # the seed makes some
    assert admin.compact("s", 0, str(bound), cut) == (n, len(want))
    assert consumer.read(SSP, "0", str(n)) == want
    assert {end: live(end) for end in states} == states
    assert admin.tombstones_dropped_through(SSP) == str(max(gone))
    assert admin.compact("s", 0, str(bound), cut) == (len(want), len(want))  # nothing more
    assert admin.tombstones_dropped_through(SSP) == str(max(gone))  # it never moves back
    producer.send("s", 0, rec("k-after", "v", 1))
    producer.flush()
    assert consumer.read(SSP, str(n), str(n + 1))[0].offset == str(n)  # no offset reused
    fresh = system.factory.get_admin("fl", system.config)
    fresh.create_stream(StreamSpec("t", 1, compacted=True))
    assert fresh.tombstones_dropped_through(SystemStreamPartition("fl", "t", 0)) is None


@pytest.mark.parametrize("meanwhile", ["appends", "retention"])
def test_compaction_works_beside_appends_and_retention(
    system: SystemUnderTest, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """A compaction reads and judges a snapshot without the appenders' lock (a running job's
    driver compacts its changelogs while its tasks append): records appended meanwhile are
    kept after the compacted ones, at their offsets, with their timestamps; a log that
    changed otherwise meanwhile (here a retention cut) is compacted again under the lock."""
    from sparkpoint.system.filelog.partition import PartitionLog

    admin = system.factory.get_admin("fl", system.config)
    admin.create_stream(StreamSpec("s", 1, compacted=True))
    producer = system.factory.get_producer("fl", system.config)
    for i in range(30):  # the first (dropped) is the newest: the maxima kept must be made again
        producer.send("s", 0, rec(f"k{i % 4}", f"v{i}", 1000 if i == 0 else 100 + i))
    producer.flush()
    planned = PartitionLog._compaction
    calls = []

    def and_then(self: PartitionLog, up_to: int | None, before_ms: int | None) -> object:
        plan = planned(self, up_to, before_ms)
        calls.append(up_to)
        if len(calls) == 1:  # between the first plan and its switch
            if meanwhile == "appends":
                for i in range(30, 35):
                    producer.send("s", 0, rec(f"k{i % 4}", f"v{i}", 200 + i))
                producer.flush()
            else:
                admin.delete_records_before("s", 0, "2")
        return plan

    monkeypatch.setattr(PartitionLog, "_compaction", and_then)
    assert admin.compact("s", 0, "20") == ((30, 14) if meanwhile == "appends" else (28, 14))
    assert len(calls) == (1 if meanwhile == "appends" else 2)
    got = system.factory.get_consumer("fl", system.config).read(SSP, "0", "100")
    kept = [16, 17, 18, 19, *range(20, 30)]  # the newest of each key before 20, all from it on
    appended = list(range(30, 35)) if meanwhile == "appends" else []
    assert [int(r.offset) for r in got] == kept + appended
    assert [r.value for r in got] == [f"v{i}".encode() for i in kept + appended]
    assert admin.offset_for_timestamp(SSP, 129) == "29"  # running maxima made again
    assert admin.offset_for_timestamp(SSP, 231) == ("31" if appended else "30")
    producer.send("s", 0, rec("k9", "after", 200))
    producer.flush()
    assert system.factory.get_consumer("fl", system.config).read(SSP, "35", "36") == (
        [Record("35", b"k9", b"after", 200)] if appended else []
    )


def test_a_damaged_record_stops_compaction_and_changes_nothing(system: SystemUnderTest) -> None:
    """Compaction never decides what to drop from a record that fails its checks: it raises
    naming the offset, and the partition is left as it was."""
    raw = damage_the_middle(system)
    log = part_dir(system) / "0.log"
    admin = system.factory.get_admin("fl", system.config)
    with pytest.raises(CorruptRecordError, match=r"fl\.s partition 0 at offset \d+: checksum"):
        admin.compact("s", 0)
    assert log.read_bytes() == raw
    assert len(system.factory.get_consumer("fl", system.config).read(SSP, "0", "5")) == 5


@pytest.mark.parametrize("entry", [1, 4])  # judged (before the bound), and kept as it is
def test_compaction_refuses_an_index_that_points_outside_the_log(entry: int) -> None:
    records = [Record("", f"k{i % 2}".encode(), b"v", i) for i in range(6)]
    log, index, _n = fmt.encode_many(0, records)
    damaged = bytearray(index)
    at = entry * fmt.INDEX_SIZE + 8  # the entry's position field
    damaged[at : at + 8] = (len(log) + 100).to_bytes(8, "big")
    with pytest.raises(fmt.FormatError, match="outside the log|disagrees with the index") as raised:
        fmt.compacted(log, bytes(damaged), 3)
    assert raised.value.offset in (entry - 1, entry)  # the record it points at, or the one before


def test_bad_names_and_partitions_are_refused(system: SystemUnderTest) -> None:
    admin = system.factory.get_admin("fl", system.config)
    with pytest.raises(UserError, match="invalid stream name"):
        admin.create_stream(StreamSpec("../escape", 1))
    admin.create_stream(StreamSpec("s", 2))
    with pytest.raises(UserError, match=r"partition 5 of fl.s does not exist \(partitions 0..1\)"):
        system.factory.get_producer("fl", system.config).send("s", 5, rec("a", "b", 1))


@pytest.mark.parametrize("damage", ["half", "empty", "deleted"])
def test_a_damaged_index_never_hides_records_from_readers(
    system: SystemUnderTest, damage: str
) -> None:
    """Issue 11: with an input partition's index truncated or emptied, a run reported lag 0
    and skipped the records; with it deleted, `stream write` crashed. Readers now re-index."""
    fill(system, 40)
    index = part_dir(system) / "0.index"
    if damage == "half":
        index.write_bytes(index.read_bytes()[: len(index.read_bytes()) // 2])
    elif damage == "empty":
        index.write_bytes(b"")
    else:
        index.unlink()
    admin = system.factory.get_admin("fl", system.config)
    assert admin.get_metadata([SSP])[SSP].upcoming == "40"
    got = system.factory.get_consumer("fl", system.config).read(SSP, "0", "100")
    assert [r.offset for r in got] == [str(i) for i in range(40)]
    producer = system.factory.get_producer("fl", system.config)
    producer.send("s", 0, rec("k", "v", 100))
    producer.flush()
    assert admin.get_metadata([SSP])[SSP].upcoming == "41"


def _by_columns(log: bytes, offsets: Any, positions: Any) -> list[Record]:
    return columnar.decode_columns(log, offsets, positions).records()


def _by_entries(log: bytes, offsets: Any, positions: Any) -> list[Record]:
    """Entries as records: their keys and values, the last offset, the rest blank."""
    got = columnar.decode_entries(log, offsets, positions)
    pairs = zip(got.keys, got.values, strict=True)
    return [Record(got.last_offset or "", k, v, 0) for k, v in pairs]


def _comparable(records: list[Record], decoder: Any) -> list[Record]:
    if decoder is _by_columns:
        return records
    return [Record(records[-1].offset, r.key, r.value, 0) for r in records]


@pytest.mark.parametrize("decoder", [_by_columns, _by_entries], ids=["columns", "entries"])
def test_columnar_decoding_checks_every_byte_as_the_record_decoder_does(decoder: Any) -> None:
    """Each byte of a small log flipped in turn: the columnar decoders (Arrow columns, and
    a replay's keys and values) return what the record decoder returns, or fail with the same
    error for the same offset."""
    keyed = [Record("", f"k{i}".encode(), f"value-{i}".encode(), 100 + i) for i in range(4)]
    odd = [Record("", None, b"keyless", 7), Record("", b"k", None, 8), Record("", b"", b"", 9)]
    records = [*keyed, *odd]
    log, index, n = fmt.encode_many(50, records)
    entries = columnar.index_entries(index)
    offsets, positions = entries["offset"], entries["position"]
    want = _comparable(fmt.decode_span(log, offsets.tolist()), decoder)
    assert decoder(log, offsets, positions) == want
    for at in range(len(log)):
        damaged = bytearray(log)
        damaged[at] ^= 0x5A
        with pytest.raises(fmt.FormatError) as by_record:
            fmt.decode_span(bytes(damaged), offsets.tolist())
        with pytest.raises(fmt.FormatError) as by_column:
            decoder(bytes(damaged), offsets, positions)
        assert (by_column.value.offset, by_column.value.reason) == (
            by_record.value.offset,
            by_record.value.reason,
        ), at
    shifted = positions.astype("int64") + 3  # an index whose positions are off: still read
    assert decoder(log, offsets, shifted) == want
    wrong = offsets.copy()
    wrong[2] += 1
    with pytest.raises(fmt.FormatError, match="record says offset 52"):
        decoder(log, wrong, positions)
    assert n == len(records)


def test_a_full_disk_is_one_line_naming_the_partition(
    system: SystemUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: ENOSPC in the log writer was a 157-line dump; a transient I/O error stays an
    OSError, for the callers that retry it."""
    import errno
    import os

    fill(system, 2)
    producer = system.factory.get_producer("fl", system.config)
    real = os.fsync
    for code, raised in ((errno.ENOSPC, UserError), (errno.EIO, OSError)):

        def failing(fd: int, code: int = code) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "fsync", failing)
        producer.send("s", 0, rec("k", "v", 1))
        with pytest.raises(raised) as caught:
            producer.flush()
        monkeypatch.setattr(os, "fsync", real)
        if raised is UserError:
            assert "cannot append to fl.s partition 0 under" in str(caught.value)
            assert "No space left on device" in str(caught.value)
            assert "a retry can write them twice" in str(caught.value)
        else:
            assert not isinstance(caught.value, UserError)


def test_a_stream_grown_by_another_process_has_its_new_count_everywhere(
    system: SystemUnderTest,
) -> None:
    """A worker keeps its systems between batches: once the stream grew elsewhere (stream
    add-partitions, another process), its admin's count is the new one, so its producers
    place keys by it, and its consumers read the new partitions."""
    kept = system.factory.get_admin(system.name, system.config)
    kept.create_stream(StreamSpec("grows", 2))
    assert kept.partition_count("grows") == 2
    other = system.factory.get_admin(system.name, system.config)  # another process's
    other.add_partitions("grows", 6)
    assert kept.partition_count("grows") == 6
    producer = system.factory.get_producer(system.name, system.config)
    producer.send("grows", 5, rec("k", "v", 1))
    producer.flush()
    got = system.factory.get_consumer(system.name, system.config).read(
        SystemStreamPartition(system.name, "grows", 5), "0", "1"
    )
    assert [r.value for r in got] == [b"v"]


# -- transactional partitions (an exactly-once job's changelog)


def offsets(records: Any) -> list[int]:
    return [int(r.offset) for r in records]


def test_read_committed_readers_read_only_what_was_committed(system: SystemUnderTest) -> None:
    fill(system, 10)
    admin = system.factory.get_admin("fl", system.config)
    committed = system.factory.get_consumer("fl", system.config)  # read_committed: the default
    everything = system.factory.get_consumer(
        "fl", {**system.config, "systems.fl.consumer.isolation.level": "read_uncommitted"}
    )
    assert offsets(committed.read(SSP, "0", "10")) == list(range(10))  # not transactional
    assert admin.committed_end(SSP) is None
    assert admin.commit_records(SSP, "0") == "0"  # held back from here on
    assert committed.read(SSP, "0", "10") == []
    assert admin.get_committed_metadata([SSP])[SSP].upcoming == "0"
    assert admin.get_metadata([SSP])[SSP].upcoming == "10"
    assert offsets(everything.read(SSP, "0", "10")) == list(range(10))
    assert admin.commit_records(SSP, "6") == "6"
    assert offsets(committed.read(SSP, "0", "10")) == list(range(6))
    assert len(committed.read_entries(SSP, "0", "10")) == 6
    assert len(committed.read_columns(SSP, "0", "10")) == 6
    meta = admin.get_committed_metadata([SSP])[SSP]
    assert (meta.newest, meta.upcoming) == ("5", "6")
    assert admin.commit_records(SSP, "3") == "6"  # never back
    assert admin.commit_records(SSP, None) is None  # released: every record is committed
    assert offsets(committed.read(SSP, "0", "10")) == list(range(10))


def test_an_aborted_range_is_never_read_committed_and_only_uncommitted_records_abort(
    system: SystemUnderTest,
) -> None:
    fill(system, 10)
    admin = system.factory.get_admin("fl", system.config)
    consumer = system.factory.get_consumer("fl", system.config)
    admin.commit_records(SSP, "3")
    with pytest.raises(UserError, match="committed"):
        admin.abort_records(SSP, "2", "5")
    admin.abort_records(SSP, "3", "7")  # a restore discarded 3..6
    producer = system.factory.get_producer("fl", system.config)
    for i in range(10, 13):
        producer.send("s", 0, rec(f"k{i}", f"value-{i}", i))
    producer.flush()
    admin.commit_records(SSP, "13")
    assert offsets(consumer.read(SSP, "0", "13")) == [0, 1, 2]  # a read stops before it
    assert offsets(consumer.read(SSP, "3", "13")) == [7, 8, 9, 10, 11, 12]  # and passes it
    assert offsets(consumer.read(SSP, "5", "13", 2)) == [7, 8]
    assert consumer.read(SSP, "4", "7") == []
    assert consumer.skipped_through(SSP) == "6"  # the reader moves past it
    assert consumer.read(SSP, "0", "0") == [] and consumer.skipped_through(SSP) is None
    everything = system.factory.get_consumer(
        "fl", {**system.config, "systems.fl.consumer.isolation.level": "read_uncommitted"}
    )
    assert offsets(everything.read(SSP, "0", "13")) == list(range(13))
    assert admin.aborted_ranges(SSP) == [("3", "7")]


def test_an_abort_that_never_returned_leaves_no_damaged_line(system: SystemUnderTest) -> None:
    fill(system, 10)
    admin = system.factory.get_admin("fl", system.config)
    admin.commit_records(SSP, "2")
    (part_dir(system) / "ABORTED").write_text('{"first": 2, "end": 4}\n{"first": 4, "e')
    assert admin.aborted_ranges(SSP) == [("2", "4")]  # the torn line is not one
    admin.abort_records(SSP, "4", "6")
    assert admin.aborted_ranges(SSP) == [("2", "4"), ("4", "6")]
    (part_dir(system) / "ABORTED").write_text('{"first": 2, "end": 4}\nnot json\n')
    with pytest.raises(CorruptRecordError, match="line 2 of .*ABORTED"):
        admin.aborted_ranges(SSP)


def test_compaction_judges_only_committed_records(system: SystemUnderTest) -> None:
    admin = system.factory.get_admin("fl", system.config)
    admin.create_stream(StreamSpec("s", 1, compacted=True))
    producer = system.factory.get_producer("fl", system.config)
    for i, value in enumerate(["a", "b", "c", "d"]):
        producer.send("s", 0, rec("k", value, i))
        producer.flush()
    admin.commit_records(SSP, "2")  # "c" and "d" may yet be aborted
    assert admin.compact("s", 0) == (4, 3)  # only "a" goes: "b" stays for a restore
    consumer = system.factory.get_consumer("fl", system.config)
    assert [r.value for r in consumer.read(SSP, "0", "4")] == [b"b"]


def test_a_reader_passes_an_aborted_range_that_compaction_left_nothing_before(
    system: SystemUnderTest,
) -> None:
    admin = system.factory.get_admin("fl", system.config)
    admin.create_stream(StreamSpec("s", 1, compacted=True))
    producer = system.factory.get_producer("fl", system.config)

    def write(*keys: str) -> None:
        for key in keys:
            producer.send("s", 0, rec(key, "v", 0))
        producer.flush()

    write(*(f"k{i}" for i in range(10)))
    admin.commit_records(SSP, "10")
    write("k8", "k9", "k8", "k9")  # 10..13: a batch whose checkpoint never came
    admin.abort_records(SSP, "10", "14")
    write("k8", "k9", "k0", "k1")  # 14, 15: the restore's undo; then the next batch
    admin.commit_records(SSP, "18")
    admin.compact("s", 0)  # 8 and 9 go: 14 and 15 supersede them
    consumer = system.factory.get_consumer("fl", system.config)
    assert offsets(consumer.read(SSP, "8", "18")) == [14, 15, 16, 17]
    assert offsets(consumer.read(SSP, "2", "18")) == [2, 3, 4, 5, 6, 7]
    assert consumer.read(SSP, "8", "14") == []
    assert consumer.skipped_through(SSP) == "13"
