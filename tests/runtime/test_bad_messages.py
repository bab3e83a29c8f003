"""A message that cannot be decoded, or whose process() raises, fails the batch naming its SSP
and offset, every time; Samza's task.ignored.exceptions and task.drop.deserialization.errors
skip such messages with an ERROR instead (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint.errors import TaskError
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from tests.helpers import committed_counts, generate
from tests.storage.test_state_backends import make, run


def add_input(config: object, value: bytes, user: str = "poison") -> None:
    producer = Systems(config).producer("filelog")  # type: ignore[arg-type]
    producer.send("pageviews", 2, Record("", user.encode(), value, 0))
    producer.flush()


@pytest.mark.parametrize("bad", ["process-raises", "not-json"])
def test_a_bad_message_fails_every_run_at_its_offset(tmp_path: Path, bad: str) -> None:
    config = make(tmp_path, **{"task.class": "faulty_task:PoisonCounter"})
    generate(config, tmp_path / "a.yaml", 200, seed=91, users=8)
    value = (
        json.dumps({"user": "poison", "page": "/"}).encode()
        if bad == "process-raises"
        else b"{oops"
    )
    add_input(config, value)
    expected = (
        "failed processing filelog.pageviews.2 offset"
        if bad == "process-raises"
        else ("cannot decode message at filelog.pageviews.2 offset")
    )
    for _ in range(2):  # a restart does not get past it either
        with pytest.raises(TaskError, match=expected) as err:
            run(config, until_caught_up=True)
    if bad == "process-raises":
        assert "task.ignored.exceptions=ValueError" in str(err.value)


def test_policies_skip_bad_messages_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make(
        tmp_path,
        **{
            "task.class": "faulty_task:PoisonCounter",
            "task.ignored.exceptions": "ValueError",
            "task.drop.deserialization.errors": "true",
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 200, seed=92, users=8)
    add_input(config, json.dumps({"user": "poison", "page": "/"}).encode())
    add_input(config, b"\xff not utf-8", user="binary")
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)  # everything else counted once
    assert "ignored (task.ignored.exceptions)" in caplog.text
    assert "dropped (task.drop.deserialization.errors=true)" in caplog.text
