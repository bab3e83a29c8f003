"""A DataFrame task's phases in one worker open its stores once (``held_engines``), and
nothing a restore or the final close does ever sees an engine left open."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.config import load_config
from sparkpoint.errors import StoreError
from sparkpoint.model import SystemStreamPartition, TaskModel, TaskName
from sparkpoint.storage.state_id import EMPTY, UncommittedState
from sparkpoint.storage.task_storage import TaskStorage, held_engines
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config

STORE = "user-counts"


def storage(tmp_path: Path) -> TaskStorage:
    config = load_config(None, pageviews_config(tmp_path))
    task = TaskModel(
        TaskName("Partition 0"), frozenset([SystemStreamPartition("filelog", "pageviews", 0)]), 0
    )
    return TaskStorage(config, Systems(config), task, run_id="r")


def test_phases_inside_the_block_share_one_open_engine_and_the_block_closes_it(
    tmp_path: Path,
) -> None:
    with held_engines():
        first = storage(tmp_path)
        first.open(EMPTY)  # establish (here: a restore from nothing)
        engine = first.engines[STORE]
        engine.put(b"k", b"1")
        first.close()  # a phase ends: kept open for the next one
        step = storage(tmp_path)
        step.open_live([STORE])
        assert step.engines[STORE] is engine
        step.close()
        finish = storage(tmp_path)
        finish.open_live()
        assert finish.engines[STORE] is engine and engine.get(b"k") == b"1"
        finish.close()  # an interrupted finish: the block still closes it
    with pytest.raises(StoreError, match="used after close"):
        engine.get(b"k")


def test_the_final_close_and_a_restore_never_use_a_held_engine(tmp_path: Path) -> None:
    with held_engines():
        first = storage(tmp_path)
        first.open(EMPTY)
        engine = first.engines[STORE]
        first.close()
        again = storage(tmp_path)
        again.open(EMPTY)  # may restore: the held engine is closed first
        assert again.engines[STORE] is not engine
        with pytest.raises(StoreError, match="used after close"):
            engine.get(b"k")
        last = again.engines[STORE]
        again.close(UncommittedState("r", 1))  # the final close: for real, then the marker
        with pytest.raises(StoreError, match="used after close"):
            last.get(b"k")
        assert again.local.read_marker() == UncommittedState("r", 1)


def test_outside_the_block_every_close_closes(tmp_path: Path) -> None:
    first = storage(tmp_path)
    first.open(EMPTY)
    engine = first.engines[STORE]
    first.close()
    with pytest.raises(StoreError, match="used after close"):
        engine.get(b"k")
    second = storage(tmp_path)
    second.open_live()
    assert second.engines[STORE] is not engine
    second.close()
