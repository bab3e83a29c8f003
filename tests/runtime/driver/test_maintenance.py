"""Maintenance beside the batches (:mod:`sparkpoint.runtime.driver.maintenance`): changelogs
compacted as they grow, and a failed pass stops the run."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from tests.helpers import (
    assert_committed_state_matches_its_offsets,
    changelog_job,
    changelog_records,
    changelog_view,
    committed_counts,
    generate,
)
from tests.helpers import run_job as run

make = changelog_job


def test_changelogs_are_compacted_during_a_long_run_as_they_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded log has no broker to compact changelogs: a long run compacts each one up to
    its checkpoint after commits, once it grew by as many records as the last compaction kept
    (10,000 at least; 40 here), so its disk stays bounded by the state, not the writes."""
    from sparkpoint.storage.changelog import backend as changelog

    monkeypatch.setattr(changelog, "COMPACT_MIN_GROWTH", 40)
    config = make(
        tmp_path,
        **{"stores.user-counts.write.batch.size": "1", "job.retention.check.ms": "0"},
    )
    expected = generate(config, tmp_path / "a.yaml", 3000, seed=46, users=20)
    run(config, until_caught_up=True)  # one run: 8 batches of 100 views per task
    assert changelog_records(config) < 3000 / 3  # compacted during the run
    assert changelog_view(config) == dict(expected)
    shutil.rmtree(config.store_base_dir)  # restore from the changelog compacted mid-run
    expected += generate(config, tmp_path / "b.yaml", 400, seed=47, users=20)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_committed_state_matches_its_offsets(config)


def test_a_compaction_pass_that_fails_beside_the_batches_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changelogs are compacted beside the batches (a thread of the driver): a pass that finds
    a damaged record is not lost in that thread; the run stops with its error."""
    from sparkpoint.errors import CorruptRecordError
    from sparkpoint.storage.changelog import backend as changelog

    monkeypatch.setattr(changelog, "COMPACT_MIN_GROWTH", 40)
    original = changelog.ChangelogAdmin.compact
    passes: list[str] = []

    def failing(self: changelog.ChangelogAdmin, checkpoints: object, **kw: bool) -> None:
        if kw.get("during_run"):
            passes.append(threading.current_thread().name)
            raise CorruptRecordError("filelog.user-counts-changelog partition 0 at offset 7: x")
        original(self, checkpoints, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(changelog.ChangelogAdmin, "compact", failing)
    config = make(
        tmp_path,
        **{"stores.user-counts.write.batch.size": "1", "job.retention.check.ms": "0"},
    )
    generate(config, tmp_path / "a.yaml", 3000, seed=46, users=20)
    with pytest.raises(CorruptRecordError, match="at offset 7"):
        run(config, until_caught_up=True)
    assert passes and set(passes) == {"sparkpoint-changelog-compaction"}
