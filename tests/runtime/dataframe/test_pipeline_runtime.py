"""The DataFrame API shares the task API's runtime: state backends and startpoints."""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pageviews_pipeline import job as example_pipeline

from sparkpoint.config import Config, load_config
from sparkpoint.model import SystemStreamPartition
from sparkpoint.model.startpoint import StartpointOldest
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.startpoints import set_startpoints
from tests.conftest import pageviews_config
from tests.helpers import (
    assert_committed_state_matches_its_offsets,
    committed_counts,
    counts_at_offsets,
    generate,
    run_until_caught_up,
)


def _config(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path, **{"task.batch.max.messages": "400", "task.commit.ms": "0", **overrides}
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    return config


def _run(spark: Any, config: Config) -> None:
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, example_pipeline, config)))


def test_dual_commit_and_restore_from_each_backend_alone(
    tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sparkpoint.runtime")
    base = {
        "stores.user-counts.changelog": "filelog.user-counts-changelog",
        "stores.user-counts.backup.factories": "changelog,blobstore",
        "task.checkpoint.read.versions": "2",
    }
    config = _config(tmp_path, **base)
    expected = generate(config, tmp_path / "job.yaml", 1200, seed=21, users=30)
    _run(spark, config)
    assert committed_counts(config) == dict(expected)
    for seed, prefer in ((22, "blobstore"), (23, "changelog")):
        shutil.rmtree(config.store_base_dir)  # the host is gone: local state and checkpoints
        caplog.clear()
        expected += generate(config, tmp_path / "job.yaml", 600, seed=seed, users=30)
        restoring = load_config(
            None, {**config.to_dict(), "stores.user-counts.restore.factories": prefer}
        )
        _run(spark, restoring)
        assert f"state from {prefer}" in caplog.text
        assert committed_counts(config) == dict(expected)
        assert_committed_state_matches_its_offsets(config)


def test_startpoint_rewinds_a_pipeline_input_and_keeps_state(tmp_path: Path, spark: Any) -> None:
    config = _config(tmp_path)
    expected = generate(config, tmp_path / "job.yaml", 800, seed=24, users=30)
    _run(spark, config)
    assert committed_counts(config) == dict(expected)
    ssp = SystemStreamPartition("filelog", "pageviews", 2)
    set_startpoints(config, "pageviews", StartpointOldest(), partitions=[2])
    _run(spark, config)
    newest = Systems(config).admin("filelog").get_metadata([ssp])[ssp].newest
    assert newest is not None
    again: Counter[str] = counts_at_offsets(config, {ssp: newest})
    assert sum(again.values()) > 0
    assert committed_counts(config) == dict(expected + again)
