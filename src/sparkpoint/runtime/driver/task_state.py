"""What the driver knows of each task between batches (:class:`TaskState`), and the questions
the loop asks of all of them together (:class:`DriverTasks`): where each SSP resumes, how far
the next batch reads, each task's lag, each task's plan.

Nothing here writes: the coordinator applies a batch's results and writes checkpoints
(:mod:`.coordinator`), the loop decides (:mod:`.decider`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.offsets import check_in_range
from sparkpoint.config import Config
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskModel
from sparkpoint.model.clock import fixed_ms, wall_ms
from sparkpoint.runtime.plan import Commits, Reads, StartState, TaskBatchPlan
from sparkpoint.storage.state_id import StateId
from sparkpoint.system.base import PartitionMetadata
from sparkpoint.system.registry import Systems
from sparkpoint.system.retention import earliest


@dataclass
class TaskState:
    """What the driver knows about one task between batches."""

    model: TaskModel
    last_checkpoint: Checkpoint | None
    expected_state_id: StateId
    resume: dict[SystemStreamPartition, str]
    last_processed: dict[SystemStreamPartition, str]
    from_checkpoint: dict[SystemStreamPartition, str]
    checkpoint_last_processed: dict[SystemStreamPartition, str]
    processed: int = 0
    lag: int = 0
    # SSPs started from a startpoint; its fan-out entry goes once a checkpoint covers the SSP
    startpoints: set[SystemStreamPartition] = field(default_factory=set)
    # exactly-once: output staged since the last written checkpoint (storage.outputs)
    pending_outputs: dict[str, list[str]] = field(default_factory=dict)


def lag_of(cmp: Callable[[str, str], int], nxt: str, upcoming: str) -> int:
    """Messages between ``nxt`` and ``upcoming`` (numeric offsets; else 1 when behind)."""
    try:
        return max(0, int(upcoming) - int(nxt))
    except ValueError:
        return 1 if cmp(nxt, upcoming) < 0 else 0


def parts_of(pending: Mapping[str, Sequence[str]]) -> set[str]:
    """Every staged part named by a task's pending outputs."""
    return {p for parts in pending.values() for p in parts}


class DriverTasks(dict[str, TaskState]):
    """Every task's :class:`TaskState` by task name, and what the loop asks of them all."""

    def __init__(self, config: Config, systems: Systems) -> None:
        super().__init__()
        self.config = config
        self.systems = systems
        #: each input stream's lag in a job of stages (:attr:`BatchReport.stages`)
        self.stage_lags: list[tuple[str, str, int]] = []

    def cmp(self, ssp: SystemStreamPartition, a: str, b: str) -> int:
        return self.systems.admin(ssp.system).offset_comparator(a, b)

    def ssps(self) -> Iterator[tuple[TaskState, SystemStreamPartition]]:
        """Every (task, SSP it reads), a broadcast SSP once per task reading it."""
        for ts in self.values():
            for s in ts.model.ssps:
                yield ts, s

    def resumes(self) -> dict[SystemStreamPartition, str]:
        """Where each SSP resumes: the ends of a batch that reads nothing."""
        return {s: ts.resume[s] for ts, s in self.ssps()}

    def checkpointed(self) -> dict[SystemStreamPartition, str]:
        """Each SSP's offset the job reads next after its checkpoints (and the startpoints it
        applied): the smallest over its tasks (each task reading a broadcast SSP has its own).
        A logged batch that read past it is one some task's checkpoint does not cover: a
        pipeline applies new startpoints only once no such batch is left, and what it logs
        after one was read from it."""
        return earliest([ts.from_checkpoint for ts in self.values()], self.cmp)

    def behind(self, end: Mapping[SystemStreamPartition, str]) -> set[SystemStreamPartition]:
        """The SSPs some task has not read up to ``end``."""
        return {s for ts, s in self.ssps() if self.cmp(s, ts.resume[s], end[s]) < 0}

    def replay_ends(
        self, logged: Mapping[SystemStreamPartition, str]
    ) -> dict[SystemStreamPartition, str]:
        """A logged batch's ends; an SSP already past it (its checkpoint covers the batch)
        reads nothing."""
        out = {}
        for ts, s in self.ssps():
            e = logged.get(s, ts.resume[s])
            out[s] = e if self.cmp(s, ts.resume[s], e) < 0 else ts.resume[s]
        return out

    def bounded(self, end: Mapping[SystemStreamPartition, str]) -> dict[SystemStreamPartition, str]:
        """Ends at most ``task.batch.max.messages`` past each SSP's next offset (numeric
        offsets; others read to ``end``)."""
        limit = self.config.get_int("task.batch.max.messages")
        out = dict(end)
        for ts, s in self.ssps():
            with contextlib.suppress(ValueError):
                out[s] = str(min(int(end[s]), int(ts.resume[s]) + limit))
        return out

    def reads_all(self, goal: Mapping[SystemStreamPartition, str], limit: int) -> bool:
        """Whether one batch reads every SSP up to ``goal``: at most ``limit`` messages
        (``task.batch.max.messages``) left in each (numeric offsets; else unknown: no)."""
        for ts, s in self.ssps():
            try:
                if int(goal[s]) - int(ts.resume[s]) > limit:
                    return False
            except ValueError:
                return False
        return True

    def check_resume_offsets(self, meta: Mapping[SystemStreamPartition, PartitionMetadata]) -> None:
        """Stop before a batch that would skip input: every task resumes each SSP inside what
        its partition holds (a stream recreated or truncated under the running job is not
        waited for)."""
        for ts, ssp in self.ssps():
            admin = self.systems.admin(ssp.system)
            check_in_range(admin, ts.model.name, ssp, ts.resume[ssp], meta[ssp])

    def lags(self, meta: Mapping[SystemStreamPartition, PartitionMetadata]) -> dict[str, int]:
        """Each task's lag (messages of its inputs not read yet); also each input stream's,
        for a job of stages (:attr:`stage_lags`)."""
        lags = {}
        later = self.config.intermediate_streams
        streams: dict[SystemStream, int] = {}  # a job of stages only
        for name, ts in self.items():
            total = 0
            for ssp in ts.model.ssps:
                cmp = self.systems.admin(ssp.system).offset_comparator
                lag = lag_of(cmp, ts.resume[ssp], meta[ssp].upcoming)
                total += lag
                if later:
                    streams[ssp.system_stream] = streams.get(ssp.system_stream, 0) + lag
            ts.lag = total
            lags[name] = total
        if later:
            roles = [("input", s) for s in self.config.inputs if s not in later]
            roles += [("intermediate", s) for s in later]
            self.stage_lags = [(r, str(s), streams[s]) for r, s in roles if s in streams]
        return lags

    def waiting_outputs(self) -> bool:
        """Whether some task holds output staged since its last written checkpoint."""
        return any(ts.pending_outputs for ts in self.values())

    def plans(
        self,
        run_id: str,
        batch: int,
        end: Mapping[SystemStreamPartition, str],
        commits: Commits,
        *,
        locations: Mapping[str, str],
        offers: Mapping[str, tuple[tuple[str, str], ...]],
        global_tables: Mapping[str, str] | None = None,
    ) -> list[TaskBatchPlan]:
        """Every task's plan for one batch (``run_id``: the lineage the tasks see;
        ``global_tables``: the version of each the tasks see)."""
        max_messages = self.config.get_int("task.batch.max.messages")
        values = self.config.to_dict()
        clock = fixed_ms()
        driver_wall = wall_ms()
        return [
            TaskBatchPlan(
                config=values,
                run_id=run_id,
                batch=batch,
                task=ts.model,
                reads=Reads(
                    resume=dict(ts.resume),
                    last_processed=dict(ts.last_processed),
                    end={s: end[s] for s in ts.model.ssps},
                    max_messages=max_messages,
                ),
                start=StartState(
                    expected=ts.expected_state_id,
                    checkpoint=ts.last_checkpoint.dumps() if ts.last_checkpoint else None,
                    from_checkpoint=dict(ts.from_checkpoint),
                    checkpoint_last_processed=dict(ts.checkpoint_last_processed),
                    standbys=offers.get(ts.model.name.name, ()),
                ),
                commits=commits,
                task_count=len(self),
                location=locations.get(ts.model.name.name),
                clock_ms=clock,
                driver_wall_ms=driver_wall,
                pending_outputs={k: list(v) for k, v in ts.pending_outputs.items()},
                global_tables=dict(global_tables or {}),
            )
            for ts in self.values()
        ]
