"""One task's DataFrame batch as a checked state machine: where it is, and what may come next.

A DataFrame batch runs as several Spark jobs, so the work of one task is split into phases that
run in different Spark tasks (and Python workers), one after another; :mod:`.task` runs them.
Each phase loads the task's :class:`TaskPhases` for the batch from the task directory, checks
that it may run, and advances it. The phases, in the order they may run::

    new --begin--> begun --step(s)--> stepped --finish--> finished
                     |                   |                   |
                     +------drop---------+---> dropped <-----+  (a retried fused step)
                                                 |
                                                 +--finish--> finished (from the checkpoint)

* **begin** (the batch source's first computation): state is established once; later
  computations of the source in the same batch (a second output reading it again, a retried
  Spark task, even after the finish) get the same start and touch no state. ``end_read``
  records where reading stopped.
* **step**: each stateful step runs once per batch; a second run (a retried Spark task, an
  evicted cache) is refused, since store updates are not idempotent.
* **finish**: once, after every output is written. It finds the batch *here* (begun, read to
  the end, every step run in this task directory) or not (then it restores the last checkpoint,
  and the input is read again next batch). A second finish is refused, unless a retried fused
  step dropped the batch in between (then the finish restores the checkpoint).
* **drop**: a retried fused step found its step ran before: the batch's progress is dropped.
* A **clean-up only** batch is begin then finish: it runs no step.

A wrong order (a step before the batch was read here, a step after the finish, a second
finish, establishing state after the finish) fails with a :class:`PhaseError` naming task,
batch and phase. The phases keep one note each in the task directory
(:meth:`~sparkpoint.storage.local.LocalTaskState.write_note`), named by the batch they belong
to; one note per phase, not one shared file, because phases of one task may run at once in
different Python workers (a stateful step reading the batch source as it reads). A note of
another batch counts as absent.

No Spark and no stores here: this module is tested on its own (``tests/runtime/dataframe``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from sparkpoint.errors import PhaseError, TaskError
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.storage.backend import RestoreStats
from sparkpoint.storage.local import PHASE_NOTE_PREFIX, LocalTaskState

BEGUN_NOTE = PHASE_NOTE_PREFIX + "BATCH"
READ_NOTE = PHASE_NOTE_PREFIX + "READ"
DROPPED_NOTE = PHASE_NOTE_PREFIX + "DROPPED"
FINISHED_NOTE = PHASE_NOTE_PREFIX + "FINISHED"
STEP_NOTE_PREFIX = PHASE_NOTE_PREFIX + "STEP-"

Offsets = dict[SystemStreamPartition, str]


class Phase(Enum):
    NEW = "new"
    BEGUN = "begun"
    STEPPED = "stepped"
    DROPPED = "dropped"
    FINISHED = "finished"


@dataclass(frozen=True)
class Begun:
    """What the batch's first read established: where reading starts, the state it kept or
    restored."""

    start: Offsets
    last_processed: Offsets
    restored: list[RestoreStats]
    kept: bool
    watermark: int | None = None  # the task's event-time watermark as the batch began
    #: the tables' records this batch put in (before any input record), and whether the
    #: inputs wait this batch (a bootstrapping table is not read up to the batch's end yet)
    table_records: int = 0
    held: bool = False
    #: the executor whose standby copy the restore promoted (the driver takes it off its list)
    promoted_copy: str | None = None


@dataclass(frozen=True)
class ReadEnd:
    """Where the batch's read stopped: the next offsets, the last processed, how many; the
    largest event time read per input partition, and how many records were late."""

    next: Offsets
    last_processed: Offsets
    processed: int
    event_times: dict[SystemStreamPartition, int] = field(default_factory=dict)
    late: int = 0
    #: the records that could not be decoded, as dead letters (``task.dlq.stream``): the
    #: finish sends them, so a batch read twice sends them once
    dead_letters: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class WholeBatch:
    """A task's batch that ran wholly in this task directory, as the finish finds it."""

    begun: Begun
    end: ReadEnd


def _offsets(data: Mapping[str, str]) -> Offsets:
    return {SystemStreamPartition.parse(k): str(v) for k, v in data.items()}


def _texts(data: Mapping[SystemStreamPartition, str]) -> dict[str, str]:
    return {str(k): v for k, v in data.items()}


def step_note(step: str) -> str:
    return STEP_NOTE_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", step)


class TaskPhases:
    """The phases of one task's batch ``key`` (``run:batch``) in its task directory."""

    def __init__(
        self, local: LocalTaskState, task: TaskName, run_id: str, batch: int, clean_up_only: bool
    ) -> None:
        self.local = local
        self.task = task
        self.batch = batch
        self.key = f"{run_id}:{batch}"
        self.clean_up_only = clean_up_only

    # -- reading the notes
    def _note(self, name: str) -> dict[str, Any] | None:
        """The note ``name`` if it belongs to this batch."""
        note = self.local.read_note(name)
        return note if note is not None and note.get("batch") == self.key else None

    def step_started(self, step: str) -> bool:
        """Whether ``step`` has started on this task in this batch (in this directory)."""
        return self._note(step_note(step)) is not None

    def begun(self) -> Begun | None:
        """What the batch's first read established; a later computation of the batch source
        reads from it (``None``: the batch has not begun here, so :meth:`begin` it). Also after
        the finish: reading the planned messages again touches no state."""
        note = self._note(BEGUN_NOTE)
        if note is None:
            return None
        return Begun(
            start=_offsets(note["start"]),
            last_processed=_offsets(note["last_processed"]),
            restored=[RestoreStats(**r) for r in note.get("restored", [])],
            kept=bool(note.get("kept")),
            watermark=note.get("watermark"),
            table_records=int(note.get("table_records", 0)),
            held=bool(note.get("held")),
            promoted_copy=note.get("promoted_copy"),
        )

    def read_end(self) -> ReadEnd | None:
        note = self._note(READ_NOTE)
        if note is None:
            return None
        return ReadEnd(
            next=_offsets(note["next"]),
            last_processed=_offsets(note["last_processed"]),
            processed=int(note["processed"]),
            event_times={SystemStreamPartition.parse(k): int(v) for k, v in note["times"].items()},
            late=int(note["late"]),
            dead_letters=list(note.get("dead", [])),
        )

    def phase(self, steps: Sequence[str] = ()) -> Phase:
        """Where the batch is. ``steps``: the pipeline's stateful steps (any started one makes
        the batch ``stepped``)."""
        if self._note(FINISHED_NOTE) is not None:
            return Phase.FINISHED
        if self._note(DROPPED_NOTE) is not None:
            return Phase.DROPPED
        if self._note(BEGUN_NOTE) is None:
            return Phase.NEW
        if any(self.step_started(s) for s in steps):
            return Phase.STEPPED
        return Phase.BEGUN

    def _refuse(self, what: str, phase: Phase, advice: str) -> PhaseError:
        return PhaseError(
            f"task {self.task}, batch {self.batch}: {what} in phase {phase.value!r}; {advice}"
        )

    def _not_finished(self, what: str) -> None:
        if self._note(FINISHED_NOTE) is not None:
            raise self._refuse(
                what,
                Phase.FINISHED,
                "the batch was finished (committed and reported) already, so this is a Spark "
                "task computed again after the batch's end; restart the job and it resumes "
                "from the last checkpoint",
            )

    # -- transitions
    def begin(self, established: Begun) -> None:
        """new -> begun: the first read of the batch established state (never after the
        finish: that would change the state the finish left)."""
        self._not_finished("establishing the task's state")
        self.local.write_note(
            BEGUN_NOTE,
            {
                "batch": self.key,
                "start": _texts(established.start),
                "last_processed": _texts(established.last_processed),
                "restored": [asdict(r) for r in established.restored],
                "kept": established.kept,
                "watermark": established.watermark,
                "table_records": established.table_records,
                "held": established.held,
                "promoted_copy": established.promoted_copy,
            },
        )

    def end_read(self, end: ReadEnd) -> None:
        """The read reached the end of the batch's input."""
        self.local.write_note(
            READ_NOTE,
            {
                "batch": self.key,
                "next": _texts(end.next),
                "last_processed": _texts(end.last_processed),
                "processed": end.processed,
                "times": {str(k): v for k, v in end.event_times.items()},
                "late": end.late,
                "dead": end.dead_letters,
            },
        )

    def start_step(self, step: str) -> None:
        """begun or stepped -> stepped: ``step`` runs, once in the batch."""
        what = f"stateful step {step!r}"
        self._not_finished(what)
        if self.clean_up_only:
            raise self._refuse(
                what, Phase.BEGUN, "a clean-up only batch runs no step (a driver bug: report it)"
            )
        if self._note(BEGUN_NOTE) is None:
            raise PhaseError(
                f"task {self.task}: stateful step {step!r} of batch {self.batch} ran on an "
                "executor where the task's input of this batch was not read (phase 'new' in "
                f"{self.local.dir}); the task's state is elsewhere. Use a "
                "job.logged.store.base.dir every executor shares, or raise spark.locality.wait "
                "so the step runs beside its cached input"
            )
        done = self._note(step_note(step))
        if done is not None:
            earlier = f" (it failed: {done['error']})" if done.get("error") else ""
            raise PhaseError(
                f"task {self.task}: stateful step {step!r} was computed twice in batch "
                f"{self.batch}{earlier} (phase 'stepped'): a retried Spark task, or its "
                "DataFrame evicted from the cache. Its store updates are not idempotent, so the "
                "batch fails; restart the job and it resumes from the last checkpoint with "
                "state and offsets that match"
            )
        self.local.write_note(step_note(step), {"batch": self.key})

    def end_step(
        self,
        step: str,
        fired: int,
        window_late: int = 0,
        parts: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """``step`` ran to its end, firing ``fired`` timers; its window stores refused
        ``window_late`` adds as late; its late rows were staged as ``parts`` (by collector,
        ``system.stream.partition`` -> part), which the batch publishes at its commit."""
        note = {"batch": self.key, "fired": fired, "window_late": window_late}
        if parts:
            note["parts"] = [dict(p) for p in parts]
        self.local.write_note(step_note(step), note)

    def staged(self, steps: Sequence[str]) -> list[dict[str, str]]:
        """The parts the batch's ``steps`` staged here (their :meth:`end_step`)."""
        notes = (self._note(step_note(s)) for s in steps)
        return [dict(p) for n in notes if n is not None for p in n.get("parts", [])]

    def counted(self, steps: Sequence[str], what: str) -> int:
        """What the batch's ``steps`` counted here (their :meth:`end_step`): the timers they
        fired (``fired``) or the window adds they refused as late (``window_late``)."""
        notes = (self._note(step_note(s)) for s in steps)
        return sum(int(n.get(what, 0)) for n in notes if n is not None)

    def fail_step(self, step: str, error: str) -> None:
        """``step`` raised ``error``: kept so that a retry says why the first run failed."""
        self.local.write_note(step_note(step), {"batch": self.key, "error": error})

    def drop(self, step: str) -> None:
        """any -> dropped: a retried fused ``step`` found it ran before; the batch's progress
        is dropped and the next finish restores the last checkpoint. Idempotent."""
        self.local.write_note(DROPPED_NOTE, {"batch": self.key, "step": step})
        self.local.delete_note(FINISHED_NOTE)  # a finished batch may be finished once more

    def here(self, steps: Sequence[str]) -> WholeBatch | None:
        """Before the finish: how the batch began and where its read ended, if this directory
        holds the whole batch of the task (its read and every stateful step); ``None`` if the
        batch ran elsewhere or partly here, or was dropped (then the finish restores the last
        checkpoint)."""
        phase = self.phase(steps)
        if phase is Phase.FINISHED:
            raise self._refuse(
                "a second finish",
                phase,
                "a finish's Spark task ran again after it had committed and reported; restart "
                "the job and it resumes from the last checkpoint",
            )
        begun = self.begun()
        if begun is None or phase is Phase.DROPPED:
            return None
        end = self.read_end()
        if end is None:
            raise TaskError(
                f"task {self.task}: batch {self.batch} read only part of its input (a "
                "limit(), take() or first() on the batch stops reading early), so sparkpoint "
                "cannot tell which messages were processed; write whole DataFrames to outputs"
            )
        if not all(self.step_started(s) for s in steps):
            return None
        return WholeBatch(begun, end)

    def finished(self) -> None:
        """-> finished: the batch committed (when due) and reported."""
        self.local.write_note(FINISHED_NOTE, {"batch": self.key})


__all__ = ["Begun", "Phase", "PhaseError", "ReadEnd", "TaskPhases", "WholeBatch", "step_note"]
