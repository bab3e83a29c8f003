"""What the driver sends a task for one micro-batch, and what the task sends back.

Both are plain, picklable values. A task's local state is identified by a *state id*
(:mod:`sparkpoint.storage.state_id`). The driver remembers which state id each task should
have; a task whose local marker says anything else throws its live state away and restores the
last checkpoint, then reads from the checkpoint's offsets, so state and offsets always agree.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV1, CheckpointV2
from sparkpoint.metadata.locality import Executor
from sparkpoint.model import SystemStreamPartition, TaskModel
from sparkpoint.storage.backend import RestoreStats
from sparkpoint.storage.standby import CaughtUp
from sparkpoint.storage.state_id import StateId, UncommittedState


def parse_checkpoint(text: str) -> Checkpoint:
    """A checkpoint of either version from its JSON."""
    data = json.loads(text)
    parser = CheckpointV1 if isinstance(data, dict) and data.get("version") == 1 else CheckpointV2
    return parser.from_json(data)


@dataclass(frozen=True)
class Reads:
    """The offsets a task reads in one batch: from ``resume`` (the next offset per SSP,
    inclusive, when it keeps its live state; ``last_processed`` are the offsets just before
    them) up to ``end`` (exclusive), at most ``max_messages`` per SSP."""

    resume: dict[SystemStreamPartition, str]
    last_processed: dict[SystemStreamPartition, str]
    end: dict[SystemStreamPartition, str]
    max_messages: int


@dataclass(frozen=True)
class StartState:
    """The state a task must start from: ``expected`` when its live stores hold it, else the
    last checkpoint (``checkpoint``, its JSON, V1 or V2; None before any), after which it reads
    from ``from_checkpoint`` (``checkpoint_last_processed`` just before them)."""

    expected: StateId
    checkpoint: str | None
    from_checkpoint: dict[SystemStreamPartition, str]
    checkpoint_last_processed: dict[SystemStreamPartition, str]
    #: ``(executor id, checkpoint id)`` of each standby copy of the task the driver saw reach
    #: that checkpoint: a restore promotes the one on its own disk (if any)
    standbys: tuple[tuple[str, str], ...] = ()

    @property
    def checkpoint_id(self) -> str | None:
        if self.checkpoint is None:
            return None
        return str(parse_checkpoint(self.checkpoint).checkpoint_id)


@dataclass(frozen=True)
class Commits:
    """What a task commits in one batch: a commit when ``due``; ``window`` calls the task's
    ``window``; ``wait_for_uploads`` finishes the uploads before the batch returns;
    ``clean_up_only`` reads nothing and runs no user code, only cleans up after the last
    checkpoint (the pass after a run's final commit: the stores keep the state they have);
    ``end_of_input`` reads nothing and moves the task's watermark to the end of time, so that
    every event-time timer fires (``--final-watermark``: a bounded run's last windows)."""

    due: bool
    window: bool = False
    wait_for_uploads: bool = False
    clean_up_only: bool = False
    end_of_input: bool = False


@dataclass(frozen=True)
class TaskBatchPlan:
    """One task's work in one micro-batch, in three parts a reader can hold in their head: what
    it reads (:class:`Reads`), the state it starts from (:class:`StartState`) and what it
    commits (:class:`Commits`); then where it runs (``location``, the preferred executor of
    host affinity) and how many tasks share its process's commit pool (``task_count``)."""

    config: dict[str, str]
    run_id: str
    batch: int
    task: TaskModel
    reads: Reads
    start: StartState
    commits: Commits
    task_count: int = 1
    location: str | None = None
    #: the driver's processing time when it is not the wall clock (the test kit's fake clock);
    #: a DataFrame pipeline's phases, run in Spark's workers, read it
    clock_ms: int | None = None
    #: the driver's wall clock when it planned the batch: a Spark worker reads processing
    #: time as its own clock moved to the driver's (:func:`sparkpoint.model.clock.follow`)
    driver_wall_ms: int | None = None
    #: exactly-once: the output the task staged since its last written checkpoint, per SSP
    #: (``system.stream.partition``), oldest first (:mod:`sparkpoint.storage.outputs`)
    pending_outputs: dict[str, list[str]] = field(default_factory=dict)
    #: the version of each global table the task sees (``context.get_table``)
    global_tables: dict[str, str] = field(default_factory=dict)

    @property
    def batch_state_id(self) -> UncommittedState:
        """The state the stores hold after this batch when it is not committed."""
        return UncommittedState(self.run_id, self.batch)


@dataclass
class TaskBatchResult:
    """What a task did in one batch."""

    task: str
    batch: int
    state_id: StateId
    next_offsets: dict[SystemStreamPartition, str]
    last_processed: dict[SystemStreamPartition, str]
    processed: int
    sent: int
    completed_checkpoints: list[str] = field(default_factory=list)  # V2 JSON, oldest first
    # the written checkpoint each completed one was built on (its snapshot's base), same order
    completed_bases: list[str | None] = field(default_factory=list)
    upload_metrics: list[dict[str, int]] = field(default_factory=list)  # one per completed
    commit_started: str | None = None
    commit_skipped: bool = False
    restored: list[RestoreStats] = field(default_factory=list)
    commit_requested: bool = False
    shutdown_requested: bool = False
    process_seconds: float = 0.0
    commit_seconds: float = 0.0
    total_seconds: float = 0.0
    executor: str = ""  # host:pid of the Python worker
    ran_on: Executor | None = None  # the Spark executor, filled in by the runner on a cluster
    #: the executor whose standby copy of the task its restore promoted (the copy is gone)
    promoted_copy: str | None = None
    #: the tasks that ran in the same Spark partition, this one included (a group of tasks,
    #: :class:`~sparkpoint.runtime.spark.session.SparkRunner`), filled in by the runner
    group: list[str] = field(default_factory=list)
    state_bytes: dict[str, int] = field(default_factory=dict)  # per persistent store, on disk
    late: int = 0  # records behind the task's watermark (event time)
    window_late: int = 0  # window adds refused as late (their windows had all closed)
    #: records sent to the dead-letter stream (task.dlq.stream), per reason
    dead_letters: dict[str, int] = field(default_factory=dict)
    timers_fired: int = 0
    #: the task's event-time watermark after the batch (``task.timers.store``); ``None``
    #: when it has none yet, or the batch did not open that store
    watermark_ms: int | None = None
    #: exactly-once: the output staged since the last written checkpoint, this batch's too
    staged_outputs: dict[str, list[str]] = field(default_factory=dict)
    parts_staged: int = 0  # exactly-once: parts this batch staged (one per partition sent to)
    records_published: int = 0  # staged records this batch's clean-up published
    #: a DataFrame task's finish, exactly-once: the parts its dead letters were staged to, by
    #: ``system.stream.partition`` (the runner records them with the batch's other parts)
    frame_parts: list[dict[str, str]] = field(default_factory=list)
    #: the task's progress in this batch was dropped (its input is read again next batch)
    dropped: bool = False


@dataclass(frozen=True)
class StagedSink:
    """A sink's staged output of one batch (exactly-once): the sink, pickled so that the driver
    can publish it after a restart, its name for messages, and the sink's own token."""

    sink: bytes
    name: str
    token: str


@dataclass
class BatchOutputs:
    """A DataFrame batch's staged output (exactly-once): the parts staged per SSP
    (``system.stream.partition``), in the order to publish them, and the staged sinks."""

    streams: dict[str, list[str]] = field(default_factory=dict)
    sinks: list[StagedSink] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.streams or self.sinks)

    def add_parts(self, staged: dict[str, str]) -> None:
        """The parts one writer staged, by SSP."""
        for ssp, part in staged.items():
            self.streams.setdefault(ssp, []).append(part)

    def parts(self) -> set[str]:
        return {p for parts in self.streams.values() for p in parts}

    def to_json(self) -> dict[str, object]:
        sinks = [
            {"sink": base64.b64encode(s.sink).decode(), "name": s.name, "token": s.token}
            for s in self.sinks
        ]
        return {"streams": self.streams, "sinks": sinks}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> BatchOutputs:
        streams = data.get("streams") or {}
        sinks = data.get("sinks") or []
        assert isinstance(streams, dict) and isinstance(sinks, list)
        return cls(
            {str(k): [str(p) for p in v] for k, v in streams.items()},
            [StagedSink(base64.b64decode(s["sink"]), s["name"], s["token"]) for s in sinks],
        )


@dataclass(frozen=True)
class StandbyTarget:
    """One standby copy to bring to its task's last written checkpoint (``checkpoint``, JSON);
    ``at``: the checkpoint the driver saw it reach (None: seed it)."""

    task: TaskModel
    checkpoint: str
    at: str | None


@dataclass(frozen=True)
class StandbyPlan:
    """Standby work on one executor: the copies to catch up; the tasks whose copies it keeps
    (``keep``: any other copy kept for it is deleted) and the live executors' ids (copies
    kept in its state directory for any other, gone, executor are deleted)."""

    config: dict[str, str]
    executor: Executor
    copies: list[StandbyTarget]
    live: list[str]
    keep: tuple[str, ...] = ()

    @property
    def location(self) -> str:
        return self.executor.location

    def split(self, parts: int) -> list[StandbyPlan]:
        """The copies dealt into at most ``parts`` plans (one per core of the executor), to
        catch up side by side; each keeps the same copies."""
        n = max(1, min(parts, len(self.copies)))
        return [replace(self, copies=self.copies[i::n]) for i in range(n)]


@dataclass
class StandbyResult(CaughtUp):
    """What catching one standby copy up did, for the executor it is kept for (``executor``),
    where it ran (``ran_on``, filled in by the runner), and why it failed (``error``: the copy
    was deleted, unless ``busy``: another process held it, and it was left as it is)."""

    executor: str = ""
    ran_on: Executor | None = None
    error: str | None = None
    #: the copy was in use by another process and left as it is (not a failure of the copy)
    busy: bool = False
