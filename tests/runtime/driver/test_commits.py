"""The driver's checkpoint writer (:mod:`sparkpoint.runtime.driver.commits`): what it refuses
to write, when it commits, and a crash at every step of the commit (executor and driver)
keeping state and offsets together."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.config import load_config
from sparkpoint.errors import CommitError
from sparkpoint.failpoints import POINTS, InjectedCrash
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.testing.backends import NAME as COPY
from tests.conftest import pageviews_config
from tests.helpers import (
    assert_at_least_once,
    assert_committed_state_matches_its_offsets,
    changelog_job,
    committed_counts,
    emitted_counts,
    generate,
)
from tests.helpers import run_job as run


def test_a_commit_built_on_another_checkpoint_than_the_last_written_is_not_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the soak on a cluster: an upload that finished on an executor the task had left
    was written after a commit the task made elsewhere from the same base, forking the chain of
    snapshots (two clean-ups then deleted each other's blobs). The driver now writes a commit
    only if it builds on the last written checkpoint."""
    from dataclasses import replace

    from sparkpoint.checkpoint.checkpoint import CheckpointV2
    from sparkpoint.checkpoint.id import CheckpointId

    config = load_config(None, pageviews_config(tmp_path, **{"task.batch.max.messages": "50"}))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 1))
    generate(config, tmp_path / "a.yaml", 1000, seed=51, users=20)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    meta = coordinator.partition_metadata(
        [s for t in coordinator.tasks.values() for s in t.model.ssps]
    )
    end = {s: m.upcoming for s, m in meta.items()}
    _, results = coordinator.run_batch(end, commit=True, wait=True)
    written = coordinator.tasks["Partition 0"].last_checkpoint
    assert written is not None
    stale = CheckpointV2(CheckpointId.create(), written.input_offsets, {})
    forked = replace(results[0], completed_checkpoints=[stale.dumps()], completed_bases=["1-1"])
    caplog.set_level("INFO")
    assert not coordinator.apply(forked)
    assert "built on 1-1 instead of the last written" in caplog.text
    assert coordinator.tasks["Partition 0"].last_checkpoint == written
    on_top = replace(forked, completed_bases=[str(written.checkpoint_id)])
    assert coordinator.apply(on_top)
    coordinator.close()


def test_a_run_to_the_end_commits_its_last_batch_once_its_uploads_are_done(
    tmp_path: Path,
) -> None:
    """A run to the end of its input commits its last batch, waiting for the batch's uploads,
    as the commit after the last batch did: an upload still running then would leave the
    tasks uncommitted, and the driver would snapshot and upload once more."""

    values = pageviews_config(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": "blobstore",
            "task.checkpoint.read.versions": "2",
            "task.batch.max.messages": "1000",
            "task.commit.ms": "600000",
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "a.yaml", 1200, seed=64)
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        summary = coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()
    assert (summary.batches, summary.commits) == (1, 1), summary
    assert committed_counts(config) == dict(expected)


@pytest.mark.parametrize("point", POINTS)
def test_crash_at_every_step_keeps_state_and_offsets_together(tmp_path: Path, point: str) -> None:
    flag = tmp_path / "crash.flag"
    flag.write_text("0" if point == "during-cleanup" else "4")
    config = changelog_job(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": f"changelog,{COPY}",
            "testing.copy.dir": str(tmp_path / "copies"),
            "testing.crash.at": point,
            "testing.crash.flag": str(flag),
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 1500, seed=45)
    first = JobCoordinator(config, InlineRunner())
    first.start()
    meta = first.partition_metadata(first.all_ssps())
    end = {s: m.upcoming for s, m in meta.items()}
    first.run_batch(end, commit=True)
    if point == "during-restore":
        shutil.rmtree(config.store_base_dir)  # the next start must restore from a backend
        first.close()
        with pytest.raises(InjectedCrash):
            run(config, until_caught_up=True)
    else:
        # at an asynchronous step the worker "dies" in the upload thread: the next commit
        # reports the lost upload, naming task and checkpoint
        with pytest.raises((InjectedCrash, CommitError)):
            for _ in range(5):
                first.run_batch(end, commit=True)
        first.close()
    assert not flag.exists(), f"the crash point {point} was never reached"
    assert_committed_state_matches_its_offsets(config)
    run(config, until_caught_up=True)
    assert_committed_state_matches_its_offsets(config)
    assert committed_counts(config) == dict(expected)
    assert_at_least_once(emitted_counts(config), expected)
