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
  ``<stream>`` partition ``p`` and writes, to the compacted control topic
  ``__sparkpoint-published``, the staging offset after the last part (*published through*,
  key ``published/<stream>/<p>/<owner>``). Readers read committed (librdkafka's default): they
  see the whole publish or nothing of it. A publish whose parts end below the owner's
  published-through went out already and does nothing (after a crash, from a restarted task,
  from the driver's start): an owner's parts are staged in the order of its commits, so the
  staging offset orders them as the commit keys do. The control topic is read committed to its
  end each time (each process keeps its place in it), after the publisher's own fence, so it
  holds every earlier publish of the owner; an open transaction of another owner is waited for.
* **sweep** (a job's start, a DataFrame batch's publish): writes a mark to the control topic
  (``swept/<stream>/<p>/<owner prefix>``: the staging offset it reaches and the parts it keeps);
  parts of those owners before it are discarded (never published, no longer listed). Their
  records stay until the staging topic's retention deletes them.

Tansu (the test broker) returns aborted records to read-committed readers. A publish that died
after appending its records and its mark is then visible whole there (records and mark alike),
and the next publish finds it done; one that died between its first record and its mark would
show a part of its records, and the next publish would append them all again.

Owns the staging topics, the control topic, their headers and the publishers' transactions;
imports the system interfaces, the failpoints and (at run time, for its clients) the Kafka
system module.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from sparkpoint.config import ConfigKey
from sparkpoint.errors import CorruptRecordError, SparkpointError
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
#: the compacted topic of every owner's published-through offsets and every sweep's mark
CONTROL_TOPIC = "__sparkpoint-published"
#: the transactional id of an owner's publishes: this, then the owner
PUBLISHER_PREFIX = "sparkpoint-publish."
_OWNER, _PART, _END, _TS = "sp.owner", "sp.part", "sp.end", "sp.ts"
_NAME = re.compile(r"^(?P<part>.+)@(?P<first>\d+)-(?P<end>\d+)$")
_TIMEOUT_S = 30.0
#: how long a read of the control topic waits for another publisher's open transaction (more
#: than librdkafka's default ``transaction.timeout.ms``, after which the broker aborts it)
_CONTROL_WAIT_S = 90.0
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


def _published_key(stream: str, partition: int, owner: str) -> str:
    return f"published/{stream}/{partition}/{owner}"


def _swept_key(stream: str, partition: int, prefix: str) -> str:
    return f"swept/{stream}/{partition}/{prefix}"


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


@dataclass
class _Control:
    """One partition of the control topic as a map, as far as this process has read it."""

    position: int = 0
    values: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def published_through(self, stream: str, partition: int, owner: str) -> int:
        return int(self.values.get(_published_key(stream, partition, owner), "0"))

    def swept(self, stream: str, partition: int) -> dict[str, _Swept]:
        """The last sweep mark per owner prefix of a staging partition."""
        prefix = f"swept/{stream}/{partition}/"
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


_Settings = tuple[tuple[str, str], ...]
_PUBLISHERS: dict[tuple[_Settings, str], _Publisher] = {}
_CONTROLS: dict[_Settings, _Control] = {}
_PUBLISHERS_LOCK = threading.Lock()


def _plain(settings: Mapping[str, Any]) -> _Settings:
    return tuple(sorted((k, str(v)) for k, v in settings.items() if not callable(v)))


def close_publishers(bootstrap: str | None = None) -> None:
    """Drop this process's publishers and control views (of the brokers ``bootstrap``, or
    all): a client of a broker that is gone would keep reconnecting, and logging it."""
    with _PUBLISHERS_LOCK:
        for key in [
            k for k in _PUBLISHERS if bootstrap in (None, dict(k[0]).get("bootstrap.servers"))
        ]:
            del _PUBLISHERS[key]
        for settings in [
            k for k in _CONTROLS if bootstrap in (None, dict(k).get("bootstrap.servers"))
        ]:
            del _CONTROLS[settings]


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
        headers = [*self._header, (_TS, str(record.timestamp or 0).encode())]
        self._producer.produce(topic, partition, record, headers, self._delivered)
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


@dataclass
class _Scanned:
    """A staging partition read from some offset: its ended parts, with their record counts."""

    parts: dict[tuple[str, str], tuple[PartName, int]] = field(default_factory=dict)


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
        self._ensured: set[str] = set()
        self._control_ready = False
        self._lock = threading.Lock()

    # clients

    def new_producer(self) -> KafkaProducer:
        from sparkpoint.system.kafka.system import KafkaProducer

        return KafkaProducer(self.system, self._config)

    def _reader(self) -> KafkaConsumer:
        from sparkpoint.system.kafka.system import KafkaConsumer

        return KafkaConsumer(self.system, self._config)

    def _publisher(self, owner: str, fresh: bool = False) -> _Publisher:
        key = (_plain(self._producer_settings), owner)
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
            props = {"retention.ms": self._retention, "message.timestamp.type": "LogAppendTime"}
            spec = StreamSpec(topic, wanted, properties=props)
            if not self._admin.create_stream(spec) and self._partitions(topic) < wanted:
                self._admin.add_partitions(topic, wanted)
            self._ensured.add(stream)
        return topic

    def _partitions(self, topic: str) -> int:
        """A topic's partition count, 0 if there is none (one metadata request)."""
        return self._admin.topics().get(topic, 0)

    def _control(self) -> _Control:
        """This process's view of the control topic, read committed to its end now: after the
        high watermark of this call, waiting while another publisher's transaction is open."""
        if not self._control_ready:
            self._admin.create_stream(StreamSpec(CONTROL_TOPIC, 1, compacted=True))
            self._control_ready = True
        key = _plain(self._control_settings)
        with _PUBLISHERS_LOCK:
            control = _CONTROLS.setdefault(key, _Control())
        ssp = SystemStreamPartition(self.system, CONTROL_TOPIC, 0)
        with control.lock:
            high = int(self._admin.get_metadata([ssp])[ssp].upcoming)
            deadline = time.monotonic() + _CONTROL_WAIT_S
            while control.position < high:
                self._read_control(control, high)
                if control.position >= high:
                    break
                if time.monotonic() > deadline:
                    raise SparkpointError(
                        f"kafka system {self.system}: {CONTROL_TOPIC} is not readable past "
                        f"offset {control.position} (below {high}) after "
                        f"{_CONTROL_WAIT_S:.0f}s: a transaction of a publisher of exactly-once "
                        f"output is open (it ends by transaction.timeout.ms at the latest)"
                    )
                time.sleep(0.05)
        return control

    def _read_control(self, control: _Control, high: int) -> None:
        consumer = Consumer(self._control_settings)
        try:
            consumer.assign([TopicPartition(CONTROL_TOPIC, 0, control.position)])
            idle = time.monotonic() + 2.0
            while control.position < high and time.monotonic() < idle:
                for m in consumer.consume(1000, timeout=0.2):
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise SparkpointError(f"reading {CONTROL_TOPIC}: {err.str()}")
                        control.position = max(control.position, m.offset())  # the LSO
                        return
                    if m.offset() < control.position:
                        continue
                    if m.key() is not None:
                        control.values[m.key().decode()] = (m.value() or b"").decode()
                    control.position = m.offset() + 1
                    idle = time.monotonic() + 2.0
        finally:
            consumer.close()

    def _scan(self, stream: str, partition: int, start: int = 0) -> _Scanned:
        """Every ended part of a staging partition from offset ``start`` (or its oldest)."""
        topic = staging_topic(stream)
        ssp = SystemStreamPartition(self.system, topic, partition)
        meta = self._admin.get_metadata([ssp])[ssp]
        out = _Scanned()
        firsts: dict[tuple[str, str], tuple[int, int]] = {}  # first offset, records so far
        reader = self._reader()
        try:
            first = max(int(meta.oldest), start)
            messages = reader.messages(topic, partition, first, int(meta.upcoming))
        finally:
            reader.close()
        for m in messages:
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
                out.parts[(owner, str(name))] = (name, n)
        return out

    def _waiting(
        self, stream: str, partition: int, control: _Control, start: int = 0
    ) -> list[StagedPart]:
        swept = control.swept(stream, partition)
        out = []
        for (owner, text), (name, records) in sorted(
            self._scan(stream, partition, start).parts.items()
        ):
            if name.end < control.published_through(stream, partition, owner):
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
        control = self._control()
        return [p for i in range(partitions) for p in self._waiting(stream, i, control)]

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
        ended = whole = False
        for m in messages:
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
            publisher = self._publisher(owner, fresh=attempt == 2)
            with publisher.lock:
                try:
                    return self._publish(
                        publisher, stream, partition, owner, key, names, failpoints or {}
                    )
                except KafkaException as exc:
                    self._drop(owner, publisher)
                    if attempt == 1:  # a cached producer: fenced by another publisher of the
                        continue  # owner, or broken; a new one fences in turn, checks again
                    raise SparkpointError(
                        f"kafka system {self.system}: publishing {owner}'s commit {key} to "
                        f"{stream} partition {partition} failed: {exc.args[0].str()} (nothing "
                        f"of it is visible; the next commit or start publishes it)"
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
        through = self._control().published_through(stream, partition, owner)
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
            mark = Record(
                "", _published_key(stream, partition, owner).encode(), str(last + 1).encode(), 0
            )
            produce(producer, CONTROL_TOPIC, 0, mark)
            producer.flush(_TIMEOUT_S)
            maybe_crash(failpoints, "publish-after-append")
            producer.commit_transaction(_TIMEOUT_S)
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
        prefix = f"published/{stream}/{partition}/"
        return sorted(k[len(prefix) :] for k in self._control().values if k.startswith(prefix))

    def sweep(self, stream: str, owner_prefix: str, keep: Collection[str] = ()) -> int:
        topic = staging_topic(stream)
        partitions = self._partitions(topic)
        if not partitions:
            return 0
        control = self._control()
        swept = 0
        producer = self.new_producer()
        try:
            for partition in range(partitions):
                last = control.swept(stream, partition).get(owner_prefix)
                since = 0 if last is None else last.at  # earlier parts: swept then
                ssp = SystemStreamPartition(self.system, topic, partition)
                high = int(self._admin.get_metadata([ssp])[ssp].upcoming)
                doomed = [
                    p
                    for p in self._waiting(stream, partition, control, since)
                    if swept_by(p.owner, owner_prefix) and p.part not in keep
                ]
                if doomed or high - since >= _SWEEP_MOVE:
                    mark = json.dumps({"at": high, "keep": sorted(keep)})
                    key = _swept_key(stream, partition, owner_prefix).encode()
                    producer.produce(CONTROL_TOPIC, 0, Record("", key, mark.encode(), 0))
                    swept += len(doomed)
        finally:
            producer.close()
        return swept
