"""Interfaces every system implements: admin, consumer and producer.

Offsets are opaque strings; only the system's admin compares them or computes the one after.
Ranges are half-open: a read of ``[start, end)`` returns records with ``start <= offset < end``.
``upcoming`` is the offset the next appended record will get; ``newest`` is the offset of
the last record, or ``None`` when the partition is empty. An empty partition usually has
``oldest == upcoming``; offsets between them (records a repair removed) hold no record, and a
reader there is moved past them (``skipped_through``).
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from sparkpoint.config import ConfigKey
from sparkpoint.errors import ConfigError, UserError
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.system.record import Record as Record  # every system's record
from sparkpoint.system.record import RecordFields as RecordFields

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkpoint.model.startpoint import Startpoint
    from sparkpoint.system.columns import RecordColumns
    from sparkpoint.system.staging import OutputStaging


class IncomingMessageEnvelope(NamedTuple):
    """A message a task receives: its SSP, offset, decoded key and value, and timestamp (ms);
    its event time (ms: the timestamp, or ``streams.<s>.event.time.field`` of the message) and
    whether it is late (older than the task's watermark when its batch began; see
    :mod:`sparkpoint.runtime.executor.timers`). A named tuple, as :class:`Record` and for the
    same reason: one is built per message."""

    ssp: SystemStreamPartition
    offset: str
    key: object
    message: object
    timestamp: int
    event_time: int | None = None
    late: bool = False


class OutgoingMessageEnvelope(NamedTuple):
    """A message a task sends. Without ``partition`` it is placed by a hash of its key. A named
    tuple, built per message sent."""

    stream: SystemStream
    key: object
    message: object
    partition: int | None = None
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class Entries:
    """The keys and values of consecutive records of one SSP (a replay's read: no offsets, no
    timestamps, no Record per record) and the offset of the last one (``None``: no record)."""

    keys: list[bytes | None]
    values: list[bytes | None]
    last_offset: str | None

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """Offsets of one partition at the time they were read."""

    oldest: str
    newest: str | None
    upcoming: str


@dataclass(frozen=True)
class StreamSpec:
    """How to create a stream: its name, partition count, whether it is compacted by key, and
    system-specific properties (Kafka topic configs such as ``retention.ms``; a system ignores
    the ones it has no use for). Build it with :func:`sparkpoint.system.streams.stream_spec`,
    which adds the job's configured properties."""

    name: str
    partitions: int
    compacted: bool = False
    properties: Mapping[str, str] = field(default_factory=dict)


class SystemAdmin(ABC):
    """Metadata and management of one system's streams. Thread-safe."""

    @abstractmethod
    def create_stream(self, spec: StreamSpec) -> bool:
        """Create the stream; return False if it already existed (with any partition count)."""

    @abstractmethod
    def list_streams(self) -> list[str]:
        """Names of every stream in the system, sorted."""

    @abstractmethod
    def partition_count(self, stream: str) -> int:
        """Number of partitions; raises :class:`StreamNotFound` naming the stream if absent."""

    def current_partition_count(self, stream: str) -> int:
        """:meth:`partition_count` read from the system now, never from a cache: a running
        driver checks it before each batch (a grown input stops a job with state)."""
        return self.partition_count(stream)

    @abstractmethod
    def get_metadata(
        self, ssps: Iterable[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        """Oldest, newest and upcoming offsets of each SSP."""

    @abstractmethod
    def offset_comparator(self, a: str, b: str) -> int:
        """Negative, zero or positive as offset ``a`` is before, equal to or after ``b``."""

    @abstractmethod
    def offset_after(self, ssp: SystemStreamPartition, offset: str) -> str:
        """The offset at which reading resumes after having processed ``offset``."""

    @abstractmethod
    def offset_for_timestamp(self, ssp: SystemStreamPartition, timestamp_ms: int) -> str:
        """The first offset whose record timestamp is at or after ``timestamp_ms``.

        Returns the upcoming offset when every record is older.
        """

    def partition_for_key(self, key: bytes | None, partitions: int) -> int:
        """The partition a serialized key belongs to among ``partitions``: stable across
        processes and runs (``None`` goes to 0). sparkpoint's default is ``crc32(key)``; a
        system whose other clients place keys their own way overrides it (Kafka: murmur2)."""
        return 0 if key is None else zlib.crc32(key) % partitions

    def partitions_for_keys(self, keys: Sequence[bytes | None], partitions: int) -> list[int]:
        """:meth:`partition_for_key` of each of ``keys``, in one call (the default partitioner
        as one list comprehension, for tools that place millions of keys)."""
        if type(self).partition_for_key is SystemAdmin.partition_for_key:
            crc = zlib.crc32
            return [0 if k is None else crc(k) % partitions for k in keys]
        return [self.partition_for_key(k, partitions) for k in keys]

    def compact(
        self,
        stream: str,
        partition: int,
        up_to: str | None = None,
        drop_tombstones_before_ms: int | None = None,
    ) -> tuple[int, int] | None:
        """Keep only the newest record per key of a compacted stream's partition, if this system
        compacts on request (with ``up_to``: only among records before that offset; with
        ``drop_tombstones_before_ms``, a key whose newest record there is a tombstone older
        than that goes altogether, as Kafka's ``delete.retention.ms`` does); returns (records
        before, after), or ``None`` when the system compacts by itself (as Kafka does) or not
        at all."""
        return None

    def tombstones_dropped_through(self, ssp: SystemStreamPartition) -> str | None:
        """The largest offset of a tombstone compaction dropped from ``ssp`` (``None``: none,
        or this system cannot tell). A reader whose copy is at or before it may hold a key
        deleted since, and must rebuild its copy from the start."""
        return None

    #: whether this system can hold a partition's records back from read-committed readers
    #: until a checkpoint commits them (:meth:`commit_records`, :meth:`abort_records`)
    transactional_records = False

    def get_committed_metadata(
        self, ssps: Iterable[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        """:meth:`get_metadata` as read-committed readers see it: a transactional partition's
        ``upcoming`` is where its committed records end. The default: every record is."""
        return self.get_metadata(ssps)

    def committed_end(self, ssp: SystemStreamPartition) -> str | None:
        """The first offset of ``ssp`` read-committed readers may not read yet; ``None`` when
        the partition is not transactional (every record is committed)."""
        return None

    def commit_records(self, ssp: SystemStreamPartition, end: str | None) -> str | None:
        """Make the records of ``ssp`` before ``end`` visible to read-committed readers (the
        committed end only moves up; the first call makes the partition transactional: later
        records wait for the next call); ``None``: every record, and no longer transactional.
        Durable when it returns; the committed end it leaves."""
        raise UserError(f"this system cannot hold back the records of {ssp}")

    def abort_records(self, ssp: SystemStreamPartition, first: str, end: str) -> None:
        """Records ``first <= offset < end`` of ``ssp`` are never read by read-committed
        readers; none of them may be committed. Durable when it returns."""
        raise UserError(f"this system cannot abort the records of {ssp}")

    def aborted_ranges(self, ssp: SystemStreamPartition) -> list[tuple[str, str]]:
        """The offset ranges ``(first, end)`` of ``ssp`` read-committed readers never read."""
        return []

    def add_partitions(self, stream: str, partitions: int) -> None:
        """Grow ``stream`` to ``partitions`` partitions (more than it has: the caller checks).
        Existing partitions and their offsets stay as they are."""
        raise UserError(f"this system cannot add partitions to {stream}")

    def compacted(self, stream: str) -> bool | None:
        """Whether ``stream`` keeps the newest record of every key (compacted) rather than
        deleting records by age; ``None`` when this system cannot tell."""
        return None

    def validate_stream(self, spec: StreamSpec) -> None:  # noqa: B027 - optional hook
        """Check that an existing stream has what ``spec`` asks for, as far as this system can
        tell (Kafka: compaction and its settings), raising :class:`ConfigError` with the fix.
        The partition count is checked by the caller, which knows what needs it."""

    def retention_start(
        self,
        ssp: SystemStreamPartition,
        retention_ms: int | None,
        retention_bytes: int | None,
        now_ms: int,
    ) -> str | None:
        """The oldest offset of ``ssp`` that retention keeps (:mod:`sparkpoint.system.retention`),
        for a system that leaves retention to sparkpoint; ``None`` (the default) when the
        system applies it itself (Kafka's broker)."""
        return None

    def delete_records_before(self, stream: str, partition: int, offset: str) -> int:
        """Drop a partition's records before ``offset`` (retention, or an operator's clean-up;
        Samza's ``deleteMessages``, Kafka's DeleteRecords): its oldest offset becomes
        ``offset`` and offsets are never reused. Returns how many offsets were dropped."""
        raise UserError(f"this system cannot delete records of {stream} partition {partition}")

    def output_staging(self) -> OutputStaging | None:
        """This system's exactly-once output (:mod:`sparkpoint.system.staging`); ``None`` (the
        default) when it has none, and a job asking for exactly-once output is refused."""
        return None

    def resolve_startpoint_to_offset(
        self, ssp: SystemStreamPartition, startpoint: Startpoint
    ) -> str:
        """The next offset to read for ``startpoint`` (see :mod:`sparkpoint.system.resolve`).

        Systems override this only when they can do better than the generic resolution.
        """
        from sparkpoint.system.resolve import OffsetResolver

        return startpoint.apply(OffsetResolver(self, ssp))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""


class IntegerOffsets:
    """Offsets that are decimal integers, one per record (filelog, Kafka): a
    :class:`SystemAdmin` mix-in."""

    def offset_comparator(self, a: str, b: str) -> int:
        x, y = int(a), int(b)
        return (x > y) - (x < y)

    def offset_after(self, ssp: SystemStreamPartition, offset: str) -> str:
        return str(int(offset) + 1)


#: the most bytes (keys and values) one bounded read returns, past its first record
READ_MAX_BYTES = ConfigKey(
    "systems.<s>.read.max.bytes",
    str(64 * 1024 * 1024),
    "an integer >= 1",
    "about the most bytes of records (keys and values; on filelog, as stored) that one read of "
    "a partition returns past its first record, when the reader asks for at most N records: "
    "bounds the memory a batch, a changelog restore or a tool holds at once, whatever the "
    "message size; the reader goes on from the last record returned",
)


def read_max_bytes(system: str, config: Mapping[str, str]) -> int:
    """``systems.<system>.read.max.bytes`` (:data:`READ_MAX_BYTES`)."""
    key = f"systems.{system}.read.max.bytes"
    value = str(config.get(key) or READ_MAX_BYTES.default)
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(f"{key}={value!r}: expected {READ_MAX_BYTES.allowed}")
    return limit


ISOLATION_LEVEL = ConfigKey(
    "systems.<s>.consumer.isolation.level",
    "read_committed",
    "read_committed or read_uncommitted",
    "filelog: whether a reader sees the records of a transactional partition (an exactly-once "
    "job's changelog) before the checkpoint that commits them is written, and the ranges a "
    "restore aborted (Kafka's name; on kafka, passed to the consumer as it is)",
)
READ_UNCOMMITTED = "read_uncommitted"


def isolation_committed(system: str, config: Mapping[str, str]) -> bool:
    """Whether ``systems.<system>.consumer.isolation.level`` (:data:`ISOLATION_LEVEL`) is
    read_committed."""
    key = f"systems.{system}.consumer.isolation.level"
    value = config.get(key) or ISOLATION_LEVEL.default
    if value not in ("read_committed", READ_UNCOMMITTED):
        raise ConfigError(f"{key}={value!r}: expected {ISOLATION_LEVEL.allowed}")
    return value == "read_committed"


class SystemConsumer(ABC):
    """Reads bounded offset ranges of registered SSPs. One instance per thread."""

    @abstractmethod
    def register(self, ssp: SystemStreamPartition, offset: str) -> None:
        """Declare that ``ssp`` will be read starting at ``offset`` (inclusive)."""

    @abstractmethod
    def read(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> Sequence[Record]:
        """Records with ``start <= offset < end``, in offset order.

        With ``max_records``, at most that many, and fewer once their keys and values pass
        ``systems.<s>.read.max.bytes`` (:data:`READ_MAX_BYTES`; always at least one record
        when the range holds any): the caller reads on from the last offset returned. Without
        it, every record of the range.

        Raises :class:`CorruptRecordError` naming stream, partition and offset on bad data.
        """

    def read_columns(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> RecordColumns:
        """:meth:`read`'s records as Arrow columns (what a DataFrame batch reads). This default
        converts the records; a system that can decode straight into columns overrides it."""
        from sparkpoint.system.columns import RecordColumns

        return RecordColumns.from_records(self.read(ssp, start, end, max_records))

    def read_entries(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> Entries:
        """:meth:`read`'s keys and values (what a changelog replay writes into a store). This
        default takes them from :meth:`read_columns`; the embedded log slices them straight
        out of its file bytes."""
        columns = self.read_columns(ssp, start, end, max_records)
        if not len(columns):
            return Entries([], [], None)
        return Entries(columns.keys.to_pylist(), columns.values.to_pylist(), columns.last_offset)

    def skipped_through(self, ssp: SystemStreamPartition) -> str | None:
        """After a read of ``ssp`` that returned nothing: the last offset below the end of
        the partition's readable data, when offsets from the read's start up to it hold no
        record a reader will ever get (Kafka: transaction markers, and aborted records under
        ``read_committed``); the reader moves past it. ``None`` (the default) when the read
        found none, or the system cannot confirm it: offsets never move without a record."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Idempotent."""


def check_entries(keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
    """:meth:`SystemProducer.send_entries`'s arguments pair up, or a ValueError says not."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys for {len(values)} values")


class SystemProducer(ABC):
    """Sends records to partitions. ``send`` may buffer; ``flush`` makes everything sent durable."""

    @abstractmethod
    def send(self, stream: str, partition: int, record: Record) -> None:
        """Queue one record (its ``offset`` field is ignored; the system assigns offsets)."""

    def send_many(self, stream: str, partition: int, records: Iterable[Record]) -> None:
        """Queue several records for one partition, in order."""
        for record in records:
            self.send(stream, partition, record)

    def send_fields(self, stream: str, partition: int, fields: RecordFields) -> None:
        """:meth:`send` of a record given as a plain tuple ``("", key, value, timestamp)``:
        the task API's output path. A producer that holds records until a flush keeps the
        tuple as it is: Python's garbage collector stops tracking a plain tuple of bytes and
        integers, but never a record (a subclass), and traverses every one a batch holds
        (0.39 against 0.13 us a record kept)."""
        self.send(stream, partition, tuple.__new__(Record, fields))

    def send_fields_many(self, stream: str, partition: int, fields: Sequence[RecordFields]) -> None:
        """:meth:`send_many` of records given as plain tuples (see :meth:`send_fields`)."""
        new = tuple.__new__
        self.send_many(stream, partition, [new(Record, f) for f in fields])

    def send_entries(
        self,
        stream: str,
        partition: int,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        timestamp: int,
    ) -> None:
        """Queue the records ``keys[i]: values[i]`` (``None``: a tombstone) for one partition,
        in order, all stamped ``timestamp``: a changelog drain. The same as :meth:`send_many`
        of their records; a system may take them without building a record each."""
        check_entries(keys, values)
        new = tuple.__new__  # a record without the named tuple's Python-level __new__
        records = (new(Record, ("", k, v, timestamp)) for k, v in zip(keys, values, strict=True))
        self.send_many(stream, partition, records)

    @abstractmethod
    def flush(self) -> None:
        """Block until every record sent so far is durable in the system."""

    def close(self) -> None:
        """Flush and release resources. Idempotent."""
        self.flush()


class TableProducer(SystemProducer):
    """A producer whose streams are tables (:mod:`sparkpoint.system.tables`): it takes rows,
    not encoded records. A row is a mapping of column name to value (the task API's message);
    a DataFrame output sends whole Arrow record batches. The output path checks for this
    class, so a system declares that it takes rows by producing one."""

    @abstractmethod
    def send_rows(self, stream: str, rows: Sequence[Mapping[str, object]]) -> None:
        """Queue ``rows`` for table ``stream``, in order."""

    @abstractmethod
    def send_batch(self, stream: str, batch: pa.RecordBatch) -> None:
        """Queue the rows of an Arrow record batch (its columns are the table's)."""

    def send(self, stream: str, partition: int, record: Record) -> None:
        raise UserError(
            f"{stream} is a table: send it rows (a dict of column values per message, or a "
            "DataFrame), not encoded records"
        )


def not_rows(table: str, rows: Sequence[object]) -> str | None:
    """What makes ``rows`` not rows of ``table`` (a row is a mapping of column values), or
    ``None``: the one check of the task API's collector and of a table producer's callers."""
    for row in rows:
        if not isinstance(row, Mapping):
            return (
                f"a message to table {table} is a row, a dict of column values; got "
                f"{type(row).__name__}"
            )
    return None


class SystemFactory(ABC):
    """Builds a system's admin, consumer and producer from the job config."""

    #: the config keys this system reads beyond ``systems.<s>.*`` (which pass through), declared
    #: so that ``sparkpoint config keys`` lists them and a job's config is validated against them
    config_keys: tuple[ConfigKey, ...] = ()

    @abstractmethod
    def get_admin(self, system: str, config: Mapping[str, str]) -> SystemAdmin: ...

    @abstractmethod
    def get_consumer(self, system: str, config: Mapping[str, str]) -> SystemConsumer: ...

    @abstractmethod
    def get_producer(self, system: str, config: Mapping[str, str]) -> SystemProducer: ...
