"""The checkpoint tool rewinds a stopped job; bad input writes nothing and says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import load_config
from sparkpoint.errors import UserError
from sparkpoint.metadata.job_state import Heartbeat
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.checkpoints import set_checkpoints
from tests.conftest import pageviews_config
from tests.helpers import committed_counts, generate, live_counts


def test_rewind_a_stopped_job(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path, **{"task.commit.ms": "0"}))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 800, seed=31)
    JobCoordinator(config, InlineRunner()).run(until_caught_up=True)
    before = CheckpointManager(config).read_all()
    counts_before = committed_counts(config)
    offsets = tmp_path / "offsets.yaml"
    offsets.write_text("filelog.pageviews.1: 9\nPartition 2:\n  filelog.pageviews.2: -1\n")
    written = set_checkpoints(config, offsets)
    p1 = SystemStreamPartition("filelog", "pageviews", 1)
    assert written[TaskName("Partition 1")].input_offsets[p1] == "9"
    assert (
        written[TaskName("Partition 1")].checkpoint_id
        == before[TaskName("Partition 1")].checkpoint_id
    )
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    assert coordinator.tasks["Partition 1"].resume[p1] == "10"  # the first batch reads from here
    p2 = SystemStreamPartition("filelog", "pageviews", 2)
    assert coordinator.tasks["Partition 2"].resume[p2] == "0"
    p0 = SystemStreamPartition("filelog", "pageviews", 0)
    assert coordinator.tasks["Partition 0"].resume[p0] == str(
        int(before[TaskName("Partition 0")].input_offsets[p0]) + 1
    )
    summary = coordinator.run(until_caught_up=True)
    upcoming = {s: int(m.upcoming) for s, m in coordinator.partition_metadata([p1, p2]).items()}
    assert summary.processed == (upcoming[p1] - 10) + upcoming[p2]
    # input was rewound, state was not: re-read views are counted again
    after = committed_counts(config)
    assert sum(after.values()) == sum(counts_before.values()) + summary.processed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("filelog.pageviews.7: 1\n", "filelog.pageviews.7 is not an input of job pageviews"),
        ("filelog.pageviews.1: 100000\n", "offset 100000 does not exist"),
        ("filelog.pageviews.1: -5\n", "offset -5 does not exist"),
        ("Partition 9:\n  filelog.pageviews.1: 1\n", "no task Partition 9"),
        (
            "Partition 0:\n  filelog.pageviews.1: 1\n",
            "is read by task Partition 1, not Partition 0",
        ),
    ],
)
def test_bad_offsets_write_nothing(tmp_path: Path, text: str, message: str) -> None:
    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 100, seed=32)
    offsets = tmp_path / "offsets.yaml"
    offsets.write_text("filelog.pageviews.0: 1\n" + text)
    with pytest.raises(UserError, match=message):
        set_checkpoints(config, offsets)
    assert CheckpointManager(config).read_all() == {}


def test_refuses_while_the_job_runs(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 100, seed=33)
    offsets = tmp_path / "offsets.yaml"
    offsets.write_text("filelog.pageviews.0: 1\n")
    beat = Heartbeat(config, "r")
    beat.start()
    try:
        with pytest.raises(UserError, match="is running"):
            set_checkpoints(config, offsets)
        assert set_checkpoints(config, offsets, force=True)
    finally:
        beat.stop()


@pytest.mark.parametrize(
    ("backends", "versions"),
    [
        # issue 11: dual commit, the old default of reading V1 only
        ({"stores.user-counts.backup.factories": "changelog,blobstore"}, "1"),
        # a job that only ever wrote V1: changelog markers come from the V1 changelog offsets
        ({}, "1-only"),
    ],
)
def test_checkpoint_set_keeps_the_state_restorable(
    tmp_path: Path, backends: dict[str, str], versions: str
) -> None:
    """Issue 11: `checkpoint set` carries the last checkpoint's state markers forward, so a
    restore after the rewind still finds the committed state (it used to restore an older or
    empty store)."""
    import shutil

    read_write = (
        {"task.checkpoint.read.versions": "1", "task.checkpoint.write.versions": "1"}
        if versions == "1-only"
        else {
            "task.checkpoint.read.versions": "1",
            "stores.user-counts.restore.factories": "changelog",
        }
    )
    values = pageviews_config(
        tmp_path,
        **{
            "task.commit.ms": "0",
            "stores.user-counts.changelog": "filelog.user-counts-changelog",
            **backends,
            **read_write,
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "job.yaml", 800, seed=32)
    JobCoordinator(config, InlineRunner()).run(until_caught_up=True)
    counts = committed_counts(config)
    offsets = tmp_path / "offsets.yaml"
    offsets.write_text("filelog.pageviews.0: 5\n")
    written = set_checkpoints(config, offsets)[TaskName("Partition 0")]
    expected_backends = {"changelog"} | ({"blobstore"} if backends else set())
    assert set(written.state_checkpoint_markers) == expected_backends
    if versions == "1-only":
        v1 = CheckpointManager(config).read_version(1)[TaskName("Partition 0")]
        changelog = SystemStreamPartition("filelog", "user-counts-changelog", 0)
        assert v1.input_offsets[changelog].startswith(f"{written.checkpoint_id}:")
    # lose every executor's disk; restore from the backends (blob store first if there is one)
    shutil.rmtree(config.store_base_dir)
    restore = {"stores.user-counts.restore.factories": "blobstore"} if backends else {}
    again = load_config(None, {**values, **restore, "task.checkpoint.read.versions": "2,1"})
    if versions == "1-only":
        again = load_config(None, {**values, "task.checkpoint.read.versions": "1"})
    coordinator = JobCoordinator(again, InlineRunner())
    coordinator.start()
    nothing_new = {s: ts.resume[s] for ts in coordinator.tasks.values() for s in ts.model.ssps}
    coordinator.run_batch(nothing_new, commit=False)
    coordinator.close()
    assert live_counts(again) == counts  # the state as committed, not an older one


def test_a_binary_offsets_file_is_one_line(tmp_path: Path) -> None:
    """Issue 37: a binary `checkpoint set` file gave a UnicodeDecodeError traceback."""
    from sparkpoint.system.streams import job_model
    from sparkpoint.tools.checkpoints import parse_offsets_file

    config = load_config(None, pageviews_config(tmp_path))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    offsets = tmp_path / "offsets.bin"
    offsets.write_bytes(bytes(range(256)))
    with pytest.raises(UserError, match=r"offsets.bin: not UTF-8 text \(expected YAML"):
        parse_offsets_file(offsets, job_model(config, Systems(config)))
