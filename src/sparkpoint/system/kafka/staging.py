"""Exactly-once output on Kafka: records staged in a topic of their own, published in a Kafka
transaction that also records how far the owner's staged records went out.

A Spark task's producer does not outlive its batch, and the checkpoint that makes a batch's
output visible is written by the driver once every upload it names is done, so output cannot
sit in one open Kafka transaction from send to checkpoint (as Kafka Streams' does). It is
staged instead, like the filelog's (:mod:`sparkpoint.system.staging`):

* **stage**: a task attempt's batch output for partition ``p`` of ``<stream>`` goes to
  partition ``p`` of ``__sparkpoint-staged.<stream>`` (created on first use, with the stream's
  partition count, ``message.timestamp.type=LogAppendTime`` so retention runs from staging,
  and ``retention.ms`` from ``systems.<s>.staging.retention.ms``), each record with headers
  naming its owner, its part and its own timestamp, then one *end* record. The part's name
  says where it is: ``<part>@<first>-<end>`` (the offsets of its first record and of its end
  record), so a publish reads only that range. A part without an end record (an attempt that
  failed) is never named, never listed and never published. No reader of ``<stream>`` sees it.
* **publish**: one transactional producer per owner (``transactional.id`` is
  ``sparkpoint-publish.<owner>``, so a newer publisher fences an older one, and starting it
  ends the older one's transaction). In one transaction it appends the parts' records to
  ``<stream>`` partition ``p`` and writes the staging offset after the last part
  (*published through*, key ``<stream>/<p>``) to the owner's compacted topic
  ``__sparkpoint-published.<owner>``. Readers read committed (librdkafka's default): they see
  the whole publish or nothing of it. A publish whose parts end below published-through went
  out already and does nothing (after a crash, from a restarted task, from the driver's
  start): an owner's parts are staged in the order of its commits, so the staging offset
  orders them as the commit keys do. Before it checks, the publisher reads its owner's topic
  committed to its end (each process keeps its place): every earlier publish of the owner
  there is committed, since any publisher that committed after this one started fenced it
  (and this one's next transaction fails: a new producer, which fences in turn, checks
  again). Only the owner's own transactions write there, so only a dead publisher of the
  owner can hold the read back, and a new producer ends its transaction at once.
* **sweep** (a job's start, a DataFrame batch's publish): writes a mark to
  ``__sparkpoint-swept`` (``<stream>/<p>/<owner prefix>``: the staging offset it reaches and
  the parts it keeps); parts of those owners before it are discarded (never published, no
  longer listed). Their records stay until the staging topic's retention deletes them.

Tansu (the test broker) returns aborted records to read-committed readers. A publish that died
after appending its records and its mark is then visible whole there (records and mark alike),
and the next publish finds it done; one that died between its first record and its mark would
show a part of its records, and the next publish would append them all again.

Owns the staging, published and swept topics, their headers and the publishers' transactions;
imports the system interfaces, the failpoints and (at run time, for its clients) the Kafka
system module.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from sparkpoint.config import ConfigKey
from sparkpoint.errors import CorruptRecordError, SparkpointError
from sparkpoint.failpoints import InjectedCrash, maybe_crash
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.kafka.clients import (
    KafkaConsumer,
    KafkaProducer,
    client_config,
    settings_key,
)
from sparkpoint.system.kafka.fetch import fetched
from sparkpoint.system.kafka.produce import produce
from sparkpoint.system.staging import (
    OutputStaging,
    StagedPart,
    StagingProducer,
    check_name,
    swept_by,
)

if TYPE_CHECKING:
    from sparkpoint.system.kafka.system import KafkaAdmin

log = logging.getLogger(__name__)

#: the staging topic of ``<stream>`` is ``STAGED_PREFIX + stream`` (hidden from stream lists)
STAGED_PREFIX = "__sparkpoint-staged."
#: an owner's published-through offsets: ``PUBLISHED_PREFIX + owner``, one compacted partition
#: written only by that owner's publish transactions (so only its own, which its next publisher
#: ends, can hold a reader back)
PUBLISHED_PREFIX = "__sparkpoint-published."
#: every sweep's marks (written without transactions: never held back)
SWEPT_TOPIC = "__sparkpoint-swept"
#: sparkpoint's own topics of exactly-once output, hidden from stream lists
INTERNAL_PREFIXES = (STAGED_PREFIX, PUBLISHED_PREFIX, SWEPT_TOPIC)
#: the transactional id of an owner's publishes: this, then the owner
PUBLISHER_PREFIX = "sparkpoint-publish."
_OWNER, _PART, _END, _TS = "sp.owner", "sp.part", "sp.end", "sp.ts"
_NAME = re.compile(r"^(?P<part>.+)@(?P<first>\d+)-(?P<end>\d+)$")
_TIMEOUT_S = 30.0
#: the publishers' ``transaction.timeout.ms`` unless configured: a publisher that died leaves
#: its transaction open that long at most (its owner's next publisher ends it at once)
_TXN_TIMEOUT_MS = "15000"
#: how long a read of an owner's published topic waits for an open transaction: with a cached
#: publisher briefly (a new one ends the transaction, if it is the owner's own zombie), else
#: past the transaction timeout
_SHORT_WAIT_S, _LONG_WAIT_S = 3.0, 45.0
#: a sweep that discards nothing still moves its mark after this many staging offsets, so the
#: next one reads only what came since
_SWEEP_MOVE = 10_000

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
    """The transactional id of ``owner``'s publishes."""
    return f"{PUBLISHER_PREFIX}{owner}"


def published_topic(owner: str) -> str:
    """The topic of ``owner``'s published-through offsets."""
    return f"{PUBLISHED_PREFIX}{owner}"


def _swept_key(stream: str, partition: int, prefix: str) -> str:
    return f"{stream}/{partition}/{prefix}"


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


@dataclass(frozen=True)
class _Swept:
    """A sweep's mark: parts of its owners ending before ``at`` are discarded, but ``keep``."""

    at: int
    keep: frozenset[str]


class _Blocked(SparkpointError):
    """A read of a published topic waited out its limit: a transaction is open there."""


@dataclass
class _Control:
    """A compacted one-partition topic as a map, as far as this process has read it (an
    owner's published topic: ``<stream>/<partition>`` -> published-through; the sweeps' topic:
    ``<stream>/<partition>/<owner prefix>`` -> mark)."""

    position: int = 0
    values: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def published_through(self, stream: str, partition: int) -> int:
        return int(self.values.get(f"{stream}/{partition}", "0"))

    def swept(self, stream: str, partition: int) -> dict[str, _Swept]:
        """The last sweep mark per owner prefix of a staging partition."""
        prefix = f"{stream}/{partition}/"
        out = {}
        for key, value in self.values.items():
            if key.startswith(prefix):
                mark = json.loads(value)
                out[key[len(prefix) :]] = _Swept(int(mark["at"]), frozenset(mark["keep"]))
        return out


def _fenced(exc: KafkaException) -> bool:
    """Whether another publisher of the same owner fenced the one that raised ``exc`` (then
    its transaction is the newer publisher's to end: no abort is waited for)."""
    err = exc.args[0]
    return bool(err.fatal() or err.code() in _FENCED)


_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def _headers(message: Any) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in message.headers() or ()}


class _Publisher:
    """A transactional producer of one owner in this process. It has no delivery callback: a
    record not written makes ``commit_transaction`` fail (and a callback would run while a
    fatal error is being raised)."""

    def __init__(self, settings: dict[str, Any], owner: str) -> None:
        self.lock = threading.Lock()
        self.producer = Producer({**settings, "transactional.id": publisher_id(owner)})
        self.producer.init_transactions(_TIMEOUT_S)  # fences the last one, ends its transaction


#: records of parts this process staged, kept until published (their publish is then no read of
#: the staging topic): at most this many bytes, oldest dropped first
_KEPT_BYTES = 64 << 20
_Kept = tuple[str, str, int, str, str]  # brokers, stream, partition, owner, part name


class _KeptParts:
    """The records of parts staged by this process, by part, oldest first out."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parts: dict[_Kept, tuple[list[Record], int]] = {}
        self.size = 0

    def put(self, key: _Kept, records: list[Record], size: int) -> None:
        with self.lock:
            self.parts[key] = (records, size)
            self.size += size
            while self.size > _KEPT_BYTES and self.parts:
                _, dropped = self.parts.pop(next(iter(self.parts)))  # the oldest
                self.size -= dropped

    def get(self, key: _Kept) -> list[Record] | None:
        with self.lock:
            held = self.parts.get(key)
            return None if held is None else list(held[0])

    def drop(self, key: _Kept) -> None:
        with self.lock:
            held = self.parts.pop(key, None)
            if held is not None:
                self.size -= held[1]


_KEPT = _KeptParts()

_Settings = tuple[tuple[str, str], ...]
_PUBLISHERS: dict[tuple[_Settings, str], _Publisher] = {}
_CONTROLS: dict[tuple[_Settings, str], _Control] = {}
_PUBLISHERS_LOCK = threading.Lock()


def close_publishers(bootstrap: str | None = None) -> None:
    """Drop this process's publishers and control views (of the brokers ``bootstrap``, or
    all): a client of a broker that is gone would keep reconnecting, and logging it."""
    with _PUBLISHERS_LOCK:
        cached: list[dict[Any, Any]] = [_PUBLISHERS, _CONTROLS]
        for held in cached:
            for key in [
                k for k in held if bootstrap in (None, dict(k[0]).get("bootstrap.servers"))
            ]:
                del held[key]


class KafkaStagingProducer(StagingProducer):
    """Stages one task attempt's batch output (``owner``, ``part``) in the staging topics."""

    def __init__(self, staging: KafkaStaging, owner: str, part: str) -> None:
        self._staging = staging
        self.owner = check_name("owner", owner)
        self.part = check_name("part", part)
        self._header = [(_OWNER, owner.encode()), (_PART, part.encode())]
        self._producer: KafkaProducer = staging.new_producer()
        #: per (stream, partition): the first and last offsets written
        self._spans: dict[tuple[str, int], list[int]] = {}
        self._sent: set[tuple[str, int]] = set()
        #: what was sent, renumbered from 0, per (stream, partition), while it fits in memory,
        #: and its bytes
        self._held: dict[tuple[str, int], list[Record]] | None = {}
        self._held_bytes: dict[tuple[str, int], int] = {}
        self._held_total = 0

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
        topic = self._staging.ensure(stream, partition)
        headers = [*self._header, (_TS, str(record.timestamp or 0).encode())]
        self._producer.produce(topic, partition, record, headers, self._delivered)
        self._sent.add((stream, partition))
        if self._held is not None:
            key = (stream, partition)
            held = self._held.setdefault(key, [])
            held.append(Record(str(len(held)), record.key, record.value, record.timestamp or 0))
            size = len(record.key or b"") + len(record.value or b"") + 64
            self._held_bytes[key] = self._held_bytes.get(key, 0) + size
            self._held_total += size
            if self._held_total > _KEPT_BYTES // 4:
                self._held = None  # too big to keep: its publish reads the staging topic

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
            if self._held is not None:
                kept = (self._staging.brokers, key[0], key[1], self.owner, staged[key])
                _KEPT.put(kept, self._held.get(key, []), self._held_bytes.get(key, 0))
        self._reset()
        return staged

    def _reset(self) -> None:
        self._sent = set()
        self._spans = {}
        self._held = {}
        self._held_bytes = {}
        self._held_total = 0

    def close(self) -> None:
        """Release the client; a part never staged has no end record and is never listed."""
        self._reset()
        self._producer.close()


class KafkaStaging(OutputStaging):
    """Exactly-once output of one Kafka system (see the module docstring)."""

    def __init__(self, admin: KafkaAdmin, config: Mapping[str, str]) -> None:
        self._admin = admin
        self._config = dict(config)
        self.system = admin.system
        #: the brokers (the key of the parts this process keeps)
        self.brokers = client_config(admin.system, config, "consumer")["bootstrap.servers"]
        self._producer_settings: dict[str, Any] = {
            "enable.idempotence": True,
            **client_config(admin.system, config, "producer"),
        }
        self._publisher_settings = {"transaction.timeout.ms": _TXN_TIMEOUT_MS}
        self._publisher_settings.update(self._producer_settings)
        replication = config.get(f"systems.{admin.system}.default.stream.replication.factor")
        self._replication = {} if replication is None else {"replication.factor": replication}
        self._control_settings: dict[str, Any] = {
            **client_config(admin.system, config, "consumer"),
            "group.id": f"sparkpoint-{admin.system}-control",  # never joined
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,
        }
        self._retention = config.get(
            f"systems.{admin.system}.staging.retention.ms", STAGING_RETENTION.default or ""
        )
        self._ensured: dict[str, int] = {}  # stream -> the count its staging topic has
        self._created: set[str] = set()  # published topics and the sweeps' topic, by name
        self._lock = threading.Lock()

    # clients

    def new_producer(self) -> KafkaProducer:
        return KafkaProducer(self.system, self._config)

    def _reader(self) -> KafkaConsumer:
        return KafkaConsumer(self.system, self._config)

    def _publisher(self, owner: str, fresh: bool = False) -> _Publisher:
        key = (settings_key(self._publisher_settings), owner)
        with _PUBLISHERS_LOCK:
            cached = None if fresh else _PUBLISHERS.get(key)
        if cached is not None:
            return cached
        publisher = _Publisher(self._publisher_settings, owner)  # its init may take a while
        with _PUBLISHERS_LOCK:
            _PUBLISHERS[key] = publisher
        return publisher

    @staticmethod
    def _drop(owner: str, publisher: _Publisher) -> None:
        with _PUBLISHERS_LOCK:
            for key, held in list(_PUBLISHERS.items()):
                if held is publisher and key[1] == owner:
                    del _PUBLISHERS[key]

    # topics

    def ensure(self, stream: str, partition: int) -> str:
        """The staging topic of ``stream``, created (or grown) to its partition count: once per
        process, and again for a partition beyond the count it was made with (the stream grew
        since)."""
        topic = staging_topic(stream)
        if partition < self._ensured.get(stream, 0):
            return topic
        with self._lock:
            wanted = self._admin.partition_count(stream)
            props = {
                "retention.ms": self._retention,
                "message.timestamp.type": "LogAppendTime",
                **self._replication,
            }
            spec = StreamSpec(topic, wanted, properties=props)
            if not self._admin.create_stream(spec) and self._partitions(topic) < wanted:
                self._admin.add_partitions(topic, wanted)
            self._ensured[stream] = wanted
        return topic

    def _partitions(self, topic: str) -> int:
        """A topic's partition count, 0 if there is none (one metadata request)."""
        return self._admin.topics().get(topic, 0)

    def _create(self, topic: str) -> None:
        """A compacted one-partition topic of this module (an owner's published topic, the
        sweeps' topic), created once."""
        if topic not in self._created:
            spec = StreamSpec(topic, 1, compacted=True, properties=self._replication)
            if not self._admin.create_stream(spec):
                self._admin.validate_stream(spec)
            self._created.add(topic)

    def _view(self, topic: str, wait_s: float = _LONG_WAIT_S) -> _Control:
        """A copy of ``topic`` as a map, read committed to its end now (the high watermark at
        this call), waiting while a transaction there is open (:class:`_Blocked` after
        ``wait_s``); empty if there is no such topic."""
        if topic not in self._created and topic not in self._admin.topics():
            return _Control()
        self._created.add(topic)
        key = (settings_key(self._control_settings), topic)
        with _PUBLISHERS_LOCK:
            control = _CONTROLS.setdefault(key, _Control())
        ssp = SystemStreamPartition(self.system, topic, 0)
        with control.lock:
            high = int(self._admin.get_metadata([ssp])[ssp].upcoming)
            deadline = time.monotonic() + wait_s
            while control.position < high:
                self._read_control(topic, control, high)
                if control.position >= high:
                    break
                if time.monotonic() > deadline:
                    raise _Blocked(
                        f"kafka system {self.system}: {topic} is not readable past offset "
                        f"{control.position} (below {high}) after {wait_s:.0f}s: a publish "
                        f"transaction is open there (it ends by transaction.timeout.ms)"
                    )
                time.sleep(0.05)
            return _Control(control.position, dict(control.values))

    def _read_control(self, topic: str, control: _Control, high: int) -> None:
        consumer = Consumer(self._control_settings)
        try:
            consumer.assign([TopicPartition(topic, 0, control.position)])
            idle = time.monotonic() + 5.0
            while control.position < high and time.monotonic() < idle:
                for m in fetched(consumer, 1000, 0.2):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            control.position = max(control.position, m.offset())  # the LSO
                            return
                        if err.fatal():
                            raise SparkpointError(f"reading {topic}: {err.str()}")
                        continue  # a transient error (a broker reconnecting): read on
                    if m.offset() < control.position:
                        continue
                    if m.key() is not None:
                        control.values[m.key().decode()] = (m.value() or b"").decode()
                    control.position = m.offset() + 1
                    idle = time.monotonic() + 5.0
        finally:
            consumer.close()

    def _bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """The oldest offset of a partition and the offset after its last."""
        ssp = SystemStreamPartition(self.system, topic, partition)
        meta = self._admin.get_metadata([ssp])[ssp]
        return int(meta.oldest), int(meta.upcoming)

    def _messages(self, topic: str, partition: int, first: int, stop: int) -> list[Any]:
        reader = self._reader()
        try:
            return reader.messages(topic, partition, first, stop)
        finally:
            reader.close()

    def _scan(
        self, stream: str, partition: int, first: int, stop: int
    ) -> dict[tuple[str, str], tuple[PartName, int]]:
        """Every part of a staging partition that ends in offsets ``[first, stop)``, by owner
        and name, with its record count."""
        out = {}
        firsts: dict[tuple[str, str], tuple[int, int]] = {}  # first offset, records so far
        for m in self._messages(staging_topic(stream), partition, first, stop):
            h = _headers(m)
            owner = h.get(_OWNER)
            if owner is None:
                continue
            if _PART in h:
                begun, n = firsts.get((owner, h[_PART]), (m.offset(), 0))
                firsts[(owner, h[_PART])] = (begun, n + 1)
            elif _END in h and (owner, h[_END]) in firsts:
                begun, n = firsts.pop((owner, h[_END]))
                name = PartName(h[_END], begun, m.offset())
                out[(owner, str(name))] = (name, n)
        return out

    def _waiting(
        self, stream: str, partition: int, sweeps: _Control, first: int, stop: int
    ) -> list[StagedPart]:
        """The parts ending in offsets ``[first, stop)`` of a staging partition that are
        neither published nor discarded."""
        swept = sweeps.swept(stream, partition)
        through: dict[str, int] = {}
        out = []
        for (owner, text), (name, records) in sorted(
            self._scan(stream, partition, first, stop).items()
        ):
            if owner not in through:
                view = self._view(published_topic(owner))
                through[owner] = view.published_through(stream, partition)
            if name.end < through[owner]:
                continue  # published (or an attempt that lost, below what was)
            if any(
                name.end < mark.at and swept_by(owner, prefix) and text not in mark.keep
                for prefix, mark in swept.items()
            ):
                continue  # discarded
            out.append(StagedPart(stream, partition, owner, text, records))
        return out

    # the interface

    def producer(self, owner: str, part: str) -> KafkaStagingProducer:
        return KafkaStagingProducer(self, owner, part)

    def streams(self) -> list[str]:
        return sorted(
            t[len(STAGED_PREFIX) :] for t in self._admin.topics() if t.startswith(STAGED_PREFIX)
        )

    def staged(self, stream: str) -> list[StagedPart]:
        partitions = self._partitions(staging_topic(stream))
        if not partitions:
            return []
        sweeps = self._view(SWEPT_TOPIC)
        topic = staging_topic(stream)
        return [
            p
            for i in range(partitions)
            for p in self._waiting(stream, i, sweeps, *self._bounds(topic, i))
        ]

    def read_part(self, stream: str, partition: int, owner: str, part: str) -> list[Record]:
        name = PartName.parse(part)
        kept = _KEPT.get((self.brokers, stream, partition, owner, part))
        if kept is not None:  # staged by this process: the same records, in the same order
            return kept
        topic = staging_topic(stream)
        missing = CorruptRecordError(
            f"{self.system}.{topic} partition {partition}: staged output {owner}/{part} is "
            f"missing, though a written checkpoint names it: its records cannot be published "
            f"(deleted by the topic's retention, systems.{self.system}.staging.retention.ms?)"
        )
        if self._partitions(topic) <= partition:
            raise missing
        oldest, upcoming = self._bounds(topic, partition)
        if name.first < oldest or name.end >= upcoming:
            raise missing
        records: list[Record] = []
        ended = whole = False
        for m in self._messages(topic, partition, name.first, name.end + 1):
            h = _headers(m)
            if h.get(_OWNER) != owner:
                continue
            if h.get(_PART) == name.part:
                whole = whole or (not records and m.offset() == name.first)
                stamp = int(h.get(_TS) or 0)
                records.append(Record(str(len(records)), m.key(), m.value(), stamp))
            elif h.get(_END) == name.part and m.offset() == name.end:
                ended = True
        if not (ended and whole):  # (its head deleted by retention while it was read)
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
            try:
                publisher = self._publisher(owner, fresh=attempt == 2)
            except KafkaException as exc:
                raise SparkpointError(
                    f"kafka system {self.system}: starting the publisher of {owner} "
                    f"(transactional.id {publisher_id(owner)}) failed: {exc.args[0].str()}"
                ) from exc
            with publisher.lock:
                try:
                    return self._publish(
                        publisher,
                        stream,
                        partition,
                        owner,
                        key,
                        names,
                        failpoints or {},
                        _SHORT_WAIT_S if attempt == 1 else _LONG_WAIT_S,
                    )
                except (KafkaException, _Blocked) as exc:
                    # a cached producer fenced by another publisher of the owner, or broken, or
                    # the owner's published topic held back by a zombie's transaction: a new
                    # producer fences in turn (ending that transaction) and checks again
                    self._drop(owner, publisher)
                    if attempt == 1:
                        continue
                    why = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
                    raise SparkpointError(
                        f"kafka system {self.system}: publishing {owner}'s commit {key} to "
                        f"{stream} partition {partition} failed: {why} (nothing of it is "
                        f"visible; the next commit or start publishes it)"
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
        wait_s: float,
    ) -> int:
        topic = published_topic(owner)
        self._create(topic)
        through = self._view(topic, wait_s).published_through(stream, partition)
        last = max(n.end for n in names)
        if last < through:
            for n in names:
                _KEPT.drop((self.brokers, stream, partition, owner, str(n)))
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
            mark = Record("", f"{stream}/{partition}".encode(), str(last + 1).encode(), 0)
            produce(producer, topic, 0, mark)
            producer.flush(_TIMEOUT_S)
            maybe_crash(failpoints, "publish-after-append")
            producer.commit_transaction(_TIMEOUT_S)
            for n in names:
                _KEPT.drop((self.brokers, stream, partition, owner, str(n)))
        except InjectedCrash:
            self._drop(owner, publisher)  # as if the process died: the next one fences it
            raise
        except BaseException as exc:
            if isinstance(exc, KafkaException) and _fenced(exc):
                self._drop(owner, publisher)
                raise
            try:
                producer.abort_transaction(_TIMEOUT_S)
            except KafkaException:
                self._drop(owner, publisher)
            raise
        return len(records)

    def publishers(self, stream: str, partition: int) -> list[str]:
        owners = [
            t[len(PUBLISHED_PREFIX) :]
            for t in self._admin.topics()
            if t.startswith(PUBLISHED_PREFIX)
        ]
        return sorted(
            o for o in owners if self._view(published_topic(o)).published_through(stream, partition)
        )

    def sweep(self, stream: str, owner_prefix: str, keep: Collection[str] = ()) -> Counter[str]:
        topic = staging_topic(stream)
        partitions = self._partitions(topic)
        swept: Counter[str] = Counter()
        if not partitions:
            return swept
        self._create(SWEPT_TOPIC)
        sweeps = self._view(SWEPT_TOPIC)
        producer = self.new_producer()
        try:
            for partition in range(partitions):
                last = sweeps.swept(stream, partition).get(owner_prefix)
                since = 0 if last is None else last.at  # earlier parts: swept then
                oldest, high = self._bounds(topic, partition)
                waiting = self._waiting(stream, partition, sweeps, max(oldest, since), high)
                doomed = [
                    p for p in waiting if swept_by(p.owner, owner_prefix) and p.part not in keep
                ]
                # the kept parts of this partition: seen now, or kept by the last mark
                held = {p.part for p in waiting} | (set() if last is None else set(last.keep))
                kept = sorted(held & set(keep))
                moved = high - since >= _SWEEP_MOVE
                if doomed or moved or last is None or kept != sorted(last.keep):
                    mark = json.dumps({"at": high, "keep": kept})
                    key = _swept_key(stream, partition, owner_prefix).encode()
                    producer.produce(SWEPT_TOPIC, 0, Record("", key, mark.encode(), 0))
                    swept.update(p.owner for p in doomed)
        finally:
            producer.close()
        return swept
