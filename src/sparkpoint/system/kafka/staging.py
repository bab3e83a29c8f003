"""Exactly-once output on Kafka: records staged in a topic of their own, published in a Kafka
transaction that also records how far the owner's staged records went out.

A Spark task's producer does not outlive its batch, and the checkpoint that makes a batch's
output visible is written by the driver once every upload it names is done, so output cannot
sit in one open Kafka transaction from send to checkpoint (as Kafka Streams' does). It is
staged instead, like the filelog's (:mod:`sparkpoint.system.staging`):

* **stage**: a task attempt's batch output for partition ``p`` of ``<stream>`` goes to
  partition ``p`` of ``__sparkpoint-staged.<stream>`` (created on first use, with the stream's
  partition count and ``retention.ms`` from ``systems.<s>.staging.retention.ms``), each record
  with headers naming its owner and part, then one *end* record. The part's name says where it
  is: ``<part>@<first>-<end>`` (the offsets of its first record and of its end record), so a
  publish reads only that range. A part without an end record (an attempt that failed) is
  never named, never listed and never published. No reader of ``<stream>`` sees any of it.
* **publish**: one transactional producer per owner (``transactional.id`` is
  ``sparkpoint-publish.<owner>``, so a newer publisher fences an older one, and starting it
  aborts the older one's open transaction). In one transaction it appends the parts' records to
  ``<stream>`` partition ``p`` and commits, as the offset of consumer group
  ``sparkpoint-publish.<owner>`` on the staging partition, the offset after the last part
  published (*published through*). Readers of ``<stream>`` read committed (librdkafka's
  default): they see the whole publish or nothing of it. A publish whose parts end below the
  owner's published-through went out already and does nothing (after a crash, from a
  restarted task, from the driver's start): an owner's parts are staged in the order of its
  commits, so the staging offset orders them as the commit keys do.
* **sweep** (a job's start): appends a *sweep* record naming the owners and the parts kept;
  parts of those owners before it are discarded (never published, no longer listed). Their
  records stay until the staging topic's retention deletes them.

Tansu (the test broker) returns aborted records to read-committed readers, so there a publish
that died after appending shows its records, and the publish that finishes it shows them again;
``tests/system/test_staging.py`` names that by a strict xfail.

Owns the staging topics, their headers and the publishers' transactions; imports the system
interfaces, the failpoints and (at run time, for its clients) the Kafka system module.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from sparkpoint.config import ConfigKey
from sparkpoint.errors import CorruptRecordError, SparkpointError, StreamNotFound
from sparkpoint.failpoints import InjectedCrash, maybe_crash
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.kafka.produce import produce
from sparkpoint.system.staging import (
    OutputStaging,
    StagedPart,
    StagingProducer,
    check_name,
    swept_by,
)

if TYPE_CHECKING:
    from sparkpoint.system.kafka.system import KafkaAdmin, KafkaConsumer, KafkaProducer

log = logging.getLogger(__name__)

#: the staging topic of ``<stream>`` is ``STAGED_PREFIX + stream`` (hidden from stream lists)
STAGED_PREFIX = "__sparkpoint-staged."
#: the transactional id and consumer group of an owner's publishes: this, then the owner
PUBLISHER_PREFIX = "sparkpoint-publish."
_OWNER, _PART, _END, _SWEEP, _KEEP = "sp.owner", "sp.part", "sp.end", "sp.sweep", "sp.keep"
_NAME = re.compile(r"^(?P<part>.+)@(?P<first>\d+)-(?P<end>\d+)$")
_TIMEOUT_S = 30.0
#: errors that say another publisher of the same owner fenced this one (librdkafka reports
#: some as fatal, and a fenced offset commit as the broker's error only)
_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)

STAGING_RETENTION = ConfigKey(
    "systems.<s>.staging.retention.ms",
    "604800000",
    "milliseconds",
    "kafka, exactly-once output: retention of the staging topics (__sparkpoint-staged.<stream>) "
    "sparkpoint creates; a staged part must be published (at the commit naming it, or at the "
    "job's next start) before retention deletes it (default 7 days)",
)


def staging_topic(stream: str) -> str:
    """The topic ``stream``'s output is staged in."""
    return f"{STAGED_PREFIX}{stream}"


def publisher_id(owner: str) -> str:
    """The transactional id (and consumer group) of ``owner``'s publishes."""
    return f"{PUBLISHER_PREFIX}{owner}"


@dataclass(frozen=True)
class PartName:
    """A staged part's name: the attempt's part, and where its records are in the staging
    partition (its first record, and its end record)."""

    part: str
    first: int
    end: int

    @classmethod
    def parse(cls, name: str) -> PartName:
        m = _NAME.match(name)
        if m is None:
            raise CorruptRecordError(
                f"{name!r} does not name a part staged on Kafka (<part>@<first>-<end>)"
            )
        return cls(m["part"], int(m["first"]), int(m["end"]))

    def __str__(self) -> str:
        return f"{self.part}@{self.first}-{self.end}"


def _fenced(exc: KafkaException) -> bool:
    """Whether another publisher of the same owner fenced the one that raised ``exc``."""
    err = exc.args[0]
    return bool(err.fatal() or err.code() in _FENCED)


def _headers(message: Any) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in message.headers() or ()}


@dataclass
class _Scanned:
    """One staging partition, read whole: its ended parts and its sweeps."""

    parts: dict[tuple[str, str], tuple[PartName, int]] = field(default_factory=dict)
    sweeps: list[tuple[int, str, frozenset[str]]] = field(default_factory=list)


class _Publisher:
    """A transactional producer of one owner in this process, and its group's metadata."""

    def __init__(self, settings: dict[str, Any], owner: str) -> None:
        from confluent_kafka import Consumer

        self.lock = threading.Lock()
        self.failures: list[str] = []
        tid = publisher_id(owner)
        self.producer = Producer(
            {**settings, "transactional.id": tid, "on_delivery": self._delivered}
        )
        self.producer.init_transactions(_TIMEOUT_S)  # fences the last one, ends its transaction
        group = Consumer({**_connection(settings), "group.id": tid})
        try:
            self.group = group.consumer_group_metadata()
        finally:
            group.close()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failures.append(f"{msg.topic()} partition {msg.partition()}: {err.str()}")


def _connection(settings: Mapping[str, Any]) -> dict[str, Any]:
    shared = ("bootstrap.servers", "client.id", "security.", "sasl.", "ssl.", "socket.")
    return {k: v for k, v in settings.items() if k.startswith(shared)}


_PUBLISHERS: dict[tuple[tuple[tuple[str, str], ...], str], _Publisher] = {}
_PUBLISHERS_LOCK = threading.Lock()


def close_publishers(bootstrap: str | None = None) -> None:
    """Drop this process's publishers (of the brokers ``bootstrap``, or all): a client of a
    broker that is gone would keep reconnecting, and logging it."""
    with _PUBLISHERS_LOCK:
        for key in [
            k for k in _PUBLISHERS if bootstrap in (None, dict(k[0]).get("bootstrap.servers"))
        ]:
            del _PUBLISHERS[key]


class KafkaStagingProducer(StagingProducer):
    """Stages one task attempt's batch output (``owner``, ``part``) in the staging topics."""

    def __init__(self, staging: KafkaStaging, owner: str, part: str) -> None:
        self._staging = staging
        self.owner = check_name("owner", owner)
        self.part = check_name("part", part)
        self._headers = [(_OWNER, owner.encode()), (_PART, part.encode())]
        self._producer: KafkaProducer = staging.new_producer()
        #: per (stream, partition): the first and last offsets written, and records delivered
        self._spans: dict[tuple[str, int], list[int]] = {}
        self._sent: set[tuple[str, int]] = set()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            return  # the producer's flush raises, naming it
        key = (msg.topic()[len(STAGED_PREFIX) :], msg.partition())
        span = self._spans.get(key)
        if span is None:
            self._spans[key] = [msg.offset(), msg.offset()]
        else:
            span[0], span[1] = min(span[0], msg.offset()), max(span[1], msg.offset())

    def send(self, stream: str, partition: int, record: Record) -> None:
        topic = self._staging.ensure(stream)
        self._producer.produce(topic, partition, record, self._headers, self._delivered)
        self._sent.add((stream, partition))

    def flush(self) -> None:
        self._producer.flush()

    def stage(self) -> dict[tuple[str, int], str]:
        self._producer.flush()
        end = [(_OWNER, self.owner.encode()), (_END, self.part.encode())]
        for stream, partition in sorted(self._sent):
            self._producer.produce(
                staging_topic(stream), partition, Record("", None, None, 0), end, self._delivered
            )
        self._producer.flush()  # the end records: each one's offset is its part's last
        staged = {}
        for key in sorted(self._sent):
            first, last = self._spans[key]
            staged[key] = str(PartName(self.part, first, last))
        self._sent, self._spans = set(), {}
        return staged

    def close(self) -> None:
        """Release the client; a part never staged has no end record and is never listed."""
        self._sent, self._spans = set(), {}
        self._producer.close()


class KafkaStaging(OutputStaging):
    """Exactly-once output of one Kafka system (see the module docstring)."""

    def __init__(self, admin: KafkaAdmin, config: Mapping[str, str]) -> None:
        from sparkpoint.system.kafka.system import client_config

        self._admin = admin
        self._config = dict(config)
        self.system = admin.system
        self._producer_settings: dict[str, Any] = {
            "enable.idempotence": True,
            **client_config(admin.system, config, "producer"),
        }
        self._retention = config.get(
            f"systems.{admin.system}.staging.retention.ms", STAGING_RETENTION.default or ""
        )
        self._ensured: set[str] = set()
        self._lock = threading.Lock()

    # clients

    def new_producer(self) -> KafkaProducer:
        from sparkpoint.system.kafka.system import KafkaProducer

        return KafkaProducer(self.system, self._config)

    def _reader(self) -> KafkaConsumer:
        from sparkpoint.system.kafka.system import KafkaConsumer

        return KafkaConsumer(self.system, self._config)

    def _publisher(self, owner: str, fresh: bool = False) -> _Publisher:
        plain = tuple(sorted((k, str(v)) for k, v in self._producer_settings.items()))
        key = (plain, owner)
        with _PUBLISHERS_LOCK:
            publisher = None if fresh else _PUBLISHERS.get(key)
            if publisher is None:
                publisher = _PUBLISHERS[key] = _Publisher(self._producer_settings, owner)
            return publisher

    @staticmethod
    def _drop(owner: str, publisher: _Publisher) -> None:
        with _PUBLISHERS_LOCK:
            for key, held in list(_PUBLISHERS.items()):
                if held is publisher and key[1] == owner:
                    del _PUBLISHERS[key]

    # topics

    def ensure(self, stream: str) -> str:
        """The staging topic of ``stream``, created (or grown) to its partition count."""
        topic = staging_topic(stream)
        if stream in self._ensured:
            return topic
        with self._lock:
            wanted = self._admin.partition_count(stream)
            spec = StreamSpec(topic, wanted, properties={"retention.ms": self._retention})
            if not self._admin.create_stream(spec) and self._partitions(topic) < wanted:
                self._admin.add_partitions(topic, wanted)
            self._ensured.add(stream)
        return topic

    def _partitions(self, topic: str) -> int:
        try:
            return self._admin.partition_count(topic)
        except StreamNotFound:
            return 0

    def _scan(self, stream: str, partition: int) -> _Scanned:
        """Every ended part and every sweep of a staging partition, read whole."""
        topic = staging_topic(stream)
        ssp = SystemStreamPartition(self.system, topic, partition)
        meta = self._admin.get_metadata([ssp])[ssp]
        out = _Scanned()
        firsts: dict[tuple[str, str], tuple[int, int]] = {}  # first offset, records so far
        reader = self._reader()
        try:
            messages = reader.messages(topic, partition, int(meta.oldest), int(meta.upcoming))
        finally:
            reader.close()
        for m in messages:
            h = _headers(m)
            owner = h.get(_OWNER)
            if _SWEEP in h:
                keep = frozenset(json.loads(h.get(_KEEP) or "[]"))
                out.sweeps.append((m.offset(), h[_SWEEP], keep))
            elif owner is not None and _PART in h:
                first, n = firsts.get((owner, h[_PART]), (m.offset(), 0))
                firsts[(owner, h[_PART])] = (first, n + 1)
            elif owner is not None and _END in h and (owner, h[_END]) in firsts:
                first, n = firsts.pop((owner, h[_END]))
                name = PartName(h[_END], first, m.offset())
                out.parts[(owner, str(name))] = (name, n)
        return out

    def _published_through(
        self, owners: Collection[str], topic: str, partition: int
    ) -> dict[str, int]:
        return {
            o: self._admin.group_offsets(publisher_id(o), [(topic, partition)]).get(
                (topic, partition), 0
            )
            for o in owners
        }

    def _waiting(self, stream: str, partition: int) -> list[StagedPart]:
        scanned = self._scan(stream, partition)
        owners = {owner for owner, _ in scanned.parts}
        through = self._published_through(owners, staging_topic(stream), partition)
        out = []
        for (owner, text), (name, records) in sorted(scanned.parts.items()):
            if name.end < through[owner]:
                continue  # published
            if any(
                at > name.end and swept_by(owner, prefix) and text not in keep
                for at, prefix, keep in scanned.sweeps
            ):
                continue  # discarded
            out.append(StagedPart(stream, partition, owner, text, records))
        return out

    # the interface

    def producer(self, owner: str, part: str) -> KafkaStagingProducer:
        return KafkaStagingProducer(self, owner, part)

    def staged(self, stream: str) -> list[StagedPart]:
        topic = staging_topic(stream)
        return [p for i in range(self._partitions(topic)) for p in self._waiting(stream, i)]

    def read_part(self, stream: str, partition: int, owner: str, part: str) -> list[Record]:
        name = PartName.parse(part)
        topic = staging_topic(stream)
        missing = CorruptRecordError(
            f"{self.system}.{topic} partition {partition}: staged output {owner}/{part} is "
            f"missing, though a written checkpoint names it: its records cannot be published "
            f"(deleted by the topic's retention, systems.{self.system}.staging.retention.ms?)"
        )
        if self._partitions(topic) <= partition:
            raise missing
        ssp = SystemStreamPartition(self.system, topic, partition)
        meta = self._admin.get_metadata([ssp])[ssp]
        if name.first < int(meta.oldest) or name.end >= int(meta.upcoming):
            raise missing
        reader = self._reader()
        try:
            messages = reader.messages(topic, partition, name.first, name.end + 1)
        finally:
            reader.close()
        records: list[Record] = []
        ended = False
        for m in messages:
            h = _headers(m)
            if h.get(_OWNER) != owner:
                continue
            if h.get(_PART) == name.part:
                _, stamp = m.timestamp()
                records.append(Record(str(len(records)), m.key(), m.value(), max(0, stamp)))
            elif h.get(_END) == name.part and m.offset() == name.end:
                ended = True
        if not ended:
            raise missing
        return records

    def publish(
        self,
        stream: str,
        partition: int,
        owner: str,
        key: int,
        parts: Sequence[str],
        failpoints: Mapping[str, str] | None = None,
    ) -> int:
        names = [PartName.parse(p) for p in parts]
        if not names:
            return 0
        for attempt in (1, 2):
            publisher = self._publisher(owner, fresh=attempt == 2)
            with publisher.lock:
                try:
                    return self._publish(
                        publisher, stream, partition, owner, key, names, failpoints or {}
                    )
                except KafkaException as exc:
                    err = exc.args[0]
                    self._drop(owner, publisher)
                    if attempt == 1 and _fenced(exc):
                        continue  # a newer publisher of the owner fenced this one: start a
                        # new one (fencing that one in turn), and check again what went out
                    raise SparkpointError(
                        f"kafka system {self.system}: publishing {owner}'s commit {key} to "
                        f"{stream} partition {partition} failed: {err.str()} (nothing of it "
                        f"is visible; the next commit or start publishes it)"
                    ) from exc
        raise AssertionError("unreachable")

    def _publish(
        self,
        publisher: _Publisher,
        stream: str,
        partition: int,
        owner: str,
        key: int,
        names: list[PartName],
        failpoints: Mapping[str, str],
    ) -> int:
        topic = staging_topic(stream)
        through = self._published_through([owner], topic, partition)[owner]
        last = max(n.end for n in names)
        if last < through:
            return 0  # published already
        if any(n.first < through for n in names):
            raise CorruptRecordError(
                f"{self.system}.{stream} partition {partition}: {owner}'s commit {key} names "
                f"staged parts of which some went out already ({', '.join(map(str, names))}, "
                f"published through staging offset {through})"
            )
        records = [r for n in names for r in self.read_part(stream, partition, owner, str(n))]
        producer = publisher.producer
        producer.begin_transaction()
        try:
            maybe_crash(failpoints, "publish-after-intent")
            for r in records:
                produce(producer, stream, partition, r)
            offsets = [TopicPartition(topic, partition, last + 1)]
            producer.send_offsets_to_transaction(offsets, publisher.group, _TIMEOUT_S)
            producer.flush(_TIMEOUT_S)
            if publisher.failures:
                raise SparkpointError(f"records not written: {publisher.failures[0]}")
            maybe_crash(failpoints, "publish-after-append")
            producer.commit_transaction(_TIMEOUT_S)
        except InjectedCrash:
            self._drop(owner, publisher)  # as if the process died: the next one fences it
            raise
        except BaseException as exc:
            publisher.failures.clear()
            if isinstance(exc, KafkaException) and _fenced(exc):
                self._drop(owner, publisher)  # its transaction is the newer publisher's to end
                raise
            try:
                producer.abort_transaction(_TIMEOUT_S)
            except KafkaException:
                self._drop(owner, publisher)
            raise
        return len(records)

    def publishers(self, stream: str, partition: int) -> list[str]:
        topic = staging_topic(stream)
        if self._partitions(topic) <= partition:
            return []
        return [
            group[len(PUBLISHER_PREFIX) :]
            for group in self._admin.groups(PUBLISHER_PREFIX)
            if self._admin.group_offsets(group, [(topic, partition)])
        ]

    def sweep(self, stream: str, owner_prefix: str, keep: Collection[str] = ()) -> int:
        topic = staging_topic(stream)
        partitions = self._partitions(topic)
        if not partitions:
            return 0
        swept = 0
        producer = self.new_producer()
        try:
            for partition in range(partitions):
                doomed = [
                    p
                    for p in self._waiting(stream, partition)
                    if swept_by(p.owner, owner_prefix) and p.part not in keep
                ]
                if doomed:
                    headers = [
                        (_SWEEP, owner_prefix.encode()),
                        (_KEEP, json.dumps(sorted(keep)).encode()),
                    ]
                    producer.produce(topic, partition, Record("", None, None, 0), headers)
                    swept += len(doomed)
        finally:
            producer.close()
        return swept
