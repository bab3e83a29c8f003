"""Re-sharding a job's keyed state when its inputs gain partitions: where each store entry goes,
and the record that makes a reshard all or nothing.

**Where an entry goes.** A task is an input partition number, and a store entry belongs to the
task whose partition its input key maps to (the input system's own partitioner: crc32 on the
filelog, murmur2 on Kafka). :func:`key_route` finds that input key in a raw store key, by the
store's ``stores.<s>.reshard.key``: ``key`` (the store's key is the message key), ``window``
(the window and join layout of :mod:`sparkpoint.storage.windows`), or a function of the raw
key. In the timer store (``task.timers.store``) the same setting applies to the key inside each
timer entry. Some entries belong to the task, not to a key (:data:`TASK_ENTRY`): a TTL store's
format entry, a timer store's watermark and event-time entries. They stay where they are; a
task that is new gets the smallest value of the old tasks its keys come from
(:func:`new_task_entries`): the earliest of their watermarks, so no timer fires early and no
window they closed opens again.

**All or nothing.** The offline command (:mod:`sparkpoint.tools.reshard`) writes each task's new
state through its backends as a commit that nothing references yet, then one record in the
metadata store (:class:`ReshardRecord`, the commit point) with everything the job needs to
adopt it: the new checkpoints, the new tasks' changelog partitions, where their new input
partitions start (their oldest offset: everything in them was written after the growth), and
the new partition counts. :func:`finish_pending` then rolls that record forward; it runs again
at every job start and every reshard until the record is gone, so a crash at any point leaves
either the old state and checkpoints (before the record) or a record that is finished later.

May import storage's own modules and everything below it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.metadata.coordinator_stream import SET_CHANGELOG
from sparkpoint.metadata.job_state import INPUT_PARTITIONS
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.model.startpoint import StartpointOldest
from sparkpoint.refs import load_reference
from sparkpoint.startpoint.manager import FAN_OUT, dump_fan_out
from sparkpoint.storage.backend import v1_changelog_offsets
from sparkpoint.storage.kv import ttl
from sparkpoint.storage.timers import BY_KEY, TIME, TIMER, WATERMARK, split_owned
from sparkpoint.storage.windows import split_entry_key
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

#: metadata namespace of a reshard under way (key ``pending``: a :class:`ReshardRecord`)
RESHARD = "reshard"
PENDING = "pending"
#: metadata namespace: input stream -> JSON of its growth by ``stream add-partitions``
GROWTH = "input-growth"

#: :func:`key_route`'s answer for an entry of the task rather than of a key
TASK_ENTRY = None

Route = Callable[[bytes], bytes | None]


def _function(config: Config, store: str, path: str) -> Route:
    hint = "name a function module:function on the Python path"
    fn = load_reference(path, f"stores.{store}.reshard.key={path!r}", hint=hint)

    def route(raw: bytes) -> bytes | None:
        out = fn(raw)
        if out is None or isinstance(out, bytes):
            return out
        if isinstance(out, str):
            return out.encode()
        raise UserError(
            f"store {store}: stores.{store}.reshard.key function {path} returned "
            f"{type(out).__name__} for key {raw!r}; it must return bytes, str or None"
        )

    return route


def _window_key(raw: bytes) -> bytes:
    try:
        return split_entry_key(raw)[0]
    except Exception as exc:  # struct.error, IndexError: not the window layout
        raise ValueError(f"not a window store key: {exc}") from exc


def key_route(config: Config, store: str) -> Route:
    """The function from a raw key of ``store`` to the message key it belongs to (the bytes the
    input's producers partition by), or :data:`TASK_ENTRY`."""
    setting = config.get_str(f"stores.{store}.reshard.key") or "key"
    inner: Route
    if setting == "key":
        inner = bytes
    elif setting == "window":
        inner = _window_key
    else:
        inner = _function(config, store, setting)
    timers = config.get_str("task.timers.store") == store
    skip = len(TIMER) + 1 + TIME.size

    def timer_key(key: bytes) -> bytes | None:
        owned = split_owned(key)  # a window or join store's timer: its window's key
        return inner(key) if owned is None else _window_key(owned[1])

    def route(raw: bytes) -> bytes | None:
        if raw == ttl.FORMAT_KEY:  # also left by a TTL removed since
            return TASK_ENTRY
        if not timers:
            return inner(raw)
        if raw.startswith(TIMER):
            return timer_key(raw[skip:])
        if raw.startswith(BY_KEY):
            return timer_key(raw[len(BY_KEY) :])
        return TASK_ENTRY  # event time: per partition (W), the task's watermark (M, S)

    return route


def input_keys(config: Config, store: str) -> Callable[[Sequence[bytes]], Sequence[bytes | None]]:
    """:func:`key_route` over a chunk of raw keys (the keys themselves, without a call per key,
    for a plain store). A key not of the store's layout is an error naming it."""
    setting = config.get_str(f"stores.{store}.reshard.key") or "key"
    if setting == "key" and config.get_str("task.timers.store") != store:
        reserved = ttl.FORMAT_KEY

        def plain(keys: Sequence[bytes]) -> Sequence[bytes | None]:
            if reserved not in keys:  # the usual chunk: the keys as they are, no step per key
                return keys
            return [TASK_ENTRY if k == reserved else k for k in keys]

        return plain
    route = key_route(config, store)

    def routed(keys: Sequence[bytes]) -> list[bytes | None]:
        out = []
        for key in keys:
            try:
                out.append(route(key))
            except ValueError as exc:
                raise UserError(
                    f"store {store}: key {key[:60]!r} is not of the layout stores.{store}."
                    f"reshard.key={setting} reads ({exc}); nothing was changed. Set it to the "
                    f"store's layout (key, window, or a function module:function)"
                ) from exc
        return out

    return routed


def source_tasks(partition: int, old: int, new: int) -> list[int]:
    """The old tasks whose keys a task may get when a modulo partitioner goes from ``old`` to
    ``new`` partitions: a key of hash ``h`` leaves ``h % old`` for ``h % new``, so those with
    the partition's residue modulo ``gcd(old, new)`` (one task when ``new`` is a multiple of
    ``old``: ``partition % old``)."""
    g = math.gcd(old, new)
    return [q for q in range(old) if q % g == partition % g]


def new_task_entries(
    store: str, config: Config, sources: Sequence[Mapping[bytes, bytes]]
) -> dict[bytes, bytes]:
    """The task entries a new task of the reshard starts with, from those of the old tasks its
    keys come from (:func:`source_tasks`; an input partition's event time belongs to that
    partition's task and is not taken): of each, the smallest value (a TTL store's format,
    the same in all). A timer store's watermark and tracking start are the earliest of those
    tasks', none when one of them had none: its keys' windows it closed stay closed (not a
    later task's, whose records would then be late; not an earlier one's, which would open
    them again), and no timer fires early."""
    out: dict[bytes, bytes] = {}
    timers = config.get_str("task.timers.store") == store

    def order(value: bytes) -> tuple[int, bytes]:
        # a timer store's times are signed (a watermark below 0: event times under the
        # lateness), which their bytes do not sort as
        return (TIME.unpack(value)[0], b"") if timers and len(value) == TIME.size else (0, value)

    for entries in sources:
        for key, value in entries.items():
            if timers and key.startswith(WATERMARK):
                continue
            if key not in out or order(value) < order(out[key]):
                out[key] = value
    if timers:  # a time some source task has not is none at all (nothing closed by it yet)
        for key in [k for k in out if not all(k in entries for entries in sources)]:
            del out[key]
    return out


@dataclass
class ReshardRecord:
    """A reshard's commit point: what :func:`finish_pending` writes to adopt the new state."""

    reshard_id: str
    partitions: dict[str, int]  # grown input stream -> its new count
    old_count: int
    #: task -> its new checkpoint (V2 JSON)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: new task -> its changelog partition
    changelog: dict[str, int] = field(default_factory=dict)
    #: new task -> its input partitions that start at their oldest offset
    oldest: dict[str, list[str]] = field(default_factory=dict)

    def dumps(self) -> str:
        return json.dumps(
            {
                "id": self.reshard_id,
                "partitions": self.partitions,
                "old-count": self.old_count,
                "checkpoints": self.checkpoints,
                "changelog": self.changelog,
                "oldest": self.oldest,
            },
            sort_keys=True,
        )

    @classmethod
    def loads(cls, text: str) -> ReshardRecord:
        try:
            data = json.loads(text)
            return cls(
                str(data["id"]),
                {str(k): int(v) for k, v in data["partitions"].items()},
                int(data["old-count"]),
                dict(data["checkpoints"]),
                {str(k): int(v) for k, v in data["changelog"].items()},
                {str(k): list(v) for k, v in data["oldest"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(
                f"the metadata store's pending reshard record cannot be read ({exc}): run "
                f"sparkpoint state reshard JOB again after repairing it, or start the job's "
                f"state over (sparkpoint job reset JOB)"
            ) from exc


def pending(metadata: MetadataStore) -> ReshardRecord | None:
    """The reshard that passed its commit point and is not finished yet, if any."""
    metadata.refresh()
    raw = metadata.get(RESHARD, PENDING)
    return None if raw is None else ReshardRecord.loads(raw)


def finish_pending(
    config: Config, systems: Systems, metadata: MetadataStore
) -> ReshardRecord | None:
    """Adopt the pending reshard, if there is one: write its checkpoints, the new tasks'
    changelog partitions and starting points, the new partition counts; then remove it. Each
    step may be done again (a crash in the middle finishes at the next call)."""
    record = pending(metadata)
    if record is None:
        return None
    log.info(
        "reshard %s: adopting the state re-sharded from %d to %s partitions",
        record.reshard_id,
        record.old_count,
        ", ".join(f"{s}: {n}" for s, n in sorted(record.partitions.items())),
    )
    checkpoints = CheckpointManager(config, systems)
    try:
        for task, data in sorted(record.checkpoints.items()):
            checkpoint = CheckpointV2.from_json(data)
            offsets = v1_changelog_offsets(config, checkpoint.state_checkpoint_markers)
            checkpoints.write_checkpoint(TaskName(task), checkpoint, changelog_offsets=offsets)
            maybe_crash(config, "reshard-roll-forward")
    finally:
        checkpoints.close()
    metadata.put_all(SET_CHANGELOG, {t: str(p) for t, p in record.changelog.items()})
    fan_out = {
        task: dump_fan_out({SystemStreamPartition.parse(s): StartpointOldest() for s in ssps})
        for task, ssps in record.oldest.items()
        if ssps
    }
    if fan_out:
        metadata.put_all(FAN_OUT, dict(fan_out))
    metadata.put_all(INPUT_PARTITIONS, {s: str(n) for s, n in record.partitions.items()})
    metadata.put_all(GROWTH, dict.fromkeys(record.partitions))
    metadata.delete(RESHARD, PENDING)
    return record


def record_growth(
    metadata: MetadataStore, stream: str, before: int, upcoming: Mapping[int, str]
) -> None:
    """Remember that ``stream`` grew from ``before`` partitions, and where each of its old
    partitions ended then: what lies before those offsets was keyed by the old count."""
    value = {"from": before, "upcoming": {str(p): o for p, o in sorted(upcoming.items())}}
    metadata.put(GROWTH, stream, json.dumps(value, sort_keys=True))


def growth_of(metadata: MetadataStore, stream: str) -> dict[int, str] | None:
    """Where each old partition of ``stream`` ended when it grew (:func:`record_growth`), or
    None when the stream grew by other means."""
    raw = metadata.get(GROWTH, stream)
    if raw is None:
        return None
    try:
        return {int(p): str(o) for p, o in json.loads(raw)["upcoming"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("stream %s: unreadable growth record %r; ignoring it", stream, raw[:80])
        return None


__all__ = [
    "GROWTH",
    "TASK_ENTRY",
    "ReshardRecord",
    "finish_pending",
    "growth_of",
    "input_keys",
    "key_route",
    "new_task_entries",
    "pending",
    "record_growth",
    "source_tasks",
]
