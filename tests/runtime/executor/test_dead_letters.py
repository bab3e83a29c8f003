"""The dead-letter stream in the task API (issue 66): a record that cannot be decoded, has no
event time, or whose process() raises (task.dlq.on) goes to task.dlq.stream with its key as it
was and its value kept whole, with where it came from and what went wrong; the job goes on
and counts everything else exactly. Dead letters are output like any other: exactly-once,
each is published once. The stream is read back with json and base64 alone."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import faulty_task
import pytest

from tests.helpers import add_input, committed_counts, dead_letters, generate
from tests.helpers import changelog_job as make
from tests.helpers import run_job as run

DLQ = {"task.dlq.stream": "filelog.dead-letters"}


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_bad_records_go_to_the_dead_letter_stream_and_the_job_goes_on(
    tmp_path: Path, guarantee: str
) -> None:
    config = make(
        tmp_path,
        **{
            **DLQ,
            "task.dlq.on": "both",
            "task.class": "faulty_task:PoisonCounter",
            "job.processing.guarantee": guarantee,
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 200, seed=94, users=8)
    not_json = b"{oops"
    add_input(config, not_json, user="broken")
    poison = json.dumps({"user": "poison", "page": "/"}).encode()
    add_input(config, poison, user="poison")
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)  # everything else counted once
    letters = dead_letters(config)
    assert [k for k, _ in letters] == [b"broken", b"poison"]  # keys as they were
    (_, bad), (_, failed) = letters
    assert base64.b64decode(bad["value"]) == not_json  # values kept whole
    assert base64.b64decode(failed["value"]) == poison
    assert bad["reason"] == "decode" and failed["reason"] == "process"
    assert bad["source"]["stream"] == "pageviews" and bad["source"]["partition"] == 2
    assert int(failed["source"]["offset"]) == int(bad["source"]["offset"]) + 1
    assert failed["error"]["class"] == "builtins.ValueError"
    assert failed["error"]["at"].startswith(f"{faulty_task.__file__}:")
    assert "task" in bad and "checkpoint" in bad and bad["attempt"] == 0
    run(config, until_caught_up=True)  # run again: nothing more
    assert len(dead_letters(config)) == 2


def test_by_default_only_records_that_cannot_be_decoded_go_there(tmp_path: Path) -> None:
    config = make(tmp_path, **{**DLQ, "task.class": "faulty_task:PoisonCounter"})
    generate(config, tmp_path / "a.yaml", 50, seed=95, users=8)
    add_input(config, b"{oops", user="broken")
    run(config, until_caught_up=True)
    assert [r["reason"] for _, r in dead_letters(config)] == ["decode"]
    add_input(config, json.dumps({"user": "poison", "page": "/"}).encode(), user="poison")
    from sparkpoint.errors import TaskError

    with pytest.raises(TaskError, match="failed processing filelog.pageviews.2"):
        run(config, until_caught_up=True)  # task.dlq.on=decode: a failure in process() stops


def test_a_record_without_its_event_time_goes_there_too(tmp_path: Path) -> None:
    """Issue 72: a record without its event time could not be skipped by any policy."""
    config = make(tmp_path, **{**DLQ, "streams.pageviews.event.time.field": "ts"})
    add_input(config, json.dumps({"user": "u1", "page": "/", "ts": 5}).encode(), user="u1")
    add_input(config, json.dumps({"user": "u2", "page": "/"}).encode(), user="u2")
    run(config, until_caught_up=True)
    assert committed_counts(config) == {"u1": 1}
    [(key, letter)] = dead_letters(config)
    assert key == b"u2" and "has no event time" in letter["error"]["message"]
