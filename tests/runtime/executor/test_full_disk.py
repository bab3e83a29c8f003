"""A full disk inside a task (issue 72): opening its storage on a full disk printed a 169-line
Py4J traceback. It is one line naming the task, the path and the fix, in both APIs' entry
points, and the next run after space is freed counts every view once."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.errors import StoreError
from sparkpoint.runtime.spark.session import user_error_from
from sparkpoint.storage.task_storage import TaskStorage
from tests.helpers import changelog_job, committed_counts, generate, run_job


def test_a_full_disk_opening_a_task_s_storage_is_one_line_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = changelog_job(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 100, seed=63, users=5)
    real = TaskStorage._open_engine

    def full(self: Any, store: str) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "state" / store))

    monkeypatch.setattr(TaskStorage, "_open_engine", full)
    with pytest.raises(StoreError) as failed:
        run_job(config, until_caught_up=True)
    line = str(failed.value)
    assert line.startswith("task Partition 0: No space left on device: ")
    assert "user-counts (a full disk, a quota" in line and "\n" not in line
    assert "the next run resumes from the last written checkpoint" in line
    # as the driver shows it when it comes back through Spark: the same one line
    shown = user_error_from(RuntimeError(f"Traceback ...\nsparkpoint.errors.StoreError: {line}"))
    assert shown is not None and str(shown) == line
    monkeypatch.setattr(TaskStorage, "_open_engine", real)  # space freed
    run_job(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
