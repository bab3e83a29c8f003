"""Startpoints in the metadata store: written by tools, fanned out per task by the coordinator.

Namespace ``samza-startpoint-v1`` holds startpoints as written, keyed ``system.stream.partition``
(every task that reads the SSP) or ``system.stream.partition.<task name>`` (one task; for
broadcast inputs). At job start the coordinator *fans out*: for each task and SSP it takes the
newest of the two kinds (the SSP+task one on a tie), writes the task's startpoints under its name in
``samza-startpoint-v1-fan-out``, then deletes the originals it used. A fan-out entry is removed
per SSP once a checkpoint covers it, so a restart before that commit applies it again.
Startpoints older than ``task.startpoint.max.age.ms`` (default 12 h) are ignored with a WARNING.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping

from sparkpoint.metadata.base import MetadataStore
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.model.startpoint import InvalidStartpoint, Startpoint, StartpointSpecific

log = logging.getLogger(__name__)

NAMESPACE = "samza-startpoint-v1"
FAN_OUT = "samza-startpoint-v1-fan-out"
APPLY_NOW = "samza-startpoint-v1-apply-now"
DEFAULT_MAX_AGE_MS = 12 * 3600 * 1000


def key_for(ssp: SystemStreamPartition, task: TaskName | None = None) -> str:
    return str(ssp) if task is None else f"{ssp}.{task.name}"


class StartpointManager:
    """Reads and writes startpoints; not thread-safe."""

    def __init__(self, store: MetadataStore, *, max_age_ms: int = DEFAULT_MAX_AGE_MS) -> None:
        self.store = store
        self.max_age_ms = max_age_ms

    # -- the read-write namespace
    def write_startpoint(
        self, ssp: SystemStreamPartition, startpoint: Startpoint, task: TaskName | None = None
    ) -> None:
        self.store.put(NAMESPACE, key_for(ssp, task), startpoint.dumps())

    def write_many(
        self, entries: Iterable[tuple[SystemStreamPartition, TaskName | None, Startpoint]]
    ) -> None:
        """Write several startpoints in one durable append."""
        self.store.put_all(NAMESPACE, {key_for(s, t): sp.dumps() for s, t, sp in entries})

    def _fresh(self, where: str, startpoint: Startpoint, now: int) -> bool:
        age = now - startpoint.creation_timestamp
        if age > self.max_age_ms:
            log.warning(
                "ignoring stale startpoint %s for %s: %d ms old (max %d)",
                startpoint.describe(),
                where,
                age,
                self.max_age_ms,
            )
            return False
        return True

    def read_startpoint(
        self, ssp: SystemStreamPartition, task: TaskName | None = None
    ) -> Startpoint | None:
        self.store.refresh()
        raw = self.store.get(NAMESPACE, key_for(ssp, task))
        if raw is None:
            return None
        sp = Startpoint.loads(raw)
        return sp if self._fresh(key_for(ssp, task), sp, int(time.time() * 1000)) else None

    def delete_startpoint(self, ssp: SystemStreamPartition, task: TaskName | None = None) -> None:
        self.store.delete(NAMESPACE, key_for(ssp, task))

    def all_startpoints(self) -> dict[str, Startpoint]:
        """Every startpoint not yet fanned out, by key."""
        self.store.refresh()
        return {k: Startpoint.loads(v) for k, v in self.store.all(NAMESPACE).items()}

    def waiting(self) -> bool:
        """Whether a startpoint waits to be fanned out (read only)."""
        self.store.refresh()
        return bool(self.store.all(NAMESPACE))

    # -- fan-out
    def fan_out(
        self, tasks: Mapping[TaskName, Iterable[SystemStreamPartition]]
    ) -> dict[TaskName, dict[SystemStreamPartition, Startpoint]]:
        """Fan startpoints out to tasks (newest of SSP-only and SSP+task wins), then delete them.

        As in Samza's ``StartpointManager.fanOut``, a task with new startpoints gets a new
        fan-out that replaces its earlier one (an entry of an earlier start not yet covered by
        a checkpoint is dropped); a task with none keeps its earlier fan-out. Returns every
        task's fan-out, including those left by an earlier start.
        """
        self.store.refresh()
        written = self.store.all(NAMESPACE)
        now = int(time.time() * 1000)
        used: set[str] = set()
        updates: dict[str, str | None] = {}
        result: dict[TaskName, dict[SystemStreamPartition, Startpoint]] = {}
        for task, ssps in tasks.items():
            current: dict[SystemStreamPartition, Startpoint] = {}
            for ssp in ssps:
                candidates = []
                for key in (key_for(ssp), key_for(ssp, task)):
                    if key in written:
                        used.add(key)
                        sp = Startpoint.loads(written[key])
                        if self._fresh(key, sp, now):
                            candidates.append(sp)
                if candidates:
                    current[ssp] = _precedence(candidates)
            if current:
                result[task] = current
                updates[task.name] = dump_fan_out(current)
            elif earlier := self.get_fan_out_for_task(task):
                result[task] = earlier
        if updates:
            self.store.put_all(FAN_OUT, updates)
        if used:
            self.store.put_all(NAMESPACE, dict.fromkeys(used))
        return result

    def get_fan_out_for_task(self, task: TaskName) -> dict[SystemStreamPartition, Startpoint]:
        raw = self.store.get(FAN_OUT, task.name)
        if raw is None:
            return {}
        return load_fan_out(raw, task)

    def pin_fan_out(self, task: TaskName, resolved: Mapping[SystemStreamPartition, str]) -> None:
        """Keep the offsets ``task``'s fanned-out startpoints resolved to, as specific ones (of
        the same creation time): a fan-out stays until a checkpoint covers its SSP, so a start
        before one applies it again, and an ``upcoming`` or ``oldest`` resolved again then
        would skip what was written in between."""
        current = self.get_fan_out_for_task(task)
        pinned: dict[SystemStreamPartition, Startpoint] = {}
        for ssp, offset in resolved.items():
            if ssp in current:
                created = current[ssp].creation_timestamp
                kept = StartpointSpecific(offset, creation_timestamp=created)
                if kept != current[ssp]:
                    pinned[ssp] = kept
        if pinned:
            self.store.put_all(FAN_OUT, {task.name: dump_fan_out({**current, **pinned})})

    def remove_fan_out_for_task(
        self, task: TaskName, ssps: Iterable[SystemStreamPartition] | None = None
    ) -> None:
        """Remove the task's fanned-out startpoints (only ``ssps`` if given). Idempotent."""
        current = self.get_fan_out_for_task(task)
        if ssps is not None:
            for ssp in ssps:
                current.pop(ssp, None)
        else:
            current = {}
        self.store.put_all(FAN_OUT, {task.name: dump_fan_out(current) if current else None})

    def delete_all(self) -> int:
        """Delete every waiting startpoint and every fan-out; returns how many startpoints."""
        self.store.refresh()
        waiting = self.store.all(NAMESPACE)
        fan_outs = self.store.all(FAN_OUT)
        count = len(waiting) + sum(len(self.get_fan_out_for_task(TaskName(t))) for t in fan_outs)
        if waiting:
            self.store.put_all(NAMESPACE, dict.fromkeys(waiting))
        if fan_outs:
            self.store.put_all(FAN_OUT, dict.fromkeys(fan_outs))
        return count

    # -- apply while running
    def request_apply_now(self) -> None:
        """Ask a running job to fan out and apply startpoints at its next batch boundary."""
        self.store.put(APPLY_NOW, "request", str(int(time.time() * 1000)))

    def take_apply_now_request(self) -> bool:
        """Whether a request is pending (and clear it)."""
        self.store.refresh()
        if self.store.get(APPLY_NOW, "request") is None:
            return False
        self.store.delete(APPLY_NOW, "request")
        return True


def dump_fan_out(fan_out: Mapping[SystemStreamPartition, Startpoint]) -> str:
    """Samza's StartpointFanOutPerTask JSON: ``{"timestamp": ms, "fanOuts": {ssp: sp}}``."""
    return json.dumps(
        {
            "timestamp": int(time.time() * 1000),
            "fanOuts": {str(s): sp.to_json() for s, sp in sorted(fan_out.items())},
        },
        separators=(",", ":"),
    )


def load_fan_out(raw: str, task: TaskName) -> dict[SystemStreamPartition, Startpoint]:
    """A task's fan-out, in Samza's form or the bare map earlier sparkpoint versions wrote."""
    try:
        data = json.loads(raw)
        entries = data.get("fanOuts", data)
        return {SystemStreamPartition.parse(k): Startpoint.from_json(v) for k, v in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidStartpoint(f"task {task}: invalid startpoint fan-out {raw!r}: {exc}") from exc


def _precedence(candidates: list[Startpoint]) -> Startpoint:
    """Of an SSP-only and an SSP+task startpoint (in that order), the newer one; on equal
    creation times the SSP+task one, which is the more specific (Samza's rule)."""
    best = candidates[0]
    for sp in candidates[1:]:
        if sp.creation_timestamp >= best.creation_timestamp:
            best = sp
    return best
