"""The contract every system passes: admin metadata, bounded reads, durability, timestamps.

A system's test module subclasses :class:`SystemContract` and provides the ``system`` fixture
returning a :class:`SystemUnderTest` (a factory, the system's name and a config).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from sparkpoint.errors import StreamNotFound
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec, SystemFactory


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
