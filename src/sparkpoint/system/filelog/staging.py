"""Exactly-once output on the filelog: records staged beside a partition, published at commit.

A task that runs with ``job.processing.guarantee: exactly-once`` never appends its output to a
partition's log. It *stages* each batch's records for that partition in a file of its own,
``<partition>/staged/<owner>/<part>.log`` (written under a temporary name, fsynced, then
renamed: a staged part is whole or absent). Nobody reads staged records. When the checkpoint
that covers the input they came from is written, the parts it names are *published*: appended
to the log in one append, in order, under the partition's lock. Parts the checkpoint does not
name (a batch that failed, a task attempt that lost, a run that crashed before its commit) are
never published; they are discarded.

A publish must happen once, and whole:

* ``PUBLISHED`` (JSON, per partition) keeps the key of the last commit published per owner.
  Commit keys grow per owner (they come from checkpoint ids), so a publish whose key is not
  above the owner's is already done: publishing again (after a crash, from a restarted task,
  or from the driver's start) does nothing.
* ``PUBLISHING`` names the owner, key, parts and first offset of the publish running. It is
  written (and fsynced) before the append and removed after ``PUBLISHED`` says the commit is
  published. Readers stop before its first offset (:meth:`PartitionLog.publishing_from`), so
  nobody reads part of a transaction. A publisher that died leaves it behind: whoever takes
  the partition's lock next finishes the publish (:func:`finish_interrupted`): it appends the
  records the dead one had not (from the staged files, which are deleted only once
  ``PUBLISHED`` says they went out), so nothing is cut from the log and no offset changes.

Records get their offsets at publish; a staged file holds them numbered from 0.

Beside each part, ``<part>.idx`` holds its records' index entries (as the log's index) and a
trailer: the CRC-32 of the part's bytes and of the entries. A publish that finds both whole
takes the records' positions from it and checks the part with that one checksum instead of one
per record (a re-keyed job publishes every record it re-keys: this halves the publish's work).
A part without it, or whose checksum does not match, is checked record by record as before,
so a damaged part is still named and nothing of it is published.

Owns writing and sweeping a partition's staged parts (:class:`FileLogStagingProducer`,
:func:`sweep`); the publish, with its ``PUBLISHED`` and ``PUBLISHING`` files, is
:mod:`sparkpoint.system.filelog.publishing`, below both this module and the partition log.
Imports only the filelog's format, publishing and partition modules, the system interfaces and
the failpoints.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint.fsutil import fsync_dir
from sparkpoint.system.base import Record, RecordFields
from sparkpoint.system.filelog import format as fmt
from sparkpoint.system.filelog.partition import PartitionLog
from sparkpoint.system.filelog.publishing import (
    INDEX,
    STAGED,
    TRAILER,
    index_path,
    part_path,
    staged_dir,
)
from sparkpoint.system.staging import StagedPart, StagingProducer, check_name, swept_by

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)


def staged_parts(plog: PartitionLog, stream: str, partition: int) -> list[StagedPart]:
    """Every whole staged part of this partition with its record count (a part being written
    is not listed). A part is deleted once published: each one listed waits for its commit,
    or for the next start of its job to discard it."""
    root = plog.path / STAGED
    out: list[StagedPart] = []
    if not root.is_dir():
        return out
    for owner_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(owner_dir.glob("*.log")):
            try:
                count = fmt.count_records(f.read_bytes())
            except FileNotFoundError:
                continue  # published (and deleted) since it was listed
            out.append(StagedPart(stream, partition, owner_dir.name, f.stem, count))
    return out


def sweep(plog: PartitionLog, owner_prefix: str, keep: Collection[str] = ()) -> Counter[str]:
    """Delete the staged parts and temporary files of the owners ``owner_prefix`` names
    (``job.``: every owner under it; otherwise that one), but the parts named in ``keep``;
    returns the parts deleted, by owner."""
    root = plog.path / STAGED
    parts: Counter[str] = Counter()
    if not root.is_dir():
        return parts
    for owner_dir in root.iterdir():
        if not swept_by(owner_dir.name, owner_prefix) or not owner_dir.is_dir():
            continue
        for f in owner_dir.iterdir():
            if f.suffix in (".log", INDEX) and f.stem in keep:
                continue
            if f.suffix == ".log":
                parts[owner_dir.name] += 1
            f.unlink(missing_ok=True)
    return parts


@dataclass
class _Pending:
    plog: PartitionLog
    tmp: Path
    records: list[RecordFields]
    written: int = 0  # records
    size: int = 0  # bytes
    crc: int = 0  # CRC-32 of those bytes
    entries_crc: int = 0  # CRC-32 of their index entries, written beside (``index_tmp``)
    max_ts: int = fmt.MIN_TIMESTAMP

    @property
    def index_tmp(self) -> Path:
        return self.tmp.with_name(self.tmp.name + INDEX)


class FileLogStagingProducer(StagingProducer):
    """Stages one task attempt's batch output (``owner``, ``part``) beside each partition it
    sends to. :meth:`flush` makes what was sent durable in temporary files; :meth:`stage`
    makes them the staged parts (nothing is visible to readers either way)."""

    def __init__(
        self,
        log_of: Callable[[str, int], PartitionLog],
        owner: str,
        part: str,
        buffer_bytes: int,
    ) -> None:
        self._log_of = log_of
        self.owner = check_name("owner", owner)
        self.part = check_name("part", part)
        self._limit = buffer_bytes
        self._buffered = 0
        self._pending: dict[tuple[str, int], _Pending] = {}

    def _target(self, stream: str, partition: int) -> _Pending:
        target = self._pending.get((stream, partition))
        if target is None:
            plog = self._log_of(stream, partition)
            folder = staged_dir(plog, self.owner)
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{self.part}.{uuid.uuid4().hex[:12]}.tmp"
            target = self._pending[(stream, partition)] = _Pending(plog, tmp, [])
        return target

    def send(self, stream: str, partition: int, record: Record) -> None:
        self.send_fields(stream, partition, record)

    def send_fields(self, stream: str, partition: int, fields: RecordFields) -> None:
        # runs once per record staged (a re-keyed one, say): no method call when it can help
        target = self._pending.get((stream, partition)) or self._target(stream, partition)
        target.records.append(fields)  # kept as it is: a plain tuple
        self._buffered += len(fields[1] or b"") + len(fields[2] or b"") + 32
        if self._buffered >= self._limit:
            self.flush()

    def send_many(self, stream: str, partition: int, records: Iterable[Record]) -> None:
        self.send_fields_many(stream, partition, list(records))

    def send_fields_many(self, stream: str, partition: int, fields: Sequence[RecordFields]) -> None:
        target = self._target(stream, partition)
        start = len(target.records)
        target.records.extend(fields)
        self._buffered += sum(
            len(k or b"") + len(v or b"") + 32 for _, k, v, _ in target.records[start:]
        )
        if self._buffered >= self._limit:
            self.flush()

    def flush(self) -> None:
        for target in self._pending.values():
            if not target.records:
                continue
            data, index, n = fmt.encode_many(
                target.written, target.records, target.size, target.max_ts
            )
            with open(target.tmp, "ab") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with open(target.index_tmp, "ab") as f:  # synced once, when the part is staged
                f.write(index)
            target.written += n
            target.size += len(data)
            target.crc = fmt.crc32(data, target.crc)
            target.entries_crc = fmt.crc32(index, target.entries_crc)
            target.max_ts = fmt.INDEX.unpack_from(index, len(index) - fmt.INDEX_SIZE)[2]
            target.records = []
        self._buffered = 0

    def stage(self) -> dict[tuple[str, int], str]:
        self.flush()
        staged: dict[tuple[str, int], str] = {}
        for (stream, partition), target in self._pending.items():
            if target.written == 0:
                continue
            with open(target.index_tmp, "ab") as f:
                f.write(TRAILER.pack(target.crc, target.entries_crc))
                f.flush()
                os.fsync(f.fileno())
            # the index first, so a part rarely lands without it (a crash between the renames
            # or before the directory's sync can leave either alone: a part alone is checked by
            # its headers; an index alone is never read, and the next sweep deletes it)
            os.replace(target.index_tmp, index_path(target.plog, self.owner, self.part))
            os.replace(target.tmp, part_path(target.plog, self.owner, self.part))
            fsync_dir(target.tmp.parent)
            staged[(stream, partition)] = self.part
        self._pending = {}
        return staged

    def close(self) -> None:
        """Drop what was not staged (a batch that failed): its temporary files go."""
        for target in self._pending.values():
            target.tmp.unlink(missing_ok=True)
            target.index_tmp.unlink(missing_ok=True)
        self._pending = {}
