"""The driver's start (:mod:`sparkpoint.runtime.driver.startup`): what it checks and prepares of
the state backends before the first batch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.helpers import (
    assert_committed_state_matches_its_offsets,
    changelog_job,
    changelog_records,
    changelog_view,
    committed_counts,
    generate,
)

make = changelog_job


def run(config: Config, **kwargs: object) -> JobCoordinator:
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.run(**kwargs)  # type: ignore[arg-type]
    finally:
        coordinator.close()
    return coordinator


def test_unknown_backend_is_an_error_at_start(tmp_path: Path) -> None:
    config = make(tmp_path, **{"stores.user-counts.backup.factories": "tape"})
    generate(config, tmp_path / "a.yaml", 10, seed=46)
    with pytest.raises(
        ConfigError,
        match="store user-counts lists unknown backend 'tape'; known: blobstore, changelog",
    ):
        JobCoordinator(config, InlineRunner()).start()


def test_changelogs_are_compacted_up_to_the_checkpoints_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path, **{"stores.user-counts.write.batch.size": "1"})  # log every write
    expected = generate(config, tmp_path / "a.yaml", 3000, seed=44, users=20)
    run(config, until_caught_up=True)
    written = changelog_records(config)
    assert written >= 3000  # one entry per view
    caplog.set_level("INFO")
    run(config, until_caught_up=True)  # nothing new: the start compacts
    assert "compacted changelog filelog.user-counts-changelog." in caplog.text
    assert changelog_records(config) <= 20 + 4 * 4  # about one entry per user is left
    assert changelog_view(config) == dict(expected)
    shutil.rmtree(config.store_base_dir)  # restore from the compacted changelog
    expected += generate(config, tmp_path / "b.yaml", 500, seed=45, users=20)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_committed_state_matches_its_offsets(config)


def test_a_changelog_with_fewer_partitions_than_tasks_stops_the_job(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, log_system)
    Systems(config).admin("log").create_stream(StreamSpec("user-counts-changelog", 2))
    with pytest.raises(
        ConfigError,
        match=r"store user-counts: changelog log\.user-counts-changelog has 2 partitions but "
        r"the job's tasks need 4",
    ):
        run(config, until_caught_up=True)


def test_a_bad_delete_retention_stops_the_job_at_its_start(tmp_path: Path) -> None:
    bad = make(tmp_path, **{"streams.user-counts-changelog.delete.retention.ms": "soon"})
    with pytest.raises(ConfigError, match=r"streams.user-counts-changelog.delete.retention.ms"):
        run(bad, until_caught_up=True)  # at its start, before any compaction
