"""`sparkpoint state check` says what it checked (issue 37: with no blob store it said "every
referenced blob exists")."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.cli import main
from sparkpoint.config import load_config
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import EXAMPLE_DIR, pageviews_config
from tests.helpers import generate


@pytest.mark.parametrize("backend", ["changelog", "blobstore"])
def test_state_check_says_what_it_checked(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = {"stores.user-counts.backup.factories": backend, "task.commit.ms": "0"}
    if backend == "changelog":
        sets["stores.user-counts.changelog"] = "filelog.user-counts-changelog"
    config = load_config(None, pageviews_config(tmp_path, **sets))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    generate(config, tmp_path / "a.yaml", 200, seed=21)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.run(until_caught_up=True)
    coordinator.close()
    args = [f"{k}={v}" for k, v in {**sets, "job.data.dir": str(tmp_path / "data")}.items()]
    code = main(
        ["state", "check", str(EXAMPLE_DIR / "job.yaml"), *(a for s in args for a in ("--set", s))]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    if backend == "changelog":
        assert out.startswith("nothing to check: none of the job's 4 checkpoints (V2) names")
    else:
        assert out.startswith("ok: 4 snapshots of 4 checkpoints, ")
        assert "every blob exists and matches its size and checksum" in out
