"""What the driver sends a task for one micro-batch, and what the task sends back.

Both are plain, picklable values. A task's local state is identified by a *state id*
(:mod:`sparkpoint.storage.state_id`). The driver remembers which state id each task should
have; a task whose local marker says anything else throws its live state away and restores the
last checkpoint, then reads from the checkpoint's offsets, so state and offsets always agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV1, CheckpointV2
from sparkpoint.metadata.locality import Executor
from sparkpoint.model import SystemStreamPartition, TaskModel
from sparkpoint.storage.backend import RestoreStats
from sparkpoint.storage.state_id import StateId, UncommittedState


def parse_checkpoint(text: str) -> Checkpoint:
    """A checkpoint of either version from its JSON."""
    data = json.loads(text)
    parser = CheckpointV1 if isinstance(data, dict) and data.get("version") == 1 else CheckpointV2
    return parser.from_json(data)


@dataclass(frozen=True)
class TaskBatchPlan:
    """One task's work in one micro-batch.

    Offsets in ``resume`` and ``from_checkpoint`` are the *next* offsets to read (inclusive);
    ``end`` is exclusive. ``last_checkpoint_id`` is the committed checkpoint (or ``None``).
    """

    config: dict[str, str]
    run_id: str
    batch: int
    task: TaskModel
    expected_state_id: StateId
    resume: dict[SystemStreamPartition, str]
    from_checkpoint: dict[SystemStreamPartition, str]
    checkpoint_last_processed: dict[SystemStreamPartition, str]
    last_processed: dict[SystemStreamPartition, str]
    end: dict[SystemStreamPartition, str]
    max_messages: int
    last_checkpoint: str | None  # the committed checkpoint's JSON (V1 or V2)
    commit: bool
    window: bool
    wait_for_uploads: bool = False
    task_count: int = 1
    location: str | None = None  # the preferred executor (host affinity), if any
    #: read nothing and run no user code, only clean up after the last checkpoint (the pass
    #: after a run's final commit): the stores keep the state id they have
    clean_up_only: bool = False

    @property
    def last_checkpoint_id(self) -> str | None:
        if self.last_checkpoint is None:
            return None
        return str(parse_checkpoint(self.last_checkpoint).checkpoint_id)

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
    state_bytes: dict[str, int] = field(default_factory=dict)  # per persistent store, on disk
