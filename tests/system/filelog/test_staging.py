"""Exactly-once output on the filelog (issue 34), where it goes beyond the staging contract
(tests/system/test_staging.py, run on every system): a publisher that dies half-way is finished
by the next one to take the partition's lock, a damaged part publishes nothing, staged bytes
are renumbered, not decoded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.errors import CorruptRecordError
from sparkpoint.failpoints import PUBLISH_POINTS, InjectedCrash
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.filelog import FileLogSystemFactory
from sparkpoint.system.filelog.system import FileLogAdmin, FileLogStaging

SSP = SystemStreamPartition("fl", "out", 0)


@pytest.fixture
def admin(tmp_path: Path) -> FileLogAdmin:
    admin = FileLogSystemFactory().get_admin("fl", {"systems.fl.path": str(tmp_path / "fl")})
    admin.create_stream(StreamSpec("out", 2))
    return admin


def staging_of(admin: FileLogAdmin) -> FileLogStaging:
    staging = admin.output_staging()
    assert staging is not None
    return staging


def values(admin: FileLogAdmin, partition: int = 0) -> list[str]:
    """What a reader of the partition sees, in order."""
    ssp = SystemStreamPartition("fl", "out", partition)
    meta = admin.get_metadata([ssp])[ssp]
    consumer = FileLogSystemFactory().get_consumer("fl", {"systems.fl.path": str(root(admin))})
    return [(r.value or b"").decode() for r in consumer.read(ssp, meta.oldest, meta.upcoming, None)]


def root(admin: FileLogAdmin) -> Path:
    return admin._s.root


def stage(admin: FileLogAdmin, owner: str, part: str, *vals: str, partition: int = 0) -> str:
    producer = staging_of(admin).producer(owner, part)
    for v in vals:
        producer.send("out", partition, Record("", None, v.encode(), 1_000))
    staged = producer.stage()
    assert staged == ({("out", partition): part} if vals else {})
    return part


def test_an_older_commit_of_an_owner_is_never_published_after_a_newer_one(
    admin: FileLogAdmin,
) -> None:
    """The filelog orders an owner's publishes by commit key (``PUBLISHED``); Kafka by staging
    offset, which orders them the same way for every part a commit can name."""
    staging = staging_of(admin)
    stage(admin, "t0", "p1", "t0-a")
    assert staging.publish("out", 0, "t0", 3, ["p1"]) == 1
    assert staging.published_key("out", 0, "t0") == 3
    stage(admin, "t0", "p0", "stale")
    assert staging.publish("out", 0, "t0", 2, ["p0"]) == 0
    assert values(admin) == ["t0-a"]


@pytest.mark.parametrize("point", PUBLISH_POINTS)
def test_a_publisher_that_dies_half_way_is_finished_by_the_next_one(
    admin: FileLogAdmin, point: str, tmp_path: Path
) -> None:
    staging = staging_of(admin)
    stage(admin, "t0", "p1", "a", "b", "c")
    flag = tmp_path / "flag"
    flag.write_text("0")
    crash = {"testing.crash.at": point, "testing.crash.flag": str(flag)}
    with pytest.raises(InjectedCrash):
        staging.publish("out", 0, "t0", 5, ["p1"], failpoints=crash)
    # the publish is in neither state for readers: none of its records are visible
    assert values(admin) == []
    meta = admin.get_metadata([SSP])[SSP]
    assert (meta.newest, meta.upcoming) == (None, "0")
    # the next one to take the lock (here a plain append) finishes it first, exactly once
    producer = FileLogSystemFactory().get_producer("fl", {"systems.fl.path": str(root(admin))})
    producer.send("out", 0, Record("", None, b"after", 5))
    producer.flush()
    assert values(admin) == ["a", "b", "c", "after"]
    assert staging.publish("out", 0, "t0", 5, ["p1"]) == 0
    assert values(admin) == ["a", "b", "c", "after"]
    assert staging.staged("out") == []


def test_a_killed_publisher_process_leaves_nothing_visible_and_nothing_lost(
    admin: FileLogAdmin, tmp_path: Path
) -> None:
    stage(admin, "t0", "p1", *(f"v{i}" for i in range(500)))
    flag = tmp_path / "flag"
    flag.write_text("0")
    script = (
        "import sys\n"
        "from sparkpoint.system.filelog import FileLogSystemFactory\n"
        "a = FileLogSystemFactory().get_admin('fl', {'systems.fl.path': sys.argv[1]})\n"
        "a.output_staging().publish('out', 0, 't0', 9, ['p1'], failpoints={\n"
        "    'testing.crash.at': 'publish-after-append', 'testing.crash.flag': sys.argv[2],\n"
        "    'testing.crash.mode': 'exit'})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(root(admin)), str(flag)])
    assert proc.returncode == 137  # os._exit at the failpoint: the lock dies with it
    assert values(admin) == []
    assert staging_of(admin).publish("out", 0, "t0", 9, ["p1"]) == 0  # finished on the way in
    assert values(admin) == [f"v{i}" for i in range(500)]


def test_a_part_that_is_never_staged_leaves_nothing(admin: FileLogAdmin) -> None:
    producer = staging_of(admin).producer("t0", "p1")
    producer.send("out", 1, Record("", None, b"x", 1))
    producer.flush()  # durable in a temporary file, not a staged part
    assert staging_of(admin).staged("out") == []
    producer.close()  # the batch failed
    assert [f for f in (root(admin) / "out").rglob("staged/**/*") if f.is_file()] == []


def test_a_damaged_staged_part_is_an_error_naming_it_and_publishes_nothing(
    admin: FileLogAdmin,
) -> None:
    stage(admin, "t0", "p1", "a", "b")
    part = root(admin) / "out" / "0" / "staged" / "t0" / "p1.log"
    part.write_bytes(part.read_bytes()[:-3])  # torn
    with pytest.raises(CorruptRecordError, match=r"staged output .*p1.log is damaged"):
        staging_of(admin).publish("out", 0, "t0", 1, ["p1"])
    assert values(admin) == []
    assert not (root(admin) / "out" / "0" / "PUBLISHING").exists()  # checked before the intent
    stage(admin, "t1", "p2", "c")
    staging_of(admin).publish("out", 0, "t1", 1, ["p2"])  # the partition goes on
    assert values(admin) == ["c"]


def test_renumbering_staged_bytes_makes_what_encoding_the_records_makes() -> None:
    """A publish renumbers the staged parts' bytes (columnar.renumber) instead of decoding and
    encoding their records: the log and index bytes are the same, byte for byte."""
    import random

    from sparkpoint.system.filelog import columnar
    from sparkpoint.system.filelog import format as fmt

    rng = random.Random(5)

    def record(i: int) -> Record:
        key = None if i % 7 == 3 else rng.randbytes(rng.randrange(0, 20))
        value = None if i % 11 == 5 else rng.randbytes(rng.randrange(0, 300))
        return Record("", key, value, rng.randrange(-5, 10**13))

    groups = [[record(i) for i in range(n)] for n in (1, 250, 37)]
    parts = [fmt.encode_many(0, g)[0] for g in groups]
    flat = [r for g in groups for r in g]
    indexes = [fmt.encode_many(0, g)[1] for g in groups]  # what the staging writes beside
    for first, base, max_ts in ((0, 0, fmt.MIN_TIMESTAMP), (1_234_567, 98_765, 10**12)):
        want = fmt.encode_many(first, flat, base, max_ts)
        assert columnar.renumber(columnar.check_staged(parts), first, base, max_ts) == want
        by_index = columnar.check_staged(parts, indexes)
        assert columnar.renumber(by_index, first, base, max_ts) == want
    import struct
    import zlib

    odd_null = struct.pack(">qqii", 0, 1, -5, -7)  # any negative length reads as a null
    odd = fmt.HEADER.pack(fmt.MAGIC, zlib.crc32(odd_null), len(odd_null)) + odd_null
    decoded = fmt.decode_span(odd, [0])
    want = fmt.encode_many(10, decoded, 0, fmt.MIN_TIMESTAMP)
    assert columnar.renumber(columnar.check_staged([odd]), 10, 0, fmt.MIN_TIMESTAMP) == want
    damaged = bytearray(parts[1])
    damaged[len(damaged) // 2] ^= 0x20
    with pytest.raises(fmt.FormatError, match="checksum"):
        columnar.check_staged([parts[0], bytes(damaged)])
    with pytest.raises(fmt.FormatError):
        columnar.check_staged([parts[0][:-3]])  # torn


def _staged_files(admin: FileLogAdmin, partition: int, owner: str) -> list[str]:
    folder = root(admin) / "out" / str(partition) / "staged" / owner
    return sorted(f.name for f in folder.iterdir()) if folder.is_dir() else []


def _log_files(admin: FileLogAdmin, partition: int) -> dict[str, bytes]:
    folder = root(admin) / "out" / str(partition)
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.suffix in (".log", ".index")}


def _two_flushes(admin: FileLogAdmin, owner: str, partition: int) -> None:
    """A part of 300 records written in two flushes (its index spans both, as one index of
    them all would: positions and largest timestamps run on across the flushes)."""
    from sparkpoint.system.filelog import format as fmt

    producer = staging_of(admin).producer(owner, "p1")
    records = []
    for i in range(300):
        key = None if i % 7 == 3 else f"k{i}".encode()
        ts = 5_000 - i if i < 100 else 1_000 + i  # the largest comes before the first flush
        records.append(Record("", key, f"v{i}".encode() * (i % 5), ts))
        producer.send("out", partition, records[-1])
        if i == 120:
            producer.flush()
    assert producer.stage() == {("out", partition): "p1"}
    staged = root(admin) / "out" / str(partition) / "staged" / owner
    assert (staged / "p1.idx").read_bytes()[:-8] == fmt.encode_many(0, records)[1]


def test_a_publish_by_the_parts_index_writes_what_one_by_its_headers_writes(
    admin: FileLogAdmin,
) -> None:
    """Each staged part has its index beside it (``p1.idx``): a publish takes the records'
    positions from it and checks the part by one checksum. A part without it (staged by an
    older version) is checked record by record; both publish the same bytes."""
    _two_flushes(admin, "t0", 0)
    _two_flushes(admin, "t0", 1)
    assert _staged_files(admin, 0, "t0") == ["p1.idx", "p1.log"]
    (root(admin) / "out" / "1" / "staged" / "t0" / "p1.idx").unlink()
    assert staging_of(admin).publish("out", 0, "t0", 1, ["p1"]) == 300
    assert staging_of(admin).publish("out", 1, "t0", 1, ["p1"]) == 300
    assert _log_files(admin, 0) == _log_files(admin, 1) != {}
    assert values(admin, 0)[:3] == ["", "v1", "v2v2"]
    assert _staged_files(admin, 0, "t0") == _staged_files(admin, 1, "t0") == []


def test_an_index_that_does_not_fit_its_part_is_not_used(admin: FileLogAdmin) -> None:
    """A damaged index (its checksum fails), or entries that do not fit the part even with
    checksums made to match, leave the part to be checked by its headers: it publishes whole."""
    import struct
    import zlib

    from sparkpoint.system.filelog import format as fmt

    for partition in (0, 1):
        _two_flushes(admin, "t0", partition)
    damaged = root(admin) / "out" / "0" / "staged" / "t0" / "p1.idx"
    raw = bytearray(damaged.read_bytes())
    raw[5] ^= 0x01
    damaged.write_bytes(bytes(raw))
    forged = root(admin) / "out" / "1" / "staged" / "t0" / "p1.idx"
    part = (forged.parent / "p1.log").read_bytes()
    entries = bytearray(forged.read_bytes()[:-8])
    entries[fmt.INDEX_SIZE + 15] ^= 0x04  # the second record's position, 4 bytes off
    forged.write_bytes(bytes(entries) + struct.pack(">II", zlib.crc32(part), zlib.crc32(entries)))
    for partition in (0, 1):
        assert staging_of(admin).publish("out", partition, "t0", 1, ["p1"]) == 300
        assert values(admin, partition)[-1] == "v299" * 4
    # made by hand, with matching checksums: no entries for a part that has records, and a
    # position past the end (a reviewer's: the first published nothing and deleted the part,
    # the second raised an IndexError)
    entry = struct.Struct(">qQq")
    for n, (partition, entries) in enumerate(
        [(0, b""), (1, entry.pack(0, 0, 1) + entry.pack(1, 2**63 + 5, 1))], start=2
    ):
        stage(admin, "t0", f"p{n}", "a", "b", partition=partition)
        index = root(admin) / "out" / str(partition) / "staged" / "t0" / f"p{n}.idx"
        part = index.with_suffix(".log").read_bytes()
        index.write_bytes(entries + struct.pack(">II", zlib.crc32(part), zlib.crc32(entries)))
        assert staging_of(admin).publish("out", partition, "t0", n, [f"p{n}"]) == 2
        assert values(admin, partition)[-2:] == ["a", "b"]


def test_a_damaged_part_beside_its_index_is_named_and_publishes_nothing(
    admin: FileLogAdmin,
) -> None:
    _two_flushes(admin, "t0", 0)
    part = root(admin) / "out" / "0" / "staged" / "t0" / "p1.log"
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0x20  # a flipped bit: the framing holds, a record's CRC does not
    part.write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError, match=r"staged output .*p1.log is damaged"):
        staging_of(admin).publish("out", 0, "t0", 1, ["p1"])
    assert values(admin) == []
    assert _staged_files(admin, 0, "t0") == ["p1.idx", "p1.log"]  # kept, to be looked at


def test_a_sweep_keeps_a_kept_parts_index_and_deletes_the_others(admin: FileLogAdmin) -> None:
    stage(admin, "job.t0", "p1", "a")
    stage(admin, "job.t0", "p2", "b")
    swept = staging_of(admin).sweep("out", "job.", keep={"p2"})
    assert swept == {"job.t0": 1}
    assert _staged_files(admin, 0, "job.t0") == ["p2.idx", "p2.log"]
    assert staging_of(admin).publish("out", 0, "job.t0", 1, ["p2"]) == 1
    assert values(admin) == ["b"]
