"""The task API: coordinator.shutdown(), window(), and a task whose local state is gone."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import load_config
from sparkpoint.model import SystemStream
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import read_json_lines
from tests.conftest import pageviews_config
from tests.helpers import committed_counts, generate


def test_shutdown_request_stops_after_the_batch_with_a_commit(tmp_path: Path) -> None:
    values = pageviews_config(
        tmp_path,
        **{
            "task.class": "control_task:ShutdownAfter",
            "task.commit.ms": "3600000",
            "task.batch.max.messages": "5",
            "task.window.ms": "0",
        },
    )
    config = load_config(None, values)
    systems = Systems(config)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", 1))
    producer = systems.producer("filelog")
    for i in range(20):
        value = {"stop": i == 7}
        producer.send("pageviews", 0, Record("", b"k", json.dumps(value).encode(), i))
    producer.flush()
    coordinator = JobCoordinator(config, InlineRunner())
    summary = coordinator.run()
    coordinator.close()
    assert summary.stopped_by == "a task asked to shut down"
    assert summary.batches == 2  # offsets 0-4, then 5-9 in which offset 7 asked to stop
    ckpt = CheckpointManager(config).read_all()
    (only,) = ckpt.values()
    assert {str(s): o for s, o in only.input_offsets.items()} == {"filelog.pageviews.0": "9"}
    counts = committed_counts(config)
    assert counts["seen"] == 10
    assert counts["windows"] == 2
    windows = list(read_json_lines(config, systems, SystemStream("filelog", "windows")))
    assert len(windows) == 2


def test_lost_local_state_starts_empty_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(None, pageviews_config(tmp_path, **{"task.commit.ms": "0"}))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 400, seed=8)
    JobCoordinator(config, InlineRunner()).run(until_caught_up=True)
    shutil.rmtree(config.store_base_dir)  # a lost host
    generate(config, tmp_path / "job2.yaml", 40, seed=9)
    with caplog.at_level(logging.WARNING):
        JobCoordinator(config, InlineRunner()).run(until_caught_up=True)
    assert "no local checkpoint" in caplog.text and "starting EMPTY" in caplog.text
    assert sum(committed_counts(config).values()) == 40  # only what came after the loss
