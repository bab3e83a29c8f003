"""Host affinity's assignment rules (no Spark): placement, moves, rebalance, persistence."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sparkpoint.config import load_config
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.locality import Executor, stored_assignment
from sparkpoint.runtime.driver.affinity import HostAffinity
from sparkpoint.runtime.driver.placement import Placement
from sparkpoint.runtime.plan import TaskBatchResult
from tests.conftest import pageviews_config

A, B, C = Executor("0", "host-a"), Executor("1", "host-b"), Executor("2", "host-c")
TASKS = [f"Partition {i}" for i in range(4)]


def loads(p: Placement) -> Counter[Executor]:
    return Counter(p.assignment.values())


def test_new_tasks_are_balanced_and_keep_their_executor() -> None:
    p = Placement()
    moves = p.place(TASKS, [A, B])
    assert {m.reason for m in moves} == {"new task"}
    assert loads(p) == {A: 2, B: 2}
    before = dict(p.assignment)
    assert p.place(TASKS, [A, B]) == []
    assert p.assignment == before


def test_new_tasks_prefer_the_executor_with_less_state() -> None:
    p = Placement({"Partition 0": A, "Partition 1": B}, sizes={"Partition 0": 10, "Partition 1": 1})
    p.place(["Partition 0", "Partition 1", "Partition 2"], [A, B])
    assert p.assignment["Partition 2"] == B


def test_a_lost_executor_moves_only_its_tasks_to_the_least_loaded() -> None:
    p = Placement()
    tasks = [f"Partition {i}" for i in range(6)]
    p.place(tasks, [A, B, C])
    on_b = {t for t, e in p.assignment.items() if e == B}
    others = {t: e for t, e in p.assignment.items() if e != B}
    moves = p.place(tasks, [A, C])
    assert {m.task for m in moves} == on_b
    assert all(m.old == B and "is gone" in m.reason for m in moves)
    assert {t: e for t, e in p.assignment.items() if t not in on_b} == others
    assert loads(p) == {A: 3, C: 3}


def test_an_added_executor_takes_nothing_unless_a_rebalance_is_asked() -> None:
    p = Placement()
    p.place(TASKS, [A, B])
    assert p.place(TASKS, [A, B, C]) == []
    assert C not in loads(p)
    moves = p.place(TASKS, [A, B, C], rebalance=True)
    assert [m.reason for m in moves] == ["rebalance"]
    assert moves[0].new == C
    assert sorted(loads(p).values()) == [1, 1, 2]
    assert p.place(TASKS, [A, B, C], rebalance=True) == []  # balanced: stays


def test_new_executor_ids_on_the_same_host_keep_tasks_on_that_host() -> None:
    p = Placement({"Partition 0": A, "Partition 1": B})
    a2, b2 = Executor("7", "host-a"), Executor("8", "host-b")
    moves = p.place(["Partition 0", "Partition 1"], [b2, a2])
    assert p.assignment == {"Partition 0": a2, "Partition 1": b2}
    assert all("same host" in m.reason for m in moves)


def test_a_task_the_scheduler_ran_elsewhere_is_reassigned_there() -> None:
    p = Placement({"Partition 0": A})
    assert p.ran("Partition 0", A) is None
    move = p.ran("Partition 0", B)
    assert move is not None and move.old == A and move.new == B
    assert p.assignment["Partition 0"] == B


def _result(task: str, ran_on: Executor) -> TaskBatchResult:
    return TaskBatchResult(task, 1, "s", {}, {}, 0, 0, ran_on=ran_on, state_bytes={"s": 5})


def test_the_assignment_survives_a_driver_restart(tmp_path: Path) -> None:
    """Stored in the coordinator stream (Samza's namespaces): a new driver reads it back."""
    config = load_config(None, base=pageviews_config(tmp_path))
    store = CoordinatorStreamStore(config)
    affinity = HostAffinity(config, store, TASKS)
    locations = affinity.place([A, B])
    assert sorted(locations.values()) == sorted([A.location] * 2 + [B.location] * 2)
    placed = affinity.ran([_result("Partition 0", C)])  # the scheduler used another executor
    assert [m.task for m in placed.away] == ["Partition 0"]
    store.close()
    again = CoordinatorStreamStore(config)
    restored = stored_assignment(again, TASKS)
    assert restored == affinity.placement.assignment
    assert restored["Partition 0"] == C
    assert HostAffinity(config, again, TASKS).place([A, B, C]) == locations | {
        "Partition 0": C.location
    }


def test_host_affinity_off_places_nothing(tmp_path: Path) -> None:
    config = load_config(
        None, base=pageviews_config(tmp_path, **{"job.host-affinity.enabled": "false"})
    )
    affinity = HostAffinity(config, CoordinatorStreamStore(config), TASKS)
    assert affinity.place([A, B]) == {}
    assert affinity.ran([_result("Partition 0", A)]).away == []


def test_no_preference_for_an_executor_that_is_not_live(tmp_path: Path) -> None:
    """Before any executor has registered (or when all are gone) nothing is preferred: a
    preference for a dead executor would only delay the batch."""
    config = load_config(None, base=pageviews_config(tmp_path))
    store = CoordinatorStreamStore(config)
    HostAffinity(config, store, TASKS).place([A, B])
    again = HostAffinity(config, store, TASKS)
    assert again.place([]) == {}
    assert set(again.place([A]).values()) == {A.location}  # B's tasks moved to A
