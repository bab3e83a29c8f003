"""The fault kit of sparkpoint.testing: a blob store and a system that fail on purpose."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.testing.faults import InjectedFault
from sparkpoint.tools.state import check_blobs
from tests.helpers import changelog_job as make
from tests.helpers import committed_counts, generate
from tests.helpers import run_job as run


def test_a_flaky_blob_store_loses_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """10% of blob operations fail and 10% of uploads stop half-way: retries absorb them, every
    checkpoint's snapshot is whole, and a restore from it is exact."""
    flaky = {
        "stores.user-counts.changelog": "",
        "stores.user-counts.backup.factories": "blobstore",
        "blob.store.manager.factory": "sparkpoint.testing.faults:flaky_blob_store",
        "blob.store.retry.backoff.ms": "1",
        "testing.blob.fail.ratio": "0.1",
        "testing.blob.partial.ratio": "0.1",
        "testing.faults.seed": "7",
    }
    config = make(tmp_path, **flaky)
    expected = generate(config, tmp_path / "a.yaml", 600, seed=81, users=15)
    run(config, until_caught_up=True)
    assert "injected" in caplog.text  # failures happened and were retried
    shutil.rmtree(config.store_base_dir)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert check_blobs(config) == []


def test_a_flaky_system_fails_reads_and_writes(tmp_path: Path) -> None:
    config = make(
        tmp_path,
        **{
            "systems.flaky.factory": "sparkpoint.testing.faults:FlakyFileLogSystemFactory",
            "systems.flaky.path": str(tmp_path / "flaky"),
            "testing.system.fail.ratio": "1",
        },
    )
    from sparkpoint.system.base import StreamSpec

    systems = Systems(config)
    systems.admin("flaky").create_stream(StreamSpec("s", 1))
    with pytest.raises(InjectedFault, match="injected produce failure to s.0"):
        systems.producer("flaky").send("s", 0, Record("", b"k", b"v", 0))
    with pytest.raises(InjectedFault, match=r"injected fetch failure reading flaky.s.0"):
        systems.consumer("flaky").read(SystemStreamPartition("flaky", "s", 0), "0", "1")
