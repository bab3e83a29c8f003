"""Issue 37's driver holes, on the inline runner: no input skipped when a checkpointed offset is
outside its partition, one driver per job, and checkpoints that keep moving after a clock jump."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkpoint.checkpoint import id as checkpoint_id
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.checkpoint.offsets import OffsetOutOfRange
from sparkpoint.config import Config, load_config
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import LIVENESS, DriverConflict, is_running
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.helpers import committed_counts, generate


def make(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path, **{"task.batch.max.messages": "200", "task.commit.ms": "0", **overrides}
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    return config


def run(config: Config, **kwargs: object) -> None:
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.run(**kwargs)  # type: ignore[arg-type]
    finally:
        coordinator.close()


def recreate_input(config: Config) -> None:
    """Delete the input stream and create it again, empty (as a user or a tool might)."""
    shutil.rmtree(config.data_dir / "streams" / "filelog" / "pageviews")
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))


def test_a_recreated_input_stops_the_job_instead_of_skipping_what_is_written_again(
    tmp_path: Path,
) -> None:
    """The campaign lost 600 of 1,800 views: after the stream was recreated the job waited
    until the log grew past the checkpointed offsets and skipped everything before them."""
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 1200, seed=71)
    run(config, until_caught_up=True)
    before = CheckpointManager(config).read_all()
    recreate_input(config)
    generate(config, tmp_path / "b.yaml", 600, seed=72)
    with pytest.raises(OffsetOutOfRange) as caught:
        run(config, until_caught_up=True)
    text = str(caught.value)
    assert "is outside what the partition holds" in text and "recreated" in text
    assert "startpoint set <job> --stream pageviews --partition" in text
    assert CheckpointManager(config).read_all() == before  # nothing committed, nothing skipped
    # the fix the message names: a startpoint to the oldest offset of every partition
    from sparkpoint.model.startpoint import StartpointOldest
    from sparkpoint.startpoint.manager import StartpointManager

    store = CoordinatorStreamStore(config)
    for ssp in Systems(config).job_inputs(config.inputs, [])[0]:
        StartpointManager(store).write_startpoint(ssp, StartpointOldest())
    store.close()
    counts_before = committed_counts(config)
    run(config, until_caught_up=True)
    after = committed_counts(config)
    assert sum(after.values()) - sum(counts_before.values()) == 600


def test_a_stream_recreated_under_a_running_job_stops_it_before_the_next_batch(
    tmp_path: Path,
) -> None:
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 800, seed=73)
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.start()
        end = {
            s: m.upcoming for s, m in coordinator.partition_metadata(coordinator.all_ssps()).items()
        }
        coordinator.run_batch(end, commit=True)
        recreate_input(config)
        generate(config, tmp_path / "b.yaml", 40, seed=74)
        with pytest.raises(OffsetOutOfRange, match=r"next offset to read, \d+, is outside"):
            coordinator.run(max_batches=1)
    finally:
        coordinator.close()


def beat(config: Config, **fields: object) -> None:
    """Write a driver heartbeat as another driver would."""
    store = CoordinatorStreamStore(config, source="heartbeat")
    value = {"host": socket.gethostname(), "pid": os.getpid(), "run-id": "other", **fields}
    value.setdefault("heartbeat", int(time.time() * 1000))
    store.put(LIVENESS, "driver", json.dumps(value))
    store.close()


def test_a_second_driver_is_refused_while_the_first_is_alive(tmp_path: Path) -> None:
    """The campaign started a second `sparkpoint run` of a running job on one host; both then
    failed on RocksDB files the other had changed."""
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 200, seed=75)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        beat(config, pid=sleeper.pid)  # a live driver process on this host
        with pytest.raises(DriverConflict, match=rf"running already \(host .*pid {sleeper.pid}"):
            run(config, until_caught_up=True)
        beat(config, host="elsewhere.example", pid=1)  # a fresh heartbeat from another host
        with pytest.raises(DriverConflict, match="--force"):
            run(config, until_caught_up=True)
        assert CheckpointManager(config).read_all() == {}  # the refused drivers did nothing
        # --force takes over; its clean stop removes only its own heartbeat
        coordinator = JobCoordinator(config, InlineRunner(), force=True)
        coordinator.run(until_caught_up=True)
        coordinator.close()
        assert len(CheckpointManager(config).read_all()) == 4
    finally:
        sleeper.kill()
        sleeper.wait()
    # a heartbeat left by a process of this host that is gone (kill -9) does not block
    beat(config, pid=sleeper.pid)
    assert is_running(CoordinatorStreamStore(config)) is None
    run(config, until_caught_up=True)


def test_a_driver_that_finds_another_one_beating_stops_without_committing(
    tmp_path: Path,
) -> None:
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 400, seed=76)
    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.start()
        assert coordinator.heartbeat is not None
        beat(config, host="elsewhere.example", pid=1, **{"run-id": "taker"})  # forced start
        coordinator.heartbeat.check()  # what the heartbeat thread does every few seconds
        with pytest.raises(DriverConflict, match="another driver took this job over"):
            coordinator.run(until_caught_up=True)
        assert CheckpointManager(config).read_all() == {}
    finally:
        coordinator.close()
    # the loser's clean-up left the other driver's heartbeat in place
    beat_now = is_running(CoordinatorStreamStore(config))
    assert beat_now is not None and beat_now["run-id"] == "taker"


def test_checkpoints_keep_moving_after_the_clock_jumps_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The campaign's checkpoint from a day ahead (clock skew between drivers) made every later
    commit an "older" id that was dropped: checkpoints stuck, every restart re-read input."""
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 600, seed=77)
    day = 86_400 * 10**9
    real = time.time_ns
    monkeypatch.setattr(checkpoint_id.time, "time_ns", lambda: real() + day)
    run(config, until_caught_up=True)
    ahead = CheckpointManager(config).read_all()
    monkeypatch.setattr(checkpoint_id.time, "time_ns", real)
    monkeypatch.setattr(checkpoint_id._ISSUED, "last", (0, 0))  # a fresh process, slower clock
    generate(config, tmp_path / "b.yaml", 400, seed=78)
    run(config, until_caught_up=True)
    after = CheckpointManager(config).read_all()
    assert sum(int(o) + 1 for c in after.values() for o in c.input_offsets.values()) == 1000
    for task, checkpoint in after.items():
        assert checkpoint.checkpoint_id > ahead[task].checkpoint_id
    assert sum(committed_counts(config).values()) == 1000
