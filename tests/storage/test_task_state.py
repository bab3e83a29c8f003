"""The task-state protocol's values: one format and one parse per state (the wire format of
the local marker unchanged), and the transitions a task may report (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint.model import TaskName
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.storage.state_id import (
    EMPTY,
    CleanStart,
    CommittedState,
    IllegalStateTransition,
    StateId,
    UncommittedState,
    check_transition,
)

STATES = [
    (EMPTY, "empty"),
    (CommittedState("1700000000000-12"), "ckpt:1700000000000-12"),
    (UncommittedState("3f9a2c1b0d4e", 17), "batch:3f9a2c1b0d4e:17"),
    (UncommittedState("run:with:colons", 2), "batch:run:with:colons:2"),
    (CleanStart("3f9a2c1b0d4e"), "clean-start:3f9a2c1b0d4e"),
]


@pytest.mark.parametrize(("state", "text"), STATES, ids=[t for _, t in STATES])
def test_each_state_has_one_format_and_one_parse(state: StateId, text: str) -> None:
    assert state.text == text == str(state)
    assert StateId.parse(text) == state
    assert state.committed is isinstance(state, CommittedState)


@pytest.mark.parametrize("text", ["", "ckpt:", "ckpt:abc", "batch:r", "batch:r:x", "full", "x:1"])
def test_anything_else_is_not_a_state(text: str) -> None:
    with pytest.raises(ValueError, match="not a state id"):
        StateId.parse(text)


def test_markers_written_before_the_types_still_read(tmp_path: Path) -> None:
    local = LocalTaskState(tmp_path, TaskName("Partition 0"))
    for _state, text in STATES:
        local.dir.mkdir(parents=True, exist_ok=True)
        (local.dir / "STATE").write_text(json.dumps({"state-id": text}))
        assert local.read_marker() == StateId.parse(text)
    (local.dir / "STATE").write_text(json.dumps({"state-id": "garbage"}))
    assert local.read_marker() is None  # unknown: the task restores
    local.write_marker(CommittedState("5-0"))
    assert json.loads((local.dir / "STATE").read_text()) == {"state-id": "ckpt:5-0"}


ALLOWED = [
    (EMPTY, EMPTY),
    (EMPTY, UncommittedState("r", 1)),
    (EMPTY, CommittedState("5-0")),
    (CleanStart("r"), EMPTY),
    (CleanStart("r"), CommittedState("5-0")),
    (CommittedState("5-0"), CommittedState("5-0")),
    (CommittedState("5-0"), CommittedState("6-0")),
    (CommittedState("5-0"), UncommittedState("r", 3)),
    (CommittedState("5-0"), EMPTY),  # a restore that found no checkpoint
    (UncommittedState("r", 3), UncommittedState("r", 4)),
    (UncommittedState("r", 3), CommittedState("6-0")),
    (UncommittedState("old", 9), UncommittedState("new", 1)),
]
REFUSED = [
    (EMPTY, CleanStart("r"), "a task never reports a clean start"),
    (CommittedState("6-0"), CommittedState("5-9"), "a checkpoint older than"),
    (UncommittedState("r", 4), UncommittedState("r", 3), "an earlier batch of the same run"),
]


@pytest.mark.parametrize(("before", "after"), ALLOWED, ids=[f"{b}->{a}" for b, a in ALLOWED])
def test_allowed_transitions(before: StateId, after: StateId) -> None:
    check_transition("Partition 0", 7, before, after)


@pytest.mark.parametrize(
    ("before", "after", "why"), REFUSED, ids=[f"{b}->{a}" for b, a, _ in REFUSED]
)
def test_refused_transitions_name_task_batch_and_states(
    before: StateId, after: StateId, why: str
) -> None:
    with pytest.raises(IllegalStateTransition) as caught:
        check_transition("Partition 0", 7, before, after)
    text = str(caught.value)
    assert text.startswith(f"task Partition 0 batch 7: state {after} cannot follow {before}")
    assert why in text


def test_the_task_directory_lists_what_a_batch_a_commit_and_a_clean_up_leave(
    tmp_path: Path,
) -> None:
    """Issue 30: every file a task keeps is named by its directory (storage/local.py); after
    each step of a run it lists exactly what that step left, and nothing it does not name."""
    from sparkpoint.config import load_config
    from sparkpoint.system.base import StreamSpec
    from sparkpoint.system.registry import Systems
    from tests.conftest import pageviews_config
    from tests.storage.cycle import TaskCycle

    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 1))
    directory = LocalTaskState(config.store_base_dir, TaskName("Partition 0"))
    cycle = TaskCycle(config)
    cycle.batch(commit=False)  # a batch, not committed
    after_batch = directory.contents()
    assert after_batch["state"] == f"batch:{cycle.run_id}:1"
    assert after_batch["stores"] == ["user-counts"]
    assert after_batch["checkpoints"] == {} and after_batch["commit-records"] == []
    assert after_batch["notes"] == [] and after_batch["unknown"] == []
    cycle.batch(wait=True)  # a commit
    assert cycle.last is not None
    cid = str(cycle.last.checkpoint_id)
    after_commit = directory.contents()
    assert after_commit["state"] == f"ckpt:{cid}"
    assert after_commit["checkpoints"] == {"user-counts": [cid]}
    assert after_commit["commit-records"] == [cid]
    assert after_commit["cleaned"] is None and after_commit["unknown"] == []
    cycle.clean_up()  # the clean-up after it
    after_clean_up = directory.contents()
    assert after_clean_up["cleaned"] == f"{cycle.run_id}:{cid}"
    assert after_clean_up["commit-records"] == []  # done and written: removed
    assert after_clean_up["checkpoints"] == {"user-counts": [cid]}  # the last one stays
    assert after_clean_up["state"] == f"ckpt:{cid}" and after_clean_up["unknown"] == []
    from sparkpoint.tools.jobs import job_overview, overview_lines

    shown = "\n".join(overview_lines(job_overview(config)))  # `sparkpoint job show`
    assert f"on this machine: state ckpt:{cid}; commit records none; phase notes none" in shown
