"""User errors give one clear line, a non-zero exit and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.config import load_config, parse_overrides
from tests.e2e.cli import JOB, sp
from tests.helpers import generate


def assert_one_line_error(stderr: str, *needles: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], stderr


def test_bad_job_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("job:\n  name: x\ntask:\n  comit.ms: 5\n")
    proc = sp("config", "show", str(bad), check=False)
    assert proc.returncode == 2
    assert_one_line_error(
        proc.stderr, "unknown config key task.comit.ms", "did you mean task.commit.ms"
    )


def test_unknown_stream(tmp_path: Path) -> None:
    proc = sp("stream", "read", str(JOB), "nope", "--set", f"job.data.dir={tmp_path}", check=False)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "stream filelog.nope does not exist")


@pytest.mark.slow
def test_corrupt_record_stops_the_job_with_its_location(tmp_path: Path) -> None:
    sets = [f"job.data.dir={tmp_path / 'data'}"]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", "--set", sets[0])
    generate(config, tmp_path / "job.yaml", 400, seed=5)
    log = next((tmp_path / "data" / "streams" / "filelog" / "pageviews" / "1").glob("*.log"))
    raw = bytearray(log.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # flip a byte in the middle of partition 1
    log.write_bytes(bytes(raw))
    proc = sp("run", str(JOB), "--until-caught-up", "--set", sets[0], check=False)
    assert proc.returncode != 0
    assert_one_line_error(proc.stderr, "pageviews", "partition 1", "offset")


def test_run_of_a_pipeline_that_cannot_be_imported() -> None:
    proc = sp("run", "no_such_module:job", check=False)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "no_such_module:job: cannot import it")
    proc = sp("run", "pageviews_task:PageViewCounter", check=False)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "is the class PageViewCounter, not a sparkpoint Pipeline")


def test_an_unwritable_directory_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37: a read-only blob, stream or state directory was an OSError traceback (tried
    in-process: as root, chmod does not stop writes)."""
    import errno
    import tempfile

    from sparkpoint.cli import main

    def denied(*args: object, **kwargs: object) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "data"))

    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    code = main(
        ["stream", "create", str(JOB), "pageviews", "--set", f"job.data.dir={tmp_path / 'data'}"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert_one_line_error(err, "Permission denied: ", str(tmp_path / "data"), "not writable")
