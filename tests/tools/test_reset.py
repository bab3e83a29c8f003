"""`sparkpoint job reset` starts a job over (issue 37: there was no reset, and deleting
`.sparkpoint/<job>` also deleted the embedded input)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import load_config
from sparkpoint.errors import UserError
from sparkpoint.metadata.job_state import DriverConflict
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.reset import reset_job
from tests.conftest import pageviews_config
from tests.helpers import committed_counts, generate

CHANGELOG = {"stores.user-counts.changelog": "filelog.user-counts-changelog", "task.commit.ms": "0"}


def run(config: object) -> None:
    coordinator = JobCoordinator(config, InlineRunner())  # type: ignore[arg-type]
    coordinator.run(until_caught_up=True)
    coordinator.close()


def test_reset_keeps_the_input_and_reruns_it_from_scratch(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "a.yaml", 400, seed=51)
    run(config)
    assert committed_counts(config) == dict(expected)
    before = Systems(config).admin("filelog").list_streams()
    plan = reset_job(config, dry_run=True)  # issue 72: say what would go, delete nothing
    assert "would delete stream filelog.user-counts-changelog" in plan
    assert any(line.startswith("would delete local state ") for line in plan)
    assert "would delete stream filelog.pageviews" not in plan
    assert Systems(config).admin("filelog").list_streams() == before
    assert committed_counts(config) == dict(expected)
    done = reset_job(config)  # the input is kept by default (issue 72)
    assert sorted(line.replace("would delete", "deleted") for line in plan) == sorted(done)
    assert "deleted stream filelog.user-counts-changelog" in done
    assert "deleted stream filelog.user-counts" in done  # an output, under job.data.dir
    assert any(line.startswith("deleted local state ") for line in done)
    assert "deleted stream filelog.pageviews" not in done
    streams = Systems(config).admin("filelog").list_streams()
    assert streams == ["pageviews"]
    run(config)  # from scratch: every view counted once, not twice
    assert committed_counts(config) == dict(expected)


@pytest.mark.parametrize("dies_at", [0, 1, 2, 3, 4])
def test_a_reset_that_dies_half_way_never_starts_a_re_key_over_on_what_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dies_at: int
) -> None:
    """A reset killed before its last deletion: the job refuses to start, naming the reset to
    run again, and that gives exact counts. (The checkpoints went first, so the next start
    read the surviving intermediate stream from its oldest record: every view counted twice,
    a reviewer's script.)"""
    from sparkpoint.system.filelog.system import FileLogAdmin
    from tests.runtime.driver.test_intermediate import per_user, rekey_job, views

    # the metadata on a system listed before the checkpoints' (its stream went first)
    config = rekey_job(
        tmp_path,
        **{
            "systems.a.factory": "filelog",
            "systems.a.path": str(tmp_path / "data" / "streams" / "a"),
            "job.coordinator.system": "a",
            "task.checkpoint.system": "filelog",
        },
    )
    written = views(config, tmp_path, 200, seed=55)
    run(config)
    delete, deleted = FileLogAdmin.delete_stream, []

    def dying(self: FileLogAdmin, name: str) -> bool:
        if len(deleted) == dies_at:
            raise KeyboardInterrupt(f"killed before deleting {name}")
        deleted.append(name)
        return delete(self, name)

    monkeypatch.setattr(FileLogAdmin, "delete_stream", dying)
    with pytest.raises(KeyboardInterrupt):
        reset_job(config, keep_input=True)
    monkeypatch.setattr(FileLogAdmin, "delete_stream", delete)
    # the checkpoints go after everything else, the metadata (its pending record) last
    assert not any(name.startswith("__coordinator") for name in deleted)
    assert all(not name.startswith("__checkpoint") for name in deleted[:-1])
    with pytest.raises(UserError, match=r"job rekey: a job reset did not finish .* job reset"):
        run(config)
    reset_job(config, keep_input=True)
    run(config)
    assert committed_counts(config) == per_user(written)


def test_reset_without_keep_input_deletes_the_input_too(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "a.yaml", 100, seed=52)
    run(config)
    assert "deleted stream filelog.pageviews" in reset_job(config, keep_input=False)
    assert Systems(config).admin("filelog").list_streams() == []
    assert CheckpointManager(config).read_all() == {}


def test_reset_is_refused_while_the_job_runs_and_for_streams_it_cannot_delete(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from tests.runtime.driver.test_driver_safety import beat

    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        beat(config, pid=driver.pid)  # a live driver of this job on this host
        with pytest.raises(DriverConflict, match="is running already"):
            reset_job(config, keep_input=True)
        assert "pageviews" in Systems(config).admin("filelog").list_streams()
    finally:
        driver.kill()
        driver.wait()
    kafka = load_config(
        None,
        pageviews_config(
            tmp_path / "k",
            **{"systems.k.factory": "kafka", "systems.k.consumer.bootstrap.servers": "x:1"},
            **{"stores.user-counts.changelog": "k.counts-changelog"},
        ),
    )
    with pytest.raises(UserError, match="keeps k.counts-changelog elsewhere"):
        reset_job(kafka, keep_input=True)


def test_a_driver_that_claims_the_job_while_a_reset_starts_runs_on_and_nothing_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver reads the reset's pending record after it claims the job; the reset checks for
    a driver again after writing that record: whichever comes second stops, so a driver never
    runs while its streams are deleted. Here the driver claims in between."""
    import subprocess
    import sys

    from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
    from sparkpoint.metadata.job_state import RESET
    from tests.runtime.driver.test_driver_safety import beat

    config = load_config(None, pageviews_config(tmp_path, **CHANGELOG))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "a.yaml", 100, seed=53)
    run(config)
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    put = CoordinatorStreamStore.put

    def claimed_meanwhile(self: CoordinatorStreamStore, namespace: str, key: str, v: str) -> None:
        if namespace == RESET:
            beat(config, pid=driver.pid)  # the driver's claim, just before the record
        put(self, namespace, key, v)

    monkeypatch.setattr(CoordinatorStreamStore, "put", claimed_meanwhile)
    try:
        with pytest.raises(DriverConflict, match="is running already"):
            reset_job(config, keep_input=True)
    finally:
        driver.kill()
        driver.wait()
    monkeypatch.undo()
    streams = Systems(config).admin("filelog").list_streams()
    assert {"pageviews", "user-counts-changelog"} <= set(streams)
    probe = CoordinatorStreamStore(config, Systems(config), source="test")
    try:
        assert probe.get(RESET, "pending") is None  # the job starts as before
    finally:
        probe.close()
    assert committed_counts(config)
