"""The startpoint tool, as a Python API (the CLI's ``sparkpoint startpoint`` calls these).

``set_startpoints`` validates the stream, partitions, task and the startpoint itself against
the system's metadata before writing anything, and returns what each startpoint resolves to
now. Rewinding input does not rewind state: stores keep what they hold, and re-read messages
are processed again on top of it.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import DriverConflict, Heartbeat
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.model.startpoint import (
    Startpoint,
    StartpointOldest,
    StartpointSpecific,
    StartpointTimestamp,
    StartpointUpcoming,
)
from sparkpoint.startpoint.manager import FAN_OUT, NAMESPACE, StartpointManager
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model
from sparkpoint.tools.streams import read_json_lines, resolve_stream


@dataclass(frozen=True)
class PlannedStartpoint:
    ssp: SystemStreamPartition
    task: TaskName | None
    startpoint: Startpoint
    resolves_to: str
    #: what the offset was found by: "" for the startpoint's own resolution, else how (a
    #: timestamp by event time: the field, and that it is kept as that offset)
    found_by: str = ""


#: what ``--timestamp`` compares (``--by``)
EVENT_TIME, RECORD_TIME = "event-time", "record-time"


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds, or an ISO-8601 date-time (a zone-less one is taken as UTC)."""
    if re.fullmatch(r"-?\d+", text.strip()):
        return int(text)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"--timestamp {text!r}: expected epoch milliseconds or ISO-8601") from None
    if moment.tzinfo is None:
        from datetime import UTC

        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def make_startpoint(
    *,
    offset: str | None = None,
    timestamp: str | None = None,
    oldest: bool = False,
    upcoming: bool = False,
) -> Startpoint:
    given = [x for x in (offset is not None, timestamp is not None, oldest, upcoming) if x]
    if len(given) != 1:
        raise UserError("give exactly one of --offset, --timestamp, --oldest, --upcoming")
    if offset is not None:
        return StartpointSpecific(offset)
    if timestamp is not None:
        return StartpointTimestamp(parse_timestamp(timestamp))
    return StartpointOldest() if oldest else StartpointUpcoming()


FUTURE_SLACK_MS = 24 * 3600 * 1000


def _check_startpoint(ssp: SystemStreamPartition, sp: Startpoint) -> None:
    """Refuse a timestamp before 1970 or in the future (offsets: the admin's resolution)."""
    if isinstance(sp, StartpointTimestamp):
        now = int(time.time() * 1000)
        if sp.timestamp < 0 or sp.timestamp > now + FUTURE_SLACK_MS:
            raise UserError(
                f"{ssp}: --timestamp {sp.timestamp} is "
                f"{'before 1970' if sp.timestamp < 0 else 'in the future'}; give a past moment "
                f"(epoch milliseconds or ISO-8601), or --upcoming to skip to new input"
            )


def _manager(config: Config, systems: Systems) -> StartpointManager:
    store = CoordinatorStreamStore(config, systems, source="startpoint-tool")
    return StartpointManager(store, max_age_ms=config.get_int("task.startpoint.max.age.ms"))


def _targets(
    config: Config, systems: Systems, stream: str, partitions: list[int] | None, task: str | None
) -> list[tuple[SystemStreamPartition, TaskName | None]]:
    model = job_model(config, systems)
    ss = resolve_stream(config, stream)
    readers: dict[SystemStreamPartition, list[TaskName]] = {}
    for t in model.tasks.values():
        for ssp in t.ssps:
            readers.setdefault(ssp, []).append(t.name)
    mine = sorted(s for s in readers if s.system_stream == ss)
    if not mine:
        inputs = sorted({str(s.system_stream) for s in readers}) or ["none"]
        raise UserError(
            f"job {config.job_name} does not read {ss}; its inputs are {', '.join(inputs)}"
        )
    if partitions:
        valid = {s.partition for s in mine}
        bad = [p for p in partitions if p not in valid]
        if bad:
            raise UserError(
                f"{ss} has no partition {bad[0]} read by the job; partitions: "
                f"{', '.join(map(str, sorted(valid)))}"
            )
        mine = [s for s in mine if s.partition in partitions]
    if task is None:
        return [(s, None) for s in mine]
    name = TaskName(task)
    if name not in model.tasks:
        known = ", ".join(t.name.name for t in model.sorted_tasks())
        raise UserError(f"no task {task!r} in job {config.job_name}; tasks: {known}")
    chosen: list[tuple[SystemStreamPartition, TaskName | None]] = [
        (s, name) for s in mine if name in readers[s]
    ]
    if not chosen:
        raise UserError(f"task {task} does not read {ss} (partitions {partitions or 'all'})")
    return chosen


def time_basis(config: Config, stream: SystemStream, by: str | None) -> str:
    """What a timestamp startpoint on ``stream`` compares: ``by``, else its event time where
    the stream has one (``streams.<s>.event.time.field``: the time its watermark and windows
    use), else the record's timestamp."""
    field = config.get_str(f"streams.{stream.stream}.event.time.field")
    if by is None:
        return EVENT_TIME if field else RECORD_TIME
    if by not in (EVENT_TIME, RECORD_TIME):
        raise UserError(f"--by {by!r}: expected {EVENT_TIME} or {RECORD_TIME}")
    if by == EVENT_TIME and not field:
        raise UserError(
            f"--by {EVENT_TIME}: {stream} has no event time; set streams.{stream.stream}."
            f"event.time.field to the message field of milliseconds, or use --by {RECORD_TIME}"
        )
    return by


def by_event_time(
    config: Config, systems: Systems, ssp: SystemStreamPartition, timestamp: int
) -> str:
    """The offset of ``ssp``'s first record whose event time is at or after ``timestamp``
    (the partition's end when none is): read from the first record written at or after
    ``timestamp`` less ``task.watermark.lateness.ms`` (a record's event time is before it is
    written, by at most the job's declared lateness), decoded by the stream's serdes."""
    field = config.require(f"streams.{ssp.stream}.event.time.field")
    admin = systems.admin(ssp.system)
    lateness = config.get_int("task.watermark.lateness.ms")
    start = admin.offset_for_timestamp(ssp, max(timestamp - lateness, 0))
    rows = read_json_lines(config, systems, ssp.system_stream, partition=ssp.partition, start=start)
    for row in rows:
        value = row["value"]
        at = value.get(field) if isinstance(value, dict) else None
        if isinstance(at, int) and not isinstance(at, bool) and at >= timestamp:
            return str(row["offset"])
    return admin.get_committed_metadata([ssp])[ssp].upcoming


def set_startpoints(
    config: Config,
    stream: str,
    startpoint: Startpoint,
    *,
    partitions: list[int] | None = None,
    task: str | None = None,
    apply_now: bool = False,
    by: str | None = None,
) -> list[PlannedStartpoint]:
    """Validate, then write one startpoint per SSP (per SSP and task with ``task``). A
    timestamp compares event time where the stream has one (:func:`time_basis`): found now,
    and kept as the offset it found (the record timestamps a system indexes are not event
    times)."""
    systems = Systems(config)
    planned = []
    basis = None
    if isinstance(startpoint, StartpointTimestamp):
        basis = time_basis(config, resolve_stream(config, stream), by)
    elif by is not None:
        raise UserError("--by applies to --timestamp only")
    for ssp, t in _targets(config, systems, stream, partitions, task):
        _check_startpoint(ssp, startpoint)
        if basis == EVENT_TIME:
            assert isinstance(startpoint, StartpointTimestamp)
            offset = by_event_time(config, systems, ssp, startpoint.timestamp)
            field = config.get_str(f"streams.{ssp.stream}.event.time.field")
            created = startpoint.creation_timestamp
            kept = StartpointSpecific(offset, creation_timestamp=created)
            how = f"by event time (field {field!r}), kept as that offset"
            planned.append(PlannedStartpoint(ssp, t, kept, offset, how))
            continue
        offset = systems.admin(ssp.system).resolve_startpoint_to_offset(ssp, startpoint)
        how = "by record time" if basis == RECORD_TIME else ""
        planned.append(PlannedStartpoint(ssp, t, startpoint, offset, how))
    manager = _manager(config, systems)
    pinned = [p for p in planned if _pins(config, p)]
    heartbeat = None
    if pinned:  # only while no driver runs (holding the job, so none starts meanwhile)
        heartbeat = Heartbeat(config, f"startpoint-set-{uuid.uuid4().hex[:8]}")
        try:
            heartbeat.start()
        except DriverConflict:  # the running driver reads on: it resolves them when applied
            heartbeat, pinned = None, []
    try:
        manager.write_many(
            (p.ssp, p.task, _specific(p) if p in pinned else p.startpoint) for p in planned
        )
    finally:
        if heartbeat is not None:
            heartbeat.stop()
    if apply_now:
        manager.request_apply_now()
    return planned


def _pins(config: Config, planned: PlannedStartpoint) -> bool:
    """Whether to keep an ``upcoming`` startpoint on a job's own intermediate stream as the
    offset it resolves to now (what the tool prints), when the job is stopped: its next start
    publishes the re-keyed records its last checkpoints name (a crash left them) before it
    applies startpoints, and ``upcoming`` resolved after that would skip records the first
    stage sent before the startpoint was set, and never sends again. (Not while the job runs:
    it reads past that offset, and the startpoint would take it back.)"""
    return planned.ssp.system_stream in config.intermediate_streams and isinstance(
        planned.startpoint, StartpointUpcoming
    )


def _specific(planned: PlannedStartpoint) -> Startpoint:
    created = planned.startpoint.creation_timestamp
    return StartpointSpecific(planned.resolves_to, creation_timestamp=created)


def list_startpoints(config: Config) -> dict[str, dict[str, Startpoint]]:
    """Startpoints waiting to be fanned out, and those fanned out to tasks, by key."""
    systems = Systems(config)
    manager = _manager(config, systems)
    fanned: dict[str, Startpoint] = {}
    for name in manager.store.all(FAN_OUT):
        for ssp, sp in manager.get_fan_out_for_task(TaskName(name)).items():
            fanned[f"{ssp}.{name}"] = sp
    return {"waiting": manager.all_startpoints(), "fanned-out": fanned}


def delete_startpoints(
    config: Config, stream: str, *, partitions: list[int] | None = None, task: str | None = None
) -> int:
    """Delete waiting startpoints and fan-out entries for the stream; returns how many."""
    systems = Systems(config)
    manager = _manager(config, systems)
    targets = _targets(config, systems, stream, partitions, task)
    waiting = manager.store.all(NAMESPACE)
    removed = 0
    for ssp, t in targets:
        keys = [str(ssp)] if t is None else []
        keys += [
            k for k in waiting if k.startswith(f"{ssp}.") and (t is None or k == f"{ssp}.{t.name}")
        ]
        for key in keys:
            if key in waiting:
                manager.store.delete(NAMESPACE, key)
                removed += 1
    for name in manager.store.all(FAN_OUT):
        fan = manager.get_fan_out_for_task(TaskName(name))
        hit = {s for s, _ in targets if s in fan and (task is None or task == name)}
        if hit:
            manager.remove_fan_out_for_task(TaskName(name), hit)
            removed += len(hit)
    return removed


def delete_all_startpoints(config: Config) -> int:
    """Delete every waiting startpoint and every task's fan-out (Samza's deleteAllStartpoints
    and removeAllFanOuts); returns how many startpoints went."""
    manager = _manager(config, Systems(config))
    return manager.delete_all()
