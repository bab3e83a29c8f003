"""``sparkpoint run --log-format json``: the driver's log records, each batch and the end of the
run are one JSON object per line (the JVM's own start-up noise is not sparkpoint's: with -v it
passes through as it is), and a failed run's error line is JSON too."""

from __future__ import annotations

import json
from pathlib import Path

from sparkpoint.config import load_config, parse_overrides
from tests.e2e.cli import JOB, sp
from tests.helpers import generate


def json_lines(stderr: str) -> list[dict[str, object]]:
    lines = [line for line in stderr.splitlines() if line.startswith("{")]
    return [json.loads(line) for line in lines]


def test_a_run_logs_json_lines(tmp_path: Path) -> None:
    sets = [f"job.data.dir={tmp_path / 'data'}"]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    generate(config, tmp_path / "job.yaml", 2_000, seed=13, users=20)
    result = sp("run", str(JOB), "--until-caught-up", "--log-format", "json", "-v", *set_args)
    lines = json_lines(result.stderr)
    events = [line.get("event") for line in lines]
    assert events[0] == "starting"
    assert events.index("start") < events.index("batch") < events.index("done")
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert all(line["job"] == "pageviews" for line in lines)
    assert any(
        line["logger"].startswith("sparkpoint.") and line["level"] == "INFO" and "event" not in line
        for line in lines
    )  # a log record (-v: INFO)
    done = lines[events.index("done")]
    assert done["processed"] == 2_000
    others = [x for x in result.stderr.splitlines() if x and not x.startswith("{")]
    assert others == ["WARNING: Using incubator modules: jdk.incubator.vector"]  # -v: shown


def test_a_failed_run_s_error_line_is_json(tmp_path: Path) -> None:
    result = sp(
        "run",
        str(JOB),
        "--log-format",
        "json",
        "--set",
        "task.commit.ms=soon",
        "--set",
        f"job.data.dir={tmp_path}",
        check=False,
    )
    assert result.returncode == 2
    (line,) = json_lines(result.stderr)
    assert line["level"] == "ERROR"
    assert str(line["message"]).startswith("error: task.commit.ms='soon' is invalid")
