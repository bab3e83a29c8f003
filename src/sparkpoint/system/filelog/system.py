"""The filelog system: admin, consumer and producer over :class:`PartitionLog` directories.

Layout under ``systems.<name>.path``: ``<stream>/stream.json`` (partition count, compacted flag)
and ``<stream>/<partition>/`` per partition. Offsets are decimal integers as strings. Creating a
stream is atomic and safe from several processes (it is built under a temporary name, then
renamed). The producer buffers records per partition until :meth:`FileLogProducer.flush` (or
until ``systems.<name>.producer.buffer.bytes``, default 4 MiB, is reached).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint.config import ConfigKey
from sparkpoint.errors import ConfigError, CorruptRecordError, StreamNotFound, UserError
from sparkpoint.fsutil import atomic_write, fsync_dir
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import (
    ISOLATION_LEVEL,
    READ_MAX_BYTES,
    Entries,
    IntegerOffsets,
    PartitionMetadata,
    Record,
    RecordFields,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
    check_entries,
    isolation_committed,
    read_max_bytes,
)
from sparkpoint.system.filelog import publishing, staging
from sparkpoint.system.filelog.partition import PartitionLog
from sparkpoint.system.filelog.staging import FileLogStagingProducer
from sparkpoint.system.staging import OutputStaging, StagedPart

if TYPE_CHECKING:
    from sparkpoint.system.columns import RecordColumns

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def root_for(system: str, config: Mapping[str, str]) -> Path:
    key = f"systems.{system}.path"
    value = config.get(key)
    if not value:
        raise ConfigError(f"missing required config key {key} (the filelog directory)")
    return Path(value)


class _Streams:
    """Stream directories of one filelog root, shared by admin, consumer and producer."""

    def __init__(self, system: str, root: Path) -> None:
        self.system = system
        self.root = root
        self._partitions: dict[str, int] = {}

    def check_name(self, stream: str) -> None:
        if not _NAME.match(stream) or ".." in stream:
            raise UserError(
                f"invalid stream name {stream!r} in system {self.system}: use letters, digits, "
                "'_', '-' and '.', not starting with '.'"
            )

    def list(self) -> list[str]:
        """The streams: directories with a ``stream.json``, except a creation's staging
        directory (``.<name>.<random>``, renamed to ``<name>`` when whole; one left by a process
        killed before its rename is not a stream)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if not p.name.startswith(".") and (p / "stream.json").is_file()
        )

    def partitions(self, stream: str, fresh: bool = False) -> int:
        if fresh or stream not in self._partitions:
            self.check_name(stream)
            path = self.root / stream / "stream.json"
            try:
                meta = json.loads(path.read_text())
                partitions = int(meta["partitions"])
                if partitions < 1:
                    raise ValueError(f"{partitions} partitions")
            except FileNotFoundError:
                known = ", ".join(self.list()) or "none"
                raise StreamNotFound(
                    f"stream {self.system}.{stream} does not exist; streams in "
                    f"{self.system}: {known}"
                ) from None
            except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
                raise CorruptRecordError(
                    f"stream {self.system}.{stream}: {path} is not "
                    f'{{"partitions": N, "compacted": false}} ({type(exc).__name__}: {exc}); '
                    f"write the stream's partition count there"
                ) from None
            self._partitions[stream] = partitions
        return self._partitions[stream]

    def add_partitions(self, stream: str, partitions: int) -> None:
        """New empty partitions, then the new count in ``stream.json`` (atomically: a crash
        between the two leaves the old count, and running it again finishes the job)."""
        before = self.partitions(stream)
        for p in range(before, partitions):
            PartitionLog(
                self.root / stream / str(p), f"{self.system}.{stream} partition {p}"
            ).create()
        path = self.root / stream / "stream.json"
        meta = json.loads(path.read_text())
        meta["partitions"] = partitions
        atomic_write(path, json.dumps(meta).encode())
        self._partitions[stream] = partitions

    def compacted(self, stream: str) -> bool:
        self.partitions(stream)  # names a missing or broken stream
        meta = json.loads((self.root / stream / "stream.json").read_text())
        return bool(meta.get("compacted", False))

    def log(self, stream: str, partition: int) -> PartitionLog:
        n = self.partitions(stream)
        if partition >= n:  # grown since this process read its count?
            n = self.partitions(stream, fresh=True)
        if not 0 <= partition < n:
            raise UserError(
                f"partition {partition} of {self.system}.{stream} does not exist "
                f"(partitions 0..{n - 1})"
            )
        return PartitionLog(
            self.root / stream / str(partition), f"{self.system}.{stream} partition {partition}"
        )


class FileLogAdmin(IntegerOffsets, SystemAdmin):
    def __init__(self, streams: _Streams, buffer_bytes: int = 4 * 1024 * 1024) -> None:
        self._staging = FileLogStaging(streams, buffer_bytes)
        self._s = streams

    def compacted(self, stream: str) -> bool:
        return self._s.compacted(stream)

    def add_partitions(self, stream: str, partitions: int) -> None:
        self._s.add_partitions(stream, partitions)

    def create_stream(self, spec: StreamSpec) -> bool:
        self._s.check_name(spec.name)
        if spec.partitions < 1:
            raise UserError(f"stream {spec.name}: partitions must be >= 1, not {spec.partitions}")
        target = self._s.root / spec.name
        if (target / "stream.json").exists():
            return False
        self._s.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=self._s.root))
        try:
            for p in range(spec.partitions):
                PartitionLog(staging / str(p), f"{spec.name} partition {p}").create()
            meta = {"partitions": spec.partitions, "compacted": spec.compacted}
            (staging / "stream.json").write_text(json.dumps(meta))
            try:
                os.rename(staging, target)
            except OSError:
                if (target / "stream.json").exists():
                    return False  # another process created it first
                raise
            fsync_dir(self._s.root)
            return True
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def list_streams(self) -> list[str]:
        return self._s.list()

    def partition_count(self, stream: str) -> int:
        # read again, not this process's earlier answer: another process may have grown the
        # stream since (stream add-partitions), and a producer placing keys by the old count
        # would send them to tasks that do not hold their state (a worker keeps its systems
        # between batches)
        return self._s.partitions(stream, fresh=True)

    def get_metadata(
        self, ssps: Iterable[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        return {s: self._s.log(s.stream, s.partition).metadata() for s in ssps}

    def offset_for_timestamp(self, ssp: SystemStreamPartition, timestamp_ms: int) -> str:
        return str(self._s.log(ssp.stream, ssp.partition).offset_for_timestamp(timestamp_ms))

    def compact(
        self,
        stream: str,
        partition: int,
        up_to: str | None = None,
        drop_tombstones_before_ms: int | None = None,
    ) -> tuple[int, int]:
        """Compact one partition (see :meth:`PartitionLog.compact`)."""
        bound = None if up_to is None else int(up_to)
        return self._s.log(stream, partition).compact(bound, drop_tombstones_before_ms)

    def tombstones_dropped_through(self, ssp: SystemStreamPartition) -> str | None:
        through = self._s.log(ssp.stream, ssp.partition).tombstones_dropped_through()
        return None if through is None else str(through)

    transactional_records = True

    def get_committed_metadata(
        self, ssps: Iterable[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        return {s: self._s.log(s.stream, s.partition).metadata(committed=True) for s in ssps}

    def committed_end(self, ssp: SystemStreamPartition) -> str | None:
        end = self._s.log(ssp.stream, ssp.partition).committed_end()
        return None if end is None else str(end)

    def commit_records(self, ssp: SystemStreamPartition, end: str | None) -> str | None:
        left = self._s.log(ssp.stream, ssp.partition).commit_through(
            None if end is None else int(end)
        )
        return None if left is None else str(left)

    def abort_records(self, ssp: SystemStreamPartition, first: str, end: str) -> None:
        self._s.log(ssp.stream, ssp.partition).abort(int(first), int(end))

    def aborted_ranges(self, ssp: SystemStreamPartition) -> list[tuple[str, str]]:
        ranges = self._s.log(ssp.stream, ssp.partition).aborted_ranges()
        return [(str(a), str(b)) for a, b in ranges]

    def retention_start(
        self,
        ssp: SystemStreamPartition,
        retention_ms: int | None,
        retention_bytes: int | None,
        now_ms: int,
    ) -> str:
        log = self._s.log(ssp.stream, ssp.partition)
        return str(log.retention_start(retention_ms, retention_bytes, now_ms))

    def delete_records_before(self, stream: str, partition: int, offset: str) -> int:
        """Drop the records of a partition before ``offset`` (retention, or an operator's
        clean-up; Kafka's deleteRecords). Returns how many were dropped."""
        return self._s.log(stream, partition).delete_before(int(offset))

    def output_staging(self) -> FileLogStaging:
        return self._staging

    def delete_stream(self, stream: str) -> bool:
        """Delete a stream and all its records (renamed away first, so no reader sees half a
        stream); ``False`` if there was none. For tools that start a job over."""
        self._s.check_name(stream)
        target = self._s.root / stream
        if not target.is_dir():
            return False
        doomed = self._s.root / f".{stream}.deleting-{uuid.uuid4().hex[:8]}"
        os.replace(target, doomed)
        shutil.rmtree(doomed)
        self._s._partitions.pop(stream, None)
        return True

    def repair(self, stream: str, partition: int) -> list[tuple[int, int]]:
        """Remove a partition's damaged records, never reusing their offsets (see
        :meth:`PartitionLog.repair`); the offset ranges removed."""
        return self._s.log(stream, partition).repair()


class FileLogConsumer(SystemConsumer):
    """Reads partitions; ``committed`` (``isolation.level`` read_committed, the default): only
    what a transactional partition's checkpoints committed, never an aborted range."""

    def __init__(self, streams: _Streams, max_bytes: int, committed: bool = True) -> None:
        self._s = streams
        self._max_bytes = max_bytes  # for reads that ask for at most N records
        self._committed = committed
        self._registered: dict[SystemStreamPartition, str] = {}
        self._last: dict[SystemStreamPartition, tuple[int, int]] = {}  # each SSP's last read

    def register(self, ssp: SystemStreamPartition, offset: str) -> None:
        self._s.log(ssp.stream, ssp.partition)
        self._registered[ssp] = str(int(offset))

    def _log(self, ssp: SystemStreamPartition, start: str, end: str) -> PartitionLog:
        self._last[ssp] = (int(start), int(end))
        return self._s.log(ssp.stream, ssp.partition)

    def read(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> Sequence[Record]:
        log = self._log(ssp, start, end)
        return log.read(
            int(start), int(end), max_records, self._bytes(max_records), self._committed
        )

    def read_columns(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> RecordColumns:
        log = self._log(ssp, start, end)
        return log.read_columns(
            int(start), int(end), max_records, self._bytes(max_records), self._committed
        )

    def read_entries(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> Entries:
        log = self._log(ssp, start, end)
        return log.read_entries(
            int(start), int(end), max_records, self._bytes(max_records), self._committed
        )

    def skipped_through(self, ssp: SystemStreamPartition) -> str | None:
        """After an empty read: how far from its start the offsets hold no record and never
        will (before the next record, or before the offset the next append gets: offsets a
        repair removed, or compaction), and, read-committed, past an aborted range the read
        began in (below the committed end and the read's end)."""
        if ssp not in self._last:
            return None
        start, end = self._last[ssp]
        log = self._s.log(ssp.stream, ssp.partition)
        through = log.empty_through(start, end)
        if self._committed:
            readable, bound = log.committed_bounds(start, end)
            through = max(through, min(readable, bound) - 1)
        return str(through) if through >= start else None

    def _bytes(self, max_records: int | None) -> int | None:
        return None if max_records is None else self._max_bytes


class FileLogProducer(SystemProducer):
    def __init__(self, streams: _Streams, buffer_bytes: int) -> None:
        self._s = streams
        self._limit = buffer_bytes
        self._buffered = 0
        self._pending: dict[tuple[str, int], list[RecordFields]] = {}

    def _batch(self, stream: str, partition: int) -> list[RecordFields]:
        key = (stream, partition)
        batch = self._pending.get(key)
        if batch is None:
            self._s.log(stream, partition)  # validates stream and partition now
            batch = self._pending[key] = []
        return batch

    def send(self, stream: str, partition: int, record: Record) -> None:
        self.send_fields(stream, partition, record)

    def send_fields(self, stream: str, partition: int, fields: RecordFields) -> None:
        # the task API's per-message path: one dict lookup, _batch only for a new partition
        batch = self._pending.get((stream, partition))
        if batch is None:
            batch = self._batch(stream, partition)
        batch.append(fields)  # a plain tuple, which the garbage collector stops tracking
        self._buffered += len(fields[1] or b"") + len(fields[2] or b"") + 32
        if self._buffered >= self._limit:
            self.flush()

    def send_many(self, stream: str, partition: int, records: Iterable[Record]) -> None:
        self.send_fields_many(stream, partition, list(records))

    def send_fields_many(self, stream: str, partition: int, fields: Sequence[RecordFields]) -> None:
        batch = self._batch(stream, partition)
        start = len(batch)
        batch.extend(fields)
        self._buffered += sum(len(k or b"") + len(v or b"") + 32 for _, k, v, _ in batch[start:])
        if self._buffered >= self._limit:
            self.flush()

    def send_entries(
        self,
        stream: str,
        partition: int,
        keys: Sequence[bytes],
        values: Sequence[bytes | None],
        timestamp: int,
    ) -> None:
        # a changelog drain: plain tuples made and sized in C, not a record and a Python-level
        # size term each (docs/performance.md, "Re-sharding state")
        check_entries(keys, values)
        batch = self._batch(stream, partition)
        batch.extend(zip(repeat(""), keys, values, repeat(timestamp)))
        self._buffered += sum(map(len, keys)) + sum(map(len, filter(None, values))) + 32 * len(keys)
        if self._buffered >= self._limit:
            self.flush()

    def flush(self) -> None:
        pending, self._pending, self._buffered = self._pending, {}, 0
        for (stream, partition), records in pending.items():
            if records:
                self._s.log(stream, partition).append(records)


class FileLogStaging(OutputStaging):
    """Exactly-once output of one filelog root (:mod:`sparkpoint.system.filelog.staging`)."""

    def __init__(self, streams: _Streams, buffer_bytes: int) -> None:
        self._s = streams
        self._limit = buffer_bytes

    def producer(self, owner: str, part: str) -> FileLogStagingProducer:
        return FileLogStagingProducer(self._s.log, owner, part, self._limit)

    def publish(
        self,
        stream: str,
        partition: int,
        owner: str,
        key: int,
        parts: Sequence[str],
        failpoints: Mapping[str, str] | None = None,
    ) -> int:
        return publishing.publish(self._s.log(stream, partition), owner, key, parts, failpoints)

    def streams(self) -> list[str]:
        return self._s.list()

    def staged(self, stream: str) -> list[StagedPart]:
        return [
            p
            for partition in range(self._s.partitions(stream))
            for p in staging.staged_parts(self._s.log(stream, partition), stream, partition)
        ]

    def read_part(self, stream: str, partition: int, owner: str, part: str) -> list[Record]:
        return publishing.read_part(self._s.log(stream, partition), owner, part)

    def published_key(self, stream: str, partition: int, owner: str) -> int | None:
        return publishing.published_key(self._s.log(stream, partition), owner)

    def publishers(self, stream: str, partition: int) -> list[str]:
        return publishing.publishers(self._s.log(stream, partition))

    def sweep(self, stream: str, owner_prefix: str, keep: Collection[str] = ()) -> Counter[str]:
        swept: Counter[str] = Counter()
        for partition in range(self._s.partitions(stream)):
            swept.update(staging.sweep(self._s.log(stream, partition), owner_prefix, keep))
        return swept


class FileLogSystemFactory(SystemFactory):
    """``systems.<name>.factory: filelog``."""

    config_keys = (
        ConfigKey(
            "systems.<s>.path",
            None,
            "a directory path",
            "filelog: where its streams live (default <job.data.dir>/streams/<s>; every "
            "worker must see the same directory)",
        ),
        ConfigKey(
            "systems.<s>.producer.buffer.bytes",
            "4194304",
            "an integer >= 1",
            "filelog: bytes a producer buffers per partition before it appends them",
        ),
        READ_MAX_BYTES,
        ISOLATION_LEVEL,
    )

    def _streams(self, system: str, config: Mapping[str, str]) -> _Streams:
        return _Streams(system, root_for(system, config))

    def get_admin(self, system: str, config: Mapping[str, str]) -> FileLogAdmin:
        return FileLogAdmin(self._streams(system, config), _buffer_bytes(system, config))

    def get_consumer(self, system: str, config: Mapping[str, str]) -> FileLogConsumer:
        return FileLogConsumer(
            self._streams(system, config),
            read_max_bytes(system, config),
            committed=isolation_committed(system, config),
        )

    def get_producer(self, system: str, config: Mapping[str, str]) -> FileLogProducer:
        return FileLogProducer(self._streams(system, config), _buffer_bytes(system, config))


def _buffer_bytes(system: str, config: Mapping[str, str]) -> int:
    return int(config.get(f"systems.{system}.producer.buffer.bytes") or 4 * 1024 * 1024)
