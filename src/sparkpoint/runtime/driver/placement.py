"""Host affinity: which executor each task runs on, so that it runs where its state is.

Samza keeps a task's local state worth having by asking the cluster manager for the host the
task's container ran on before (host affinity, stored in the coordinator stream). On Spark the
driver gives each task's Spark partition a preferred location, its executor
(:mod:`sparkpoint.runtime.spark.locality`), and keeps the assignment here:

* a task keeps its executor for as long as that executor lives;
* a task whose executor is gone goes to the executor of its most current standby copy, if it
  has one (``job.standbytasks.replication.factor``): it is promoted there. Not when the
  executors of a host share one state directory and one on the task's host lives: its live
  state is there;
* a new task, or one whose executor is gone, goes to the live executor with the fewest tasks
  (then the least state), preferring one on the host it ran on before: a restarted driver whose
  executors have new ids finds each task's state on the host's disk;
* a task the scheduler ran elsewhere anyway (locality wait, a busy executor) restored there, so
  it is re-assigned to where it ran;
* a new executor takes no task unless a rebalance is asked for; then tasks move from the most
  loaded executors until the counts differ by at most one.

Every change is a :class:`Move` with a reason, logged by the caller; the assignment is kept in
the metadata store (:mod:`sparkpoint.metadata.locality`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sparkpoint.metadata.locality import Executor

#: a move's reason when the task goes to its standby copy's executor (promoted there)
PROMOTED = "promoted on its standby"


@dataclass(frozen=True)
class Move:
    task: str
    old: Executor | None
    new: Executor
    reason: str

    def __str__(self) -> str:
        old = f" from {self.old}" if self.old else ""
        return f"task {self.task}{old} to {self.new}: {self.reason}"


@dataclass
class Placement:
    """The task -> executor assignment (see the module docstring)."""

    assignment: dict[str, Executor] = field(default_factory=dict)
    #: bytes of local state per task, where known: balances new tasks by state as well
    sizes: dict[str, int] = field(default_factory=dict)

    def load(self, executor: Executor) -> tuple[int, int]:
        tasks = [t for t, e in self.assignment.items() if e == executor]
        return len(tasks), sum(self.sizes.get(t, 0) for t in tasks)

    def place(
        self,
        tasks: Iterable[str],
        live: Sequence[Executor],
        *,
        rebalance: bool = False,
        standbys: Mapping[str, Executor] | None = None,
        state_per_host: bool = False,
    ) -> list[Move]:
        """Assign every task in ``tasks`` to one of the ``live`` executors; the changes made.
        With no live executor known the assignment is kept as it is (nothing to prefer). A
        task whose executor is gone goes to its entry in ``standbys`` when it has one (the
        executor of its most current standby copy: it is promoted there), unless
        ``state_per_host`` (executors of a host share one state directory) and an executor on
        its old host lives: its live state is there."""
        if not live:
            return []
        alive = set(live)
        standbys = standbys or {}
        moves: list[Move] = []
        for task in sorted(tasks):
            old = self.assignment.get(task)
            if old in alive:
                continue
            if old is None:
                moves.append(self._assign(task, None, self._least_loaded(live), "new task"))
                continue
            same_host = [e for e in live if e.host == old.host]
            if standbys.get(task) in alive and not (state_per_host and same_host):
                promoted = standbys[task]
                moves.append(self._assign(task, old, promoted, f"{old} is gone; {PROMOTED}"))
                continue
            if same_host:
                new, reason = self._least_loaded(same_host), f"{old} is gone; same host"
            else:
                new, reason = self._least_loaded(live), f"{old} is gone"
            moves.append(self._assign(task, old, new, reason))
        if rebalance:
            moves.extend(self._rebalance(live))
        return moves

    def ran(self, task: str, executor: Executor) -> Move | None:
        """The task ran on ``executor``: if that is not its executor it is re-assigned there
        (its state is there now)."""
        old = self.assignment.get(task)
        if old == executor:
            return None
        reason = "first run" if old is None else "the scheduler ran it there"
        return self._assign(task, old, executor, reason)

    def _assign(self, task: str, old: Executor | None, new: Executor, reason: str) -> Move:
        self.assignment[task] = new
        return Move(task, old, new, reason)

    def _least_loaded(self, executors: Sequence[Executor]) -> Executor:
        return min(executors, key=lambda e: (*self.load(e), e))

    def _rebalance(self, live: Sequence[Executor]) -> list[Move]:
        moves: list[Move] = []
        while True:
            busiest = max(live, key=lambda e: (self.load(e)[0], e))
            idlest = self._least_loaded(live)
            if self.load(busiest)[0] - self.load(idlest)[0] <= 1:
                return moves
            candidates = [t for t, e in self.assignment.items() if e == busiest]
            task = min(candidates, key=lambda t: (self.sizes.get(t, 0), t))
            moves.append(self._assign(task, busiest, idlest, "rebalance"))
