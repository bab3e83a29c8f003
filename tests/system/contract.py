"""The contract every system passes: admin metadata, bounded reads, tombstones, large messages,
deleted records, key partitioning, durability, timestamps and startpoint resolution.

A system's test module subclasses :class:`SystemContract` and provides the ``system`` fixture
returning a :class:`SystemUnderTest` (a factory, the system's name and a config).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pytest

from sparkpoint.errors import ConfigError, StreamNotFound
from sparkpoint.model import SystemStreamPartition
from sparkpoint.startpoint import (
    StartpointOldest,
    StartpointSpecific,
    StartpointTimestamp,
    StartpointUpcoming,
)
from sparkpoint.system.base import Entries, Record, StreamSpec, SystemFactory
from sparkpoint.system.columns import RecordColumns


@dataclass
class SystemUnderTest:
    factory: SystemFactory
    name: str
    config: Mapping[str, str]


def rec(key: str | None, value: str | None, ts: int) -> Record:
    return Record(
        "", None if key is None else key.encode(), None if value is None else value.encode(), ts
    )


class SystemContract:
    def ssp(self, sut: SystemUnderTest, stream: str, p: int = 0) -> SystemStreamPartition:
        return SystemStreamPartition(sut.name, stream, p)

    def test_create_is_idempotent_and_listed(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        assert admin.create_stream(StreamSpec("s1", 3)) is True
        assert admin.create_stream(StreamSpec("s1", 5)) is False
        assert admin.partition_count("s1") == 3
        assert "s1" in admin.list_streams()

    def test_unknown_stream_names_it(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        with pytest.raises(StreamNotFound, match="nope"):
            admin.partition_count("nope")

    def test_empty_partition_metadata(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("empty", 1))
        ssp = self.ssp(system, "empty")
        meta = admin.get_metadata([ssp])[ssp]
        assert meta.newest is None
        assert meta.oldest == meta.upcoming

    def test_append_and_read_ranges(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("s", 2))
        producer = system.factory.get_producer(system.name, system.config)
        for i in range(100):
            producer.send("s", 1, rec(f"k{i % 7}", f"v{i}", 1000 + i))
        producer.send("s", 1, rec(None, None, 5000))
        producer.flush()
        ssp = self.ssp(system, "s", 1)
        meta = admin.get_metadata([ssp])[ssp]
        assert (meta.oldest, meta.newest, meta.upcoming) == ("0", "100", "101")
        other = self.ssp(system, "s", 0)
        assert admin.get_metadata([other])[other].newest is None
        consumer = system.factory.get_consumer(system.name, system.config)
        consumer.register(ssp, "10")
        got = consumer.read(ssp, "10", "20")
        assert [r.offset for r in got] == [str(i) for i in range(10, 20)]
        assert [r.value for r in got] == [f"v{i}".encode() for i in range(10, 20)]
        assert got[0].key == b"k3" and got[0].timestamp == 1010
        assert [r.offset for r in consumer.read(ssp, "95", "1000", max_records=3)] == [
            "95",
            "96",
            "97",
        ]
        last = consumer.read(ssp, "100", "101")
        assert last[0].key is None and last[0].value is None
        assert consumer.read(ssp, "101", "200") == []
        assert consumer.read(ssp, "50", "50") == []

    def test_offsets_compare_and_advance(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        ssp = self.ssp(system, "x")
        assert admin.offset_comparator("9", "10") < 0
        assert admin.offset_comparator("10", "10") == 0
        assert admin.offset_comparator("11", "10") > 0
        assert admin.offset_after(ssp, "41") == "42"

    def test_offset_for_timestamp(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("t", 1))
        producer = system.factory.get_producer(system.name, system.config)
        for i, ts in enumerate([100, 200, 200, 300, 400]):
            producer.send("t", 0, rec(f"k{i}", "v", ts))
        producer.flush()
        ssp = self.ssp(system, "t")
        assert admin.offset_for_timestamp(ssp, 50) == "0"  # before the first
        assert admin.offset_for_timestamp(ssp, 200) == "1"  # equal to a record's
        assert admin.offset_for_timestamp(ssp, 250) == "3"  # between records
        assert admin.offset_for_timestamp(ssp, 400) == "4"
        assert admin.offset_for_timestamp(ssp, 401) == "5"  # after the last: upcoming
        assert admin.resolve_startpoint_to_offset(ssp, StartpointTimestamp(250)) == "3"

    def test_startpoints_resolve_to_offsets(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("r", 1))
        producer = system.factory.get_producer(system.name, system.config)
        for i in range(6):
            producer.send("r", 0, rec(f"k{i}", "v", 100 + i))
        producer.flush()
        ssp = self.ssp(system, "r")
        resolve = admin.resolve_startpoint_to_offset
        assert resolve(ssp, StartpointSpecific("4")) == "4"
        assert resolve(ssp, StartpointOldest()) == "0"
        assert resolve(ssp, StartpointUpcoming()) == "6"

    def test_tombstones_and_keyless_records_round_trip(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("tomb", 1, compacted=True))
        producer = system.factory.get_producer(system.name, system.config)
        producer.send("tomb", 0, rec("k", "v", 1))
        producer.send("tomb", 0, rec("k", None, 2))  # a delete
        producer.send("tomb", 0, rec(None, "keyless", 3))
        producer.send("tomb", 0, Record("", b"", b"", 4))  # empty is not null
        producer.flush()
        got = system.factory.get_consumer(system.name, system.config).read(
            self.ssp(system, "tomb"), "0", "4"
        )
        assert [(r.key, r.value) for r in got] == [
            (b"k", b"v"),
            (b"k", None),
            (None, b"keyless"),
            (b"", b""),
        ]

    def test_large_messages_and_bulk_reads(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("big", 1))
        producer = system.factory.get_producer(system.name, system.config)
        large = bytes(range(256)) * 3500  # 896,000 bytes: under Kafka's 1 MB default limit
        producer.send("big", 0, Record("", b"large", large, 1))
        producer.send_many("big", 0, (rec(f"k{i}", f"v{i}", i) for i in range(3000)))
        producer.flush()
        consumer = system.factory.get_consumer(system.name, system.config)
        ssp = self.ssp(system, "big")
        assert consumer.read(ssp, "0", "1")[0].value == large
        got = consumer.read(ssp, "1", "3001")
        assert [r.value for r in got] == [f"v{i}".encode() for i in range(3000)]

    def test_entries_are_sent_as_their_records_in_order_between_other_sends(
        self, system: SystemUnderTest
    ) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("entries", 1))
        producer = system.factory.get_producer(system.name, system.config)
        producer.send("entries", 0, rec("a", "first", 5))
        keys = [b"k%d" % i for i in range(300)]
        values = [None if i % 3 == 0 else b"v%d" % i for i in range(300)]
        producer.send_entries("entries", 0, keys, values, 77)
        producer.send("entries", 0, rec("z", "last", 9))
        with pytest.raises(ValueError, match="2 keys for 1 values"):
            producer.send_entries("entries", 0, [b"x", b"y"], [b"1"], 77)
        producer.flush()
        got = system.factory.get_consumer(system.name, system.config).read(
            self.ssp(system, "entries"), "0", "302"
        )
        assert [(r.key, r.value) for r in got] == [
            (b"a", b"first"),
            *zip(keys, values, strict=True),
            (b"z", b"last"),
        ]
        assert [r.timestamp for r in got[1:301]] == [77] * 300
        assert len(got) == 302

    def test_records_sent_as_plain_tuples_are_the_records_send_makes(
        self, system: SystemUnderTest
    ) -> None:
        """``send_fields`` and ``send_fields_many`` (the task API's output path) queue what
        ``send`` and ``send_many`` would, in order with them."""
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("fields", 1))
        producer = system.factory.get_producer(system.name, system.config)
        producer.send("fields", 0, rec("a", "first", 5))
        producer.send_fields("fields", 0, ("", b"b", b"second", 6))
        producer.send_fields_many("fields", 0, [("", b"c", None, 7), ("", None, b"keyless", 8)])
        producer.send_many("fields", 0, [rec("d", "last", 9)])
        producer.flush()
        got = system.factory.get_consumer(system.name, system.config).read(
            self.ssp(system, "fields"), "0", "5"
        )
        assert [(r.key, r.value, r.timestamp) for r in got] == [
            (b"a", b"first", 5),
            (b"b", b"second", 6),
            (b"c", None, 7),
            (None, b"keyless", 8),
            (b"d", b"last", 9),
        ]

    def test_reads_start_at_the_oldest_record_left_after_a_delete(
        self, system: SystemUnderTest
    ) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("del", 1))
        producer = system.factory.get_producer(system.name, system.config)
        for i in range(10):
            producer.send("del", 0, rec(f"k{i}", f"v{i}", i))
        producer.flush()
        ssp = self.ssp(system, "del")
        assert admin.delete_records_before("del", 0, "4") == 4
        meta = admin.get_metadata([ssp])[ssp]
        assert (meta.oldest, meta.newest, meta.upcoming) == ("4", "9", "10")
        consumer = system.factory.get_consumer(system.name, system.config)
        assert [r.offset for r in consumer.read(ssp, "0", "6")] == ["4", "5"]
        assert admin.delete_records_before("del", 0, "10") == 6  # every record
        meta = admin.get_metadata([ssp])[ssp]
        assert (meta.oldest, meta.newest, meta.upcoming) == ("10", None, "10")
        producer.send("del", 0, rec("k", "after", 11))
        producer.flush()
        got = consumer.read(ssp, "0", "100")
        assert [(r.offset, r.value) for r in got] == [("10", b"after")]  # offsets never reused

    def test_columns_hold_the_records_read_returns(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("cols", 1))
        producer = system.factory.get_producer(system.name, system.config)
        large = bytes(range(256)) * 3000
        sent = [rec(f"k{i % 5}", f"v{i}", 1000 + i) for i in range(40)]
        sent[3] = rec(None, "keyless", 3)
        sent[4] = rec("k", None, 4)  # a tombstone
        sent[5] = Record("", b"", b"", 5)  # empty is not null
        sent[6] = Record("", b"\xff\x00", large, 6)  # binary, large
        producer.send_many("cols", 0, sent)
        producer.flush()
        consumer = system.factory.get_consumer(system.name, system.config)
        ssp = self.ssp(system, "cols")
        consumer.register(ssp, "0")
        ranges = [("0", "40", None), ("2", "9", None), ("10", "99", 7), ("40", "50", None)]
        for start, end, most in ranges:
            records = list(consumer.read(ssp, start, end, most))
            columns = consumer.read_columns(ssp, start, end, most)
            assert len(columns) == len(records)
            assert columns.records() == records
            assert columns.offsets.type == pa.string() and columns.timestamps.type == pa.int64()
            assert columns.keys.type == pa.binary() and columns.values.type == pa.binary()
            if records:
                assert columns.last_offset == records[-1].offset
            entries = consumer.read_entries(ssp, start, end, most)
            assert entries.keys == [r.key for r in records]
            assert entries.values == [r.value for r in records]
            assert entries.last_offset == (records[-1].offset if records else None)

    def test_bounded_reads_stop_at_read_max_bytes(self, system: SystemUnderTest) -> None:
        """A read of at most N records returns fewer once they pass read.max.bytes (never
        none while the range holds records), reading on from there gets every record once, in
        order, and a read of the whole range is not bounded."""
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("sized", 1))
        producer = system.factory.get_producer(system.name, system.config)
        sent = [Record("", f"k{i}".encode(), bytes([i % 251]) * 1000, i) for i in range(60)]
        sent[10] = Record("", b"big", b"x" * 20_000, 10)  # larger than the limit on its own
        sent[11] = Record("", None, None, 11)  # nothing to count
        producer.send_many("sized", 0, sent)
        producer.flush()
        ssp = self.ssp(system, "sized")
        config = {**system.config, f"systems.{system.name}.read.max.bytes": "5000"}
        consumer = system.factory.get_consumer(system.name, config)
        consumer.register(ssp, "0")
        assert len(consumer.read(ssp, "0", "60")) == 60  # no max_records: the whole range
        for read in (consumer.read, consumer.read_columns, consumer.read_entries):
            got: list[Record] = []
            sizes = []
            start = "0"
            while int(start) < 60:
                chunk = read(ssp, start, "60", 1000)
                records = as_records(chunk, start)
                assert records, f"{read.__name__} returned nothing from offset {start}"
                sizes.append(len(records))
                got += records
                start = str(int(records[-1].offset) + 1)
            assert [r.offset for r in got] == [str(i) for i in range(60)]
            assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in sent]
            assert max(sizes) < 10 and len(sizes) > 60 // 10  # about 5 records of 1 KB a read
            assert 1 in sizes  # the 20 KB record came alone
        unbounded = system.factory.get_consumer(system.name, system.config)
        assert len(unbounded.read(ssp, "0", "60", 1000)) == 60  # the default: 64 MiB

    def test_read_max_bytes_must_be_a_positive_integer(self, system: SystemUnderTest) -> None:
        for bad in ("0", "-1", "lots"):
            config = {**system.config, f"systems.{system.name}.read.max.bytes": bad}
            with pytest.raises(ConfigError, match=rf"systems\.{system.name}\.read\.max\.bytes"):
                system.factory.get_consumer(system.name, config)

    def test_keys_are_partitioned_stably_and_within_range(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        again = system.factory.get_admin(system.name, system.config)
        keys = [f"user-{i}".encode() for i in range(500)]
        placed = [admin.partition_for_key(k, 7) for k in keys]
        assert placed == [again.partition_for_key(k, 7) for k in keys]
        assert set(placed) == set(range(7))  # every partition gets keys
        assert admin.partition_for_key(None, 7) == 0

    def test_durable_across_new_instances(self, system: SystemUnderTest) -> None:
        admin = system.factory.get_admin(system.name, system.config)
        admin.create_stream(StreamSpec("d", 1))
        producer = system.factory.get_producer(system.name, system.config)
        producer.send("d", 0, rec("a", "1", 1))
        producer.close()
        fresh = system.factory.get_consumer(system.name, system.config)
        ssp = self.ssp(system, "d")
        assert [r.value for r in fresh.read(ssp, "0", "10")] == [b"1"]
        again = system.factory.get_producer(system.name, system.config)
        again.send("d", 0, rec("b", "2", 2))
        again.flush()
        assert [r.offset for r in fresh.read(ssp, "0", "10")] == ["0", "1"]


def as_records(chunk: Sequence[Record] | RecordColumns | Entries, start: str) -> list[Record]:
    """A read's result as records; entries, which have no offsets, numbered from ``start``
    (their records are consecutive here) and stamped with their offset's number."""
    if isinstance(chunk, Entries):
        assert chunk.last_offset == (str(int(start) + len(chunk) - 1) if len(chunk) else None)
        pairs = zip(chunk.keys, chunk.values, strict=True)
        return [Record(str(int(start) + i), k, v, int(start) + i) for i, (k, v) in enumerate(pairs)]
    return chunk.records() if isinstance(chunk, RecordColumns) else list(chunk)
