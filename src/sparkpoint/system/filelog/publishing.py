"""The filelog's publish protocol: staged exactly-once output appended to a partition once
and whole (:func:`publish`), and a publish a crash interrupted finished by whoever takes the
partition's lock next (:func:`finish_interrupted`).

Owns a partition's ``PUBLISHING`` (the publish running: owner, key, parts, first offset) and
``PUBLISHED`` (each owner's last published commit) files, and the layout of its ``staged/``
folder. It sits below both the partition log (:mod:`.partition`, which finishes an interrupted
publish under its lock and stops readers before ``PUBLISHING``'s first offset) and the staging
(:mod:`.staging`, which writes the parts): the partition log is known here only as the type of
what is published to. Imports the filelog's format, the system interfaces and the failpoints.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint.errors import CorruptRecordError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.fsutil import atomic_write, fsync_dir
from sparkpoint.system.filelog import format as fmt
from sparkpoint.system.filelog.files import PUBLISHING
from sparkpoint.system.record import Record

if TYPE_CHECKING:  # the partition log imports this module (it finishes interrupted publishes)
    from sparkpoint.system.filelog.partition import PartitionLog

log = logging.getLogger(__name__)

PUBLISHED = "PUBLISHED"
STAGED = "staged"
#: a part's index beside it: its entries, then :data:`TRAILER` (CRC-32 of the part, of the
#: entries)
INDEX = ".idx"
TRAILER = struct.Struct(">II")


def staged_dir(plog: PartitionLog, owner: str) -> Path:
    return plog.path / STAGED / owner


def part_path(plog: PartitionLog, owner: str, part: str) -> Path:
    return staged_dir(plog, owner) / f"{part}.log"


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


def index_path(plog: PartitionLog, owner: str, part: str) -> Path:
    return staged_dir(plog, owner) / f"{part}{INDEX}"


def _part_index(plog: PartitionLog, owner: str, part: str, data: bytes) -> bytes | None:
    """The index entries beside a staged part when they and the part (``data``) are whole:
    both checksums in its trailer match. ``None`` otherwise (a part staged without one, or
    damaged): the publish then checks the part record by record."""
    try:
        raw = index_path(plog, owner, part).read_bytes()
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
    path = part_path(plog, owner, part)
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
    path = part_path(plog, owner, part)
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
        if any(part_path(plog, owner, p).exists() for p in parts):
            log.warning(
                "%s: not publishing %s's commit %d: commit %d of it went out already (its "
                "staged parts are deleted; a job reset while its output stream was kept, with "
                "a clock behind the last run's?)",
                plog.label,
                owner,
                key,
                done[owner],
            )
        delete_parts(plog, owner, parts)
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
    delete_parts(plog, owner, parts)


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
        delete_parts(plog, owner, parts)
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


def delete_parts(plog: PartitionLog, owner: str, parts: Iterable[str]) -> None:
    for part in parts:
        part_path(plog, owner, part).unlink(missing_ok=True)
        index_path(plog, owner, part).unlink(missing_ok=True)
