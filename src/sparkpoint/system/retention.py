"""Retention for streams whose system does not apply it itself (the embedded log): the stream
properties ``retention.ms`` and ``retention.bytes`` (Kafka's topic-config names, set with
``streams.<s>.<property>`` or ``systems.<s>.default.stream.<property>``) drop a partition's
oldest records, never past what a job that reads the stream has committed.

What a system applies itself (Kafka: its broker, from the same topic configs) is left to it:
its admin's ``retention_start`` answers ``None``. Compacted streams (changelogs, tables) are
never trimmed: compaction, not age, bounds them.

The protection: ``protect`` maps each partition a job reads to the offset it reads next after
its last checkpoint (everything before it is committed; :func:`protected` makes it: the
:func:`earliest` over the job's tasks, and a partition no checkpoint covers kept whole). Retention
stops there, and says how many records it held back and for which job. ``force`` deletes
them anyway, with an ERROR naming the job, the partition and the offsets it loses.

May import config, errors and the system interfaces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.system.base import SystemAdmin
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

#: the stream properties (Kafka's topic-config names); -1 or unset: no limit
PROPERTIES = ("retention.ms", "retention.bytes")


@dataclass(frozen=True)
class Retention:
    """A stream's limits: records older than ``ms``, and those past the newest ``bytes``."""

    ms: int | None
    bytes: int | None


@dataclass(frozen=True)
class Trimmed:
    """What retention did to one partition."""

    ssp: SystemStreamPartition
    dropped: int  # records deleted
    held_back: int  # offsets retention would delete that the job has not committed
    oldest: str  # the partition's oldest offset now


def retention_of(config: Config, stream: SystemStream) -> Retention | None:
    """The configured retention of ``stream``; ``None`` without one."""
    props = config.stream_properties(stream)
    limits: list[int | None] = []
    for name in PROPERTIES:
        raw = props.get(name)
        try:
            value = None if raw is None else int(raw)
        except ValueError:
            value = -2
        if value is not None and value < -1:
            raise ConfigError(
                f"streams.{stream.stream}.{name}={raw!r} is invalid: give an integer >= 0 "
                "(milliseconds or bytes), or -1 for no limit"
            )
        limits.append(None if value is None or value == -1 else value)
    if limits == [None, None]:
        return None
    return Retention(limits[0], limits[1])


def earliest(
    reads: Iterable[Mapping[SystemStreamPartition, str]],
    compare: Callable[[SystemStreamPartition, str, str], int],
) -> dict[SystemStreamPartition, str]:
    """Each SSP's smallest offset over ``reads`` (one map per task: a broadcast partition has
    one offset per task that reads it), by ``compare(ssp, a, b)``."""
    out: dict[SystemStreamPartition, str] = {}
    for offsets in reads:
        for ssp, offset in offsets.items():
            if ssp not in out or compare(ssp, offset, out[ssp]) < 0:
                out[ssp] = offset
    return out


def protected(
    admin: SystemAdmin, stream: SystemStream, committed: Mapping[SystemStreamPartition, str]
) -> dict[SystemStreamPartition, str]:
    """What retention must keep of ``stream``, a stream a job reads: each partition from the
    offset ``committed`` names (the job reads it next after its checkpoints: the
    :func:`earliest` over its tasks), and a partition it does not name whole, from its oldest
    offset (the job has not read it yet, e.g. one just added: nothing of it is committed)."""
    ssps = [
        SystemStreamPartition(stream.system, stream.stream, p)
        for p in range(admin.partition_count(stream.stream))
    ]
    keep = {ssp: committed[ssp] for ssp in ssps if ssp in committed}
    missing = [ssp for ssp in ssps if ssp not in keep]
    if missing:
        keep.update({ssp: meta.oldest for ssp, meta in admin.get_metadata(missing).items()})
    return keep


def trim(
    config: Config,
    systems: Systems,
    streams: Iterable[SystemStream],
    protect: Mapping[SystemStreamPartition, str],
    *,
    job: str,
    force: bool = False,
    now_ms: int | None = None,
) -> list[Trimmed]:
    """Apply the configured retention of ``streams`` now (see the module docstring); what it
    did to each partition it trimmed or held back."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    out: list[Trimmed] = []
    for stream in streams:
        retention = retention_of(config, stream)
        admin = systems.admin(stream.system)
        if retention is None or admin.compacted(stream.stream):
            continue
        for partition in range(admin.partition_count(stream.stream)):
            ssp = SystemStreamPartition(stream.system, stream.stream, partition)
            cut = admin.retention_start(ssp, retention.ms, retention.bytes, now)
            if cut is None:
                break  # the system applies retention itself
            oldest = admin.get_metadata([ssp])[ssp].oldest
            keep_from = protect.get(ssp)
            held = 0
            if keep_from is not None and admin.offset_comparator(cut, keep_from) > 0:
                held = max(0, int(cut) - int(keep_from)) if cut.isdigit() else 0
                if force:
                    log.error(
                        "retention of %s: deleting offsets from %s up to %s, which job %s "
                        "has not committed (--force): its next run cannot read them",
                        ssp,
                        keep_from,
                        cut,
                        job,
                    )
                    held = 0
                else:
                    cut = keep_from
            dropped = 0
            if admin.offset_comparator(oldest, cut) < 0:
                dropped = admin.delete_records_before(stream.stream, partition, cut)
            if dropped or held:
                out.append(Trimmed(ssp, dropped, held, admin.get_metadata([ssp])[ssp].oldest))
    return out


__all__ = ["PROPERTIES", "Retention", "Trimmed", "earliest", "protected", "retention_of", "trim"]
