"""One task's storage, batch after batch, with no driver and no Spark (issue 70).

:class:`TaskCycle` takes the steps an executor takes around
:class:`~sparkpoint.storage.task_storage.TaskStorage` (open the stores at the state the last
batch left, write to them, run the commit sequence, close them with the new state), and plays
the little of the driver that storage relies on: it remembers the state each batch leaves and
the last written checkpoint, and writes a finished commit only when it builds on that
checkpoint (the driver's rule, ``sparkpoint.runtime.driver.commits.writable``).

Batch ``n`` writes known values (:func:`state_after`) and reports offset ``n`` of each input
partition, so what a checkpoint restores can be checked against the offsets it holds
(:meth:`TaskCycle.assert_committed_state_matches_its_offsets`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV2
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.model import TaskModel, TaskName
from sparkpoint.storage.backend import backend_factory, store_backends, v1_changelog_offsets
from sparkpoint.storage.state_id import EMPTY, CommittedState, StateId, UncommittedState
from sparkpoint.storage.task_storage import CommitReport, TaskStorage
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model

STORE = "user-counts"


def writes_of(batch: int) -> dict[str, int]:
    """What batch ``batch`` writes to :data:`STORE`: a key of its own, and a running total."""
    return {f"batch-{batch:04d}": batch, "total": batch * (batch + 1) // 2}


def state_after(batches: int) -> dict[str, int]:
    """:data:`STORE` after ``batches`` batches."""
    state: dict[str, int] = {}
    for n in range(1, batches + 1):
        state.update(writes_of(n))
    return state


class TaskCycle:
    """Batches of one task's storage; see the module docstring."""

    def __init__(self, config: Config, task: str = "Partition 0", *, run_id: str = "run-1") -> None:
        self.config = config
        self.systems = Systems(config)
        self.run_id = run_id
        self.checkpoints = CheckpointManager(config, self.systems)
        self.checkpoints.create_resources()
        model = job_model(config, self.systems)
        self.model: TaskModel = model.task(task)
        for name in {n for s in config.stores for n in store_backends(config, s, "backup")}:
            backend_factory(name).admin(config, model, self.systems).create_resources()
        #: the last written checkpoint (in the form the job reads, V1 or V2)
        self.last: Checkpoint | None = self.checkpoints.read_last_checkpoint(TaskName(task))
        last = self.last
        #: the state the stores hold after the last batch, as the driver expects it
        self.state: StateId = EMPTY if last is None else CommittedState(str(last.checkpoint_id))
        #: batches run, by this cycle and the checkpoint it started from
        self.batches = 0 if last is None else self.offset_of(last)
        self.restored = False  # whether the last batch restored its stores
        self.sources: set[str] = set()  # where its restore took each store from

    def offset_of(self, checkpoint: Checkpoint) -> int:
        offsets = {o for s, o in checkpoint.input_offsets.items() if s in self.model.ssps}
        assert len(offsets) == 1, checkpoint
        return int(offsets.pop())

    def storage(self) -> TaskStorage:
        return TaskStorage(
            self.config, self.systems, self.model, run_id=self.run_id, last_checkpoint=self.last
        )

    def open(self) -> TaskStorage:
        """The task's storage opened at the state the last batch left (restored if the stores
        do not hold it)."""
        storage = self.storage()
        self.restored = not storage.open(self.state)
        self.sources = {r.source for r in storage.restored}
        return storage

    def batch(
        self,
        *,
        commit: bool = True,
        wait: bool = False,
        writes: Iterable[tuple[str, Any]] | None = None,
    ) -> CommitReport:
        """One batch: open, put ``writes`` in order (default :func:`writes_of` the batch), commit
        when ``commit``, close with the new state, and write each finished commit built on
        the last written checkpoint. A failure closes the stores without a state, as a failed
        batch does (the next one restores the last checkpoint)."""
        self.batches += 1
        storage = self.open()
        try:
            store = storage.stores()[STORE]
            for key, value in writes_of(self.batches).items() if writes is None else writes:
                store.put(key, value)
            offsets = {ssp: str(self.batches) for ssp in self.model.ssps}
            report = storage.commit(offsets, due=commit, wait=wait)
        except BaseException:
            storage.close()
            self.batches -= 1
            self.state = UncommittedState(self.run_id, -1)  # matches no stores: restore
            raise
        self.state = report.state_id(uncommitted=UncommittedState(self.run_id, self.batches))
        storage.close(self.state)
        for record in report.completed:
            checkpoint = CheckpointV2.from_json(record.checkpoint)
            if record.base == (None if self.last is None else str(self.last.checkpoint_id)):
                self.write(checkpoint)
        return report

    def clean_up(self) -> None:
        """A batch that only cleans up after the last written checkpoint: no input, no commit,
        and the stores keep their state."""
        storage = self.storage()
        storage.open(self.state, lazily=True)
        try:
            storage.commit({}, due=False, wait=False)
        except BaseException:
            storage.close()
            raise
        storage.close(self.state)

    def write(self, checkpoint: CheckpointV2) -> None:
        markers = checkpoint.state_checkpoint_markers
        self.checkpoints.write_checkpoint(
            self.model.name,
            checkpoint,
            changelog_offsets=v1_changelog_offsets(self.config, markers),
        )
        self.last = checkpoint

    def contents(self) -> dict[str, int]:
        """:data:`STORE` as the next batch would open it (after a restore, if it restores)."""
        storage = self.open()
        try:
            return dict(storage.stores()[STORE].all())
        finally:
            storage.close(self.state if not self.restored else None)

    def assert_committed_state_matches_its_offsets(self) -> int:
        """A new task restoring the last written checkpoint holds exactly the state of the
        batches its offsets cover; returns that offset."""
        assert self.last is not None, "no checkpoint was written"
        fresh = TaskCycle(self.config, self.model.name.name, run_id=self.run_id + "-check")
        fresh.state = UncommittedState(fresh.run_id, 0)  # no local state matches: restore
        contents = fresh.contents()
        assert fresh.restored
        offset = self.offset_of(self.last)
        assert contents == state_after(offset), (offset, contents)
        return offset
