"""Which version of each global table (:mod:`sparkpoint.system.tables.global_tables`) a batch
sees, and its record in the tasks' checkpoints, so that input read again after a crash is joined
with the version it was first joined with.

Every task sees one version of a table at a time (:attr:`GlobalTableVersions.current`, in each
plan). The driver reads each source at the start and then every ``tables.<t>.refresh.ms``; a
new version is snapshotted at once, but the tasks move to it only at a commit that every task
completes in one batch, having read nothing past it (the decider makes such a batch: it
commits and waits for its uploads). Each checkpoint the driver writes carries, under the
marker :data:`MARKER`, the versions the input after it is joined with: the old ones, or the new
ones when the batch moves to them. So a restart reads its versions from the checkpoints (every
task's agree) and a replay joins exactly as the first run did.

A run that ends cleanly has read nothing past its last checkpoints; it says so in the
coordinator stream (namespace :data:`NAMESPACE`, with those checkpoints' ids), and the next
start moves the tasks to the newest versions at once, recording there (before any batch) which
versions the input after those checkpoints is joined with.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV2
from sparkpoint.config import Config
from sparkpoint.errors import CheckpointError
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.model import TaskName
from sparkpoint.runtime.driver.task_state import TaskState
from sparkpoint.system.registry import Systems
from sparkpoint.system.tables.global_tables import (
    GlobalTableSpec,
    Source,
    global_table_names,
    materialize,
    snapshot_path,
    source_of,
)

log = logging.getLogger(__name__)

#: the checkpoint marker of the global tables' versions: ``{table: version}``
MARKER = "sparkpoint.global-tables"
#: the coordinator stream's namespace of :class:`AfterCheckpoints`, under the key ``after``
NAMESPACE = "global-tables"


def checkpoint_ids(checkpoints: Mapping[TaskName, Checkpoint | None]) -> dict[str, str]:
    return {str(t): str(c.checkpoint_id) for t, c in sorted(checkpoints.items()) if c is not None}


def recorded_versions(checkpoint: Checkpoint | None) -> Mapping[str, str]:
    """The global tables' versions ``checkpoint`` records (none: an empty mapping)."""
    if not isinstance(checkpoint, CheckpointV2):
        return {}
    return checkpoint.state_checkpoint_markers.get(MARKER, {})


def read_nothing_past(ts: TaskState) -> bool:
    """Whether the task has processed nothing past its last queued checkpoint."""
    return ts.checkpoint_last_processed == {
        s: o for s, o in ts.last_processed.items() if s in ts.model.ssps
    }


class GlobalTableVersions:
    """The driver's global tables: their sources, the versions the tasks see, and the newest."""

    def __init__(
        self, config: Config, systems: Systems, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.systems = systems
        self.clock = clock
        self.specs = {n: GlobalTableSpec.of(config, n) for n in global_table_names(config)}
        self._sources: dict[str, Source] = {}
        #: the versions every task sees now
        self.current: dict[str, str] = {}
        #: the newest version of each table, snapshotted
        self.latest: dict[str, str] = {}
        self._read_at: dict[str, float] = {}

    def _read(self, name: str) -> str:
        source = self._sources.get(name)
        if source is None:
            source = self._sources[name] = source_of(self.config, self.systems, self.specs[name])
        self._read_at[name] = self.clock()
        version = materialize(self.config, source, name)
        if version != self.latest.get(name):
            log.info("global table %s: version %s", name, version)
        self.latest[name] = version
        return version

    def start(
        self, checkpoints: Mapping[TaskName, Checkpoint | None], store: MetadataStore
    ) -> None:
        """Read every source; the tasks see the versions their checkpoints record (a table
        they do not record yet: its newest version), or, after a clean stop at those
        checkpoints, the newest versions."""
        if not self.specs:
            return
        ids = checkpoint_ids(checkpoints)
        after = json.loads(store.get(NAMESPACE, "after") or "{}")
        # a start that moved to new versions at once: a task whose checkpoint is still the
        # one it moved at read its input after it with those versions, whatever its marker
        moved_at = {} if after.get("clean", True) else after.get("checkpoints", {})
        self._from_checkpoints(checkpoints, moved_at, after.get("versions", {}))
        if after.get("clean") and after.get("checkpoints") == ids:
            self.current = dict(self.latest)
            # before any batch reads past those checkpoints with them
            record = {"checkpoints": ids, "versions": self.current, "clean": False}
            store.put(NAMESPACE, "after", json.dumps(record))

    def stopped_cleanly(
        self, checkpoints: Mapping[TaskName, Checkpoint | None], store: MetadataStore
    ) -> None:
        """The run ends having read nothing past ``checkpoints``: the next start may move the
        tasks to new versions at once."""
        if self.specs:
            record = {"checkpoints": checkpoint_ids(checkpoints), "versions": self.current}
            store.put(NAMESPACE, "after", json.dumps({**record, "clean": True}))

    def _from_checkpoints(
        self,
        checkpoints: Mapping[TaskName, Checkpoint | None],
        moved_at: Mapping[str, str],
        moved_to: Mapping[str, str],
    ) -> None:
        for name in self.specs:
            self._read(name)
            seen: dict[TaskName, str] = {}
            for task, c in checkpoints.items():
                version = recorded_versions(c).get(name)
                at = moved_at.get(str(task))
                if c is not None and at == str(c.checkpoint_id) and name in moved_to:
                    version = moved_to[name]
                if version is not None:
                    seen[task] = version
            versions = set(seen.values())
            if len(versions) > 1:
                raise CheckpointError(
                    f"global table {name}: the tasks' checkpoints record different versions "
                    f"({', '.join(f'{t}: {v}' for t, v in sorted(seen.items()))}), which a "
                    "driver never writes: reset the job's checkpoints or restore them"
                )
            version = versions.pop() if versions else self.latest[name]
            path = snapshot_path(self.config, name, version)
            if not path.exists():
                raise CheckpointError(
                    f"global table {name}: the checkpoints' version {version} has no snapshot "
                    f"({path} is missing): restore it, or reset the job's checkpoints"
                )
            self.current[name] = version

    def refresh(self, *, now: bool = False) -> bool:
        """Read the sources whose refresh is due (``now``: every one); whether a table has a
        version the tasks do not see yet."""
        at = self.clock()
        for name, spec in self.specs.items():
            due = spec.refresh_ms > 0 and (at - self._read_at.get(name, 0.0)) * 1000 >= (
                spec.refresh_ms
            )
            if due or now:
                self._read(name)
        return self.current != self.latest

    def mark(
        self, queued: Sequence[tuple[TaskState, CheckpointV2]], tasks: int
    ) -> tuple[list[CheckpointV2], dict[str, str]]:
        """The checkpoints of one append with the versions the input after them is joined
        with, and those versions: the newest when the append holds a checkpoint of every one
        of the job's ``tasks`` and none read past its own, else the current ones."""
        if not self.specs:
            return [c for _, c in queued], {}
        moves = (
            self.current != self.latest
            and len({ts.model.name for ts, _ in queued}) == tasks
            and all(read_nothing_past(ts) for ts, _ in queued)
        )
        versions = dict(self.latest if moves else self.current)
        last = {ts.model.name: i for i, (ts, _) in enumerate(queued)}
        marked = []
        for i, (ts, checkpoint) in enumerate(queued):
            # a task's earlier checkpoint of the append: the input after it saw the current
            mark = versions if last[ts.model.name] == i else dict(self.current)
            markers = {**checkpoint.state_checkpoint_markers, MARKER: mark}
            marked.append(dataclasses.replace(checkpoint, state_checkpoint_markers=markers))
        return marked, versions

    def written(self, versions: Mapping[str, str]) -> None:
        """An append :meth:`mark` marked is written: the tasks see its versions from now."""
        if versions and versions != self.current:
            log.info(
                "global tables: the tasks see %s from this commit on",
                ", ".join(f"{n} {v}" for n, v in sorted(versions.items())),
            )
            self.current = dict(versions)
