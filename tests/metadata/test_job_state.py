"""Config kept across runs, stable changelog partitions, and the driver's liveness record."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.metadata.coordinator_stream import SET_CHANGELOG, CoordinatorStreamStore
from sparkpoint.metadata.job_state import (
    Heartbeat,
    assign_changelog_partitions,
    is_running,
    read_liveness,
    store_config,
)
from sparkpoint.model import SystemStreamPartition, group_by_partition


def config(tmp_path: Path, **values: str) -> Config:
    return load_config(
        None,
        {"job.name": "j", "systems.fl.factory": "filelog", "job.data.dir": str(tmp_path), **values},
    )


def test_changed_config_is_stored_with_a_logged_diff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CoordinatorStreamStore(config(tmp_path))
    assert store_config(store, config(tmp_path, **{"task.commit.ms": "100"}))  # first run: all new
    with caplog.at_level(logging.WARNING):
        diff = store_config(
            CoordinatorStreamStore(config(tmp_path)),
            config(tmp_path, **{"task.commit.ms": "200", "task.window.ms": "5"}),
        )
    assert "~ task.commit.ms: 100 -> 200" in diff and "+ task.window.ms=5" in diff
    assert "task.commit.ms: 100 -> 200" in caplog.text
    again = CoordinatorStreamStore(config(tmp_path))
    assert again.get("set-config", "task.commit.ms") == "200"
    assert store_config(again, config(tmp_path)) == [
        "- task.commit.ms (was 200)",
        "- task.window.ms (was 5)",
    ]
    assert CoordinatorStreamStore(config(tmp_path)).get("set-config", "task.commit.ms") is None


def test_changelog_partitions_are_stable_when_tasks_grow(tmp_path: Path) -> None:
    c = config(tmp_path)
    two = group_by_partition("j", "1", [SystemStreamPartition("fl", "a", p) for p in range(2)])
    store = CoordinatorStreamStore(c)
    # pretend an earlier version mapped the tasks the other way round
    store.put_all(SET_CHANGELOG, {"Partition 0": "1", "Partition 1": "0"})
    first = assign_changelog_partitions(store, two)
    assert first.task("Partition 0").changelog_partition == 1
    four = group_by_partition("j", "1", [SystemStreamPartition("fl", "a", p) for p in range(4)])
    grown = assign_changelog_partitions(CoordinatorStreamStore(c), four)
    got = {t.name.name: t.changelog_partition for t in grown.tasks.values()}
    assert got == {"Partition 0": 1, "Partition 1": 0, "Partition 2": 2, "Partition 3": 3}
    assert CoordinatorStreamStore(c).all(SET_CHANGELOG) == {k: str(v) for k, v in got.items()}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"Partition 0": "1", "Partition 1": "1"},
            "tasks Partition 0 and Partition 1 are both mapped to changelog partition 1",
        ),
        ({"Partition 0": "abc"}, "task Partition 0 is mapped to changelog partition 'abc'"),
    ],
)
def test_bad_changelog_mappings_are_refused(
    tmp_path: Path, mapping: dict[str, str], message: str
) -> None:
    """Issue 11: two tasks on one changelog partition were accepted (57 users wrong after a
    restore), and a non-number crashed with a bare ValueError."""
    from sparkpoint.errors import UserError

    two = group_by_partition("j", "1", [SystemStreamPartition("fl", "a", p) for p in range(2)])
    store = CoordinatorStreamStore(config(tmp_path))
    store.put_all(SET_CHANGELOG, mapping)
    with pytest.raises(UserError, match=message):
        assign_changelog_partitions(store, two)


def test_heartbeat_marks_the_job_running_until_it_stops(tmp_path: Path) -> None:
    c = config(tmp_path)
    store = CoordinatorStreamStore(c)
    assert is_running(store) is None
    beat = Heartbeat(c, "run-1")
    beat.start()
    running = is_running(store)
    assert running is not None and running["run-id"] == "run-1"
    stale = int(time.time() * 1000) + 60_000
    assert is_running(store, now_ms=stale) is None  # a driver that stopped beating long ago
    beat.stop()
    assert read_liveness(store) is None


def test_credentials_never_reach_logs_or_printed_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sparkpoint.config import redact

    secret = {
        "blob.store.options.secret": "hunter2",
        "blob.store.options.connection_string": "AccountKey=abc",
    }
    store = CoordinatorStreamStore(config(tmp_path))
    store_config(store, config(tmp_path, **{"blob.store.options.secret": "old-secret"}))
    with caplog.at_level(logging.WARNING):
        diff = store_config(CoordinatorStreamStore(config(tmp_path)), config(tmp_path, **secret))
    text = caplog.text + "\n".join(diff)
    assert "hunter2" not in text and "old-secret" not in text and "AccountKey=abc" not in text
    assert "~ blob.store.options.secret: **** -> ****" in diff
    assert redact("blob.store.options.key", "AKIA") == "****"
    assert redact("blob.store.url", "s3://bucket/x") == "s3://bucket/x"
    assert redact("task.commit.ms", "100") == "100"


def test_one_off_set_values_are_not_stored_as_the_jobs_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37: a one-off `--set` was stored as the job's config, so the next run without it
    warned "config changed"."""
    store = CoordinatorStreamStore(config(tmp_path))
    store_config(store, config(tmp_path, **{"task.commit.ms": "5000"}))
    one_off = config(tmp_path, **{"task.commit.ms": "100", "task.window.ms": "7"}).with_one_off(
        {"task.commit.ms", "task.window.ms"}
    )
    with caplog.at_level(logging.INFO):
        assert store_config(CoordinatorStreamStore(config(tmp_path)), one_off) == []
    assert "this run's --set values (not stored as the job's config)" in caplog.text
    assert "task.commit.ms=100" in caplog.text
    again = CoordinatorStreamStore(config(tmp_path))
    assert again.get("set-config", "task.commit.ms") == "5000"
    assert again.get("set-config", "task.window.ms") is None
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert store_config(again, config(tmp_path, **{"task.commit.ms": "5000"})) == []
    assert "config changed" not in caplog.text
