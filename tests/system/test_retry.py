"""Transient faults in the driver's reads and writes of its metadata streams are retried (issue
37: one in the coordinator stream's read ended the run with a traceback); other errors are not."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore, MetadataStreamError
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.filelog.system import FileLogConsumer, FileLogProducer
from sparkpoint.system.registry import Systems
from sparkpoint.system.retry import is_transient, retry_transient
from sparkpoint.testing.faults import InjectedFault
from tests.conftest import pageviews_config
from tests.helpers import committed_counts, generate


def failing(times: int, exc: Exception) -> Callable[[], str]:
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if calls["n"] <= times:
            raise exc
        return f"done after {calls['n']}"

    return fn


def test_transient_faults_are_retried_and_others_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sparkpoint.system.retry.time.sleep", lambda s: None)
    eio = OSError(errno.EIO, "Input/output error")
    assert retry_transient("x", failing(3, eio)) == "done after 4"
    with pytest.raises(OSError, match="Input/output"):
        retry_transient("x", failing(4, eio))  # four tries in all
    with pytest.raises(PermissionError):
        retry_transient("x", failing(1, PermissionError(errno.EACCES, "denied")))
    assert is_transient(TimeoutError()) and is_transient(ConnectionResetError())
    assert is_transient(InjectedFault("injected"))
    assert not is_transient(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_transient(FileNotFoundError(errno.ENOENT, "gone"))
    assert not is_transient(ValueError("bad"))


def make(tmp_path: Path) -> Config:
    values = pageviews_config(tmp_path, **{"task.commit.ms": "0"})
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    return config


def test_a_job_runs_through_transient_faults_in_its_metadata_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 400, seed=81)
    monkeypatch.setattr("sparkpoint.system.retry.time.sleep", lambda s: None)
    read, flush = FileLogConsumer.read, FileLogProducer.flush
    faults = {"read": 0, "flush": 0}

    def flaky_read(self: FileLogConsumer, ssp, *args, **kwargs):  # type: ignore[no-untyped-def]
        if ssp.stream.startswith("__") and faults["read"] < 3:  # the metadata streams
            faults["read"] += 1
            raise OSError(errno.EIO, "Input/output error")
        return read(self, ssp, *args, **kwargs)

    def flaky_flush(self: FileLogProducer) -> None:
        if faults["flush"] < 3:
            faults["flush"] += 1
            raise OSError(errno.EIO, "Input/output error")
        flush(self)

    monkeypatch.setattr(FileLogConsumer, "read", flaky_read)
    monkeypatch.setattr(FileLogProducer, "flush", flaky_flush)
    with caplog.at_level("WARNING"):
        coordinator = JobCoordinator(config, InlineRunner())
        coordinator.run(until_caught_up=True)
        coordinator.close()
    assert faults == {"read": 3, "flush": 3}
    assert "failed (OSError: [Errno 5] Input/output error); trying again" in caplog.text
    assert committed_counts(config) == dict(expected)
    assert len(CheckpointManager(config).read_all()) == 4
    assert CoordinatorStreamStore(config).all("set-config")  # the config was stored


def test_a_coordinator_stream_that_keeps_failing_at_start_is_one_line_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 72: a coordinator-stream write that failed past its retries at start (the
    standby and locality metadata) ended the run with a Python traceback. It is one line
    naming the stream and what to fix, and the next run, the fault gone, is exact."""
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 200, seed=82)
    monkeypatch.setattr("sparkpoint.system.retry.time.sleep", lambda s: None)
    flush = FileLogProducer.flush
    failing = {"on": True}

    def broken_flush(self: FileLogProducer) -> None:
        if failing["on"]:
            raise OSError(errno.EIO, "Input/output error")
        flush(self)

    monkeypatch.setattr(FileLogProducer, "flush", broken_flush)
    with pytest.raises(MetadataStreamError) as failed:
        coordinator = JobCoordinator(config, InlineRunner())
        try:
            coordinator.run(until_caught_up=True)
        finally:
            coordinator.close()
    line = str(failed.value)
    assert line.startswith("coordinator stream filelog.__coordinator-pageviews-1.0: ")
    assert "\n" not in line
    assert "writing the job's metadata failed (OSError: [Errno 5] Input/output error)" in line
    assert line.endswith("fix system filelog (its disk, permissions or server), then run again")
    failing["on"] = False
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.run(until_caught_up=True)
    coordinator.close()
    assert committed_counts(config) == dict(expected)
