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

Owns the ``staged/``, ``PUBLISHED`` and ``PUBLISHING`` files of a partition; imports only the
filelog's format and partition modules, the system interfaces and the failpoints.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint.errors import CorruptRecordError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.fsutil import atomic_write, fsync_dir
from sparkpoint.system.base import Record, RecordFields
from sparkpoint.system.filelog import format as fmt
from sparkpoint.system.filelog.partition import PUBLISHING, PartitionLog
from sparkpoint.system.staging import StagedPart, StagingProducer, check_name, swept_by

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)

PUBLISHED = "PUBLISHED"
STAGED = "staged"
#: a part's index beside it: its entries, then :data:`TRAILER` (CRC-32 of the part, of the
#: entries)
INDEX = ".idx"
TRAILER = struct.Struct(">II")


def _staged_dir(plog: PartitionLog, owner: str) -> Path:
    return plog.path / STAGED / owner


def _part_path(plog: PartitionLog, owner: str, part: str) -> Path:
    return _staged_dir(plog, owner) / f"{part}.log"


def _published(plog: PartitionLog) -> dict[str, int]:
    try:
        data = json.loads((plog.path / PUBLISHED).read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError:
        raise CorruptRecordError(
            f"{plog.label}: {plog.path / PUBLISHED} is damaged; it holds the last published "
            f"commit of each owner of staged output (without it a publish could repeat)"
        ) from None
    return {str(k): int(v) for k, v in data.items()}


def published_key(plog: PartitionLog, owner: str) -> int | None:
    """The key of the last commit of ``owner`` published to this partition, if any."""
    return _published(plog).get(owner)


def publishers(plog: PartitionLog) -> list[str]:
    """Every owner that published to this partition, by name."""
    return sorted(_published(plog))


def _index_path(plog: PartitionLog, owner: str, part: str) -> Path:
    return _staged_dir(plog, owner) / f"{part}{INDEX}"


def _part_index(plog: PartitionLog, owner: str, part: str, data: bytes) -> bytes | None:
    """The index entries beside a staged part when they and the part (``data``) are whole:
    both checksums in its trailer match. ``None`` otherwise (a part staged without one, or
    damaged): the publish then checks the part record by record."""
    try:
        raw = _index_path(plog, owner, part).read_bytes()
    except FileNotFoundError:
        return None
    entries = raw[: -TRAILER.size]
    if len(raw) < TRAILER.size or len(entries) % fmt.INDEX_SIZE:
        return None
    part_crc, entries_crc = TRAILER.unpack_from(raw, len(entries))
    if fmt.crc32(entries) != entries_crc or fmt.crc32(data) != part_crc:
        return None
    return entries


def _part_bytes(plog: PartitionLog, owner: str, part: str) -> bytes:
    """A staged part's file, or :class:`CorruptRecordError`."""
    path = _part_path(plog, owner, part)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CorruptRecordError(
            f"{plog.label}: staged output {owner}/{part} is missing, though a written "
            f"checkpoint names it: its records cannot be published (was {path.parent} "
            f"deleted by hand?)"
        ) from None


def read_part(plog: PartitionLog, owner: str, part: str) -> list[Record]:
    """The records of a staged part (offsets from 0), or :class:`CorruptRecordError`."""
    data = _part_bytes(plog, owner, part)
    path = _part_path(plog, owner, part)
    try:
        return fmt.decode_span(data, list(range(fmt.count_records(data))))
    except fmt.FormatError as exc:
        raise CorruptRecordError(
            f"{plog.label}: staged output {path} is damaged at byte {exc.position} ({exc.reason})"
        ) from None


def publish(
    plog: PartitionLog,
    owner: str,
    key: int,
    parts: Sequence[str],
    failpoints: Mapping[str, str] | None = None,
) -> int:
    """Append the staged ``parts`` of ``owner``'s commit ``key`` to the log, once and whole;
    returns how many records went out now (0 when that commit was published already).
    ``failpoints``: a config whose ``testing.crash.*`` keys may crash it half-way
    (:data:`sparkpoint.failpoints.PUBLISH_POINTS`)."""
    with plog.locked():  # finishes a publish a crash interrupted first
        return _publish_locked(plog, owner, key, list(parts), failpoints or {})


def _publish_locked(
    plog: PartitionLog, owner: str, key: int, parts: list[str], failpoints: Mapping[str, str]
) -> int:
    done = _published(plog)
    if done.get(owner, -1) >= key:
        if any(_part_path(plog, owner, p).exists() for p in parts):
            log.warning(
                "%s: not publishing %s's commit %d: commit %d of it went out already (its "
                "staged parts are deleted; a job reset while its output stream was kept, with "
                "a clock behind the last run's?)",
                plog.label,
                owner,
                key,
                done[owner],
            )
        _delete_parts(plog, owner, parts)
        return 0
    from sparkpoint.system.filelog import columnar  # numpy: only where it runs

    datas = [_part_bytes(plog, owner, part) for part in parts]
    indexes = [_part_index(plog, owner, p, data) for p, data in zip(parts, datas, strict=True)]
    try:  # every record checked before anything is written: a damaged part publishes nothing
        staged = columnar.check_staged(datas, indexes)
    except fmt.FormatError:
        for part in parts:
            read_part(plog, owner, part)  # raises the error naming the damaged part
        raise
    first = plog.next_offset_locked()
    intent = {"owner": owner, "key": key, "parts": parts, "first": first}
    atomic_write(plog.path / PUBLISHING, json.dumps(intent).encode())
    maybe_crash(failpoints, "publish-after-intent")
    if len(staged):  # renumbered in their bytes, not decoded and encoded again
        plog.append_staged_locked(staged)
    maybe_crash(failpoints, "publish-after-append")
    _published_now(plog, done, owner, key, parts)
    return len(staged)


def _published_now(
    plog: PartitionLog, done: dict[str, int], owner: str, key: int, parts: list[str]
) -> None:
    """The commit's records are all in the log: say so, end the publish, drop its parts."""
    done[owner] = key
    atomic_write(plog.path / PUBLISHED, json.dumps(done, sort_keys=True).encode())
    (plog.path / PUBLISHING).unlink()
    fsync_dir(plog.path)
    _delete_parts(plog, owner, parts)


def finish_interrupted(plog: PartitionLog) -> None:
    """Finish the publish ``PUBLISHING`` names, whose publisher died (under the lock): append
    what it had not appended yet (what it had is a prefix of the same staged records, since
    nobody appends before this runs), unless ``PUBLISHED`` says it went out."""
    path = plog.path / PUBLISHING
    try:
        intent = json.loads(path.read_bytes())
        owner, key, parts, first = (
            str(intent["owner"]),
            int(intent["key"]),
            [str(p) for p in intent["parts"]],
            int(intent["first"]),
        )
    except FileNotFoundError:
        return
    except (ValueError, KeyError, TypeError):
        raise CorruptRecordError(
            f"{plog.label}: {path} is damaged; it names a publish of staged output that did "
            f"not finish"
        ) from None
    done = _published(plog)
    if done.get(owner, -1) >= key:
        path.unlink()
        fsync_dir(plog.path)
        _delete_parts(plog, owner, parts)
        return
    records = [r for part in parts for r in read_part(plog, owner, part)]
    have = plog.next_offset_locked() - first  # the tail recovered: whole records only
    if not 0 <= have <= len(records):
        raise CorruptRecordError(
            f"{plog.label}: {path} names a publish of {len(records)} records from offset "
            f"{first}, but the log holds {have} after it: it was changed by hand"
        )
    log.warning(
        "%s: finishing the publish of %s's commit %d that stopped half-way (%d of %d records "
        "were appended)",
        plog.label,
        owner,
        key,
        have,
        len(records),
    )
    if have < len(records):
        plog.append_locked(records[have:])
    _published_now(plog, done, owner, key, parts)


def _delete_parts(plog: PartitionLog, owner: str, parts: Iterable[str]) -> None:
    for part in parts:
        _part_path(plog, owner, part).unlink(missing_ok=True)
        _index_path(plog, owner, part).unlink(missing_ok=True)


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
            folder = _staged_dir(plog, self.owner)
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
            os.replace(target.index_tmp, _index_path(target.plog, self.owner, self.part))
            os.replace(target.tmp, _part_path(target.plog, self.owner, self.part))
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
