"""Which state a task's local stores hold: the task-state protocol's values.

A task's live stores are in one of four states, each a type with one format (the wire format of
the local marker and of the batch plan, unchanged since the first release) and one parse:

============================  ===========================  ====================================
state                         text                         meaning
============================  ===========================  ====================================
:class:`EmptyState`           ``empty``                    nothing committed yet
:class:`CommittedState`       ``ckpt:<checkpoint id>``     exactly a committed checkpoint
:class:`UncommittedState`     ``batch:<run>:<n>``          after batch ``n`` of run ``run``,
                                                           past the last checkpoint
:class:`CleanStart`           ``clean-start:<run>``        matches no local state: the task
                                                           restores at its first batch
============================  ===========================  ====================================

:func:`check_transition` is the one place that says which state may follow which after a
batch: the driver checks every task's report with it. No other module builds or parses these
strings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.errors import CheckpointError, SparkpointError


class IllegalStateTransition(SparkpointError):
    """A task reported a state that cannot follow the one it was expected to have; names the
    task, both states and the batch."""


class StateId(ABC):
    """The state a task's live stores hold (see the module docstring)."""

    @property
    @abstractmethod
    def text(self) -> str:
        """The wire format (local marker, logs)."""

    @property
    def committed(self) -> bool:
        """Whether the stores hold exactly a committed checkpoint."""
        return False

    def __str__(self) -> str:
        return self.text

    @staticmethod
    def parse(text: str) -> StateId:
        """The state ``text`` names; :class:`ValueError` for anything else."""
        kind, sep, rest = text.partition(":")
        if text == "empty":
            return EMPTY
        if sep and kind == "ckpt" and rest:
            try:
                return CommittedState(str(CheckpointId.parse(rest)))
            except CheckpointError:
                pass
        if sep and kind == "batch":
            run, sep2, n = rest.rpartition(":")
            if sep2 and run and n.isdigit():
                return UncommittedState(run, int(n))
        if sep and kind == "clean-start" and rest:
            return CleanStart(rest)
        raise ValueError(f"not a state id: {text!r}")


@dataclass(frozen=True)
class EmptyState(StateId):
    @property
    def text(self) -> str:
        return "empty"


@dataclass(frozen=True)
class CommittedState(StateId):
    checkpoint_id: str

    @property
    def text(self) -> str:
        return f"ckpt:{self.checkpoint_id}"

    @property
    def committed(self) -> bool:
        return True


@dataclass(frozen=True)
class UncommittedState(StateId):
    run_id: str
    batch: int

    @property
    def text(self) -> str:
        return f"batch:{self.run_id}:{self.batch}"


@dataclass(frozen=True)
class CleanStart(StateId):
    run_id: str

    @property
    def text(self) -> str:
        return f"clean-start:{self.run_id}"


EMPTY = EmptyState()


def check_transition(task: str, batch: int, before: StateId, after: StateId) -> None:
    """Raise :class:`IllegalStateTransition` unless ``after`` may follow ``before`` in one batch.

    Any state may become empty (a restore with no checkpoint) or stay as it was (a batch that
    changed nothing). A clean start is only ever an instruction of the driver, never a state a
    task reports. A committed checkpoint never goes back to an older one (checkpoint ids only
    grow per task). An uncommitted batch of a run is that run's batch, and a later batch of the
    same run than the one it follows.
    """
    problem = None
    if isinstance(after, CleanStart):
        problem = "a task never reports a clean start"
    elif isinstance(before, CommittedState) and isinstance(after, CommittedState):
        if CheckpointId.parse(after.checkpoint_id) < CheckpointId.parse(before.checkpoint_id):
            problem = "a checkpoint older than the one it follows"
    elif (
        isinstance(before, UncommittedState)
        and isinstance(after, UncommittedState)
        and before.run_id == after.run_id
        and after.batch < before.batch
    ):
        problem = "an earlier batch of the same run"
    if problem is not None:
        raise IllegalStateTransition(
            f"task {task} batch {batch}: state {after} cannot follow {before} ({problem})"
        )
