"""A message that cannot be decoded, or whose process() raises, fails the batch naming its SSP
and offset, every time; Samza's task.ignored.exceptions and task.drop.deserialization.errors
skip such messages with an ERROR instead (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint.errors import TaskError
from sparkpoint.system.base import Record, RecordFields
from sparkpoint.system.registry import Systems
from tests.helpers import changelog_job as make
from tests.helpers import committed_counts, generate
from tests.helpers import run_job as run


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


def test_a_failure_in_process_names_the_file_and_line_it_came_from(tmp_path: Path) -> None:
    """Issue 37: an exception in process() printed one line with no file or line number."""
    import faulty_task

    config = make(tmp_path, **{"task.class": "faulty_task:PoisonCounter"})
    generate(config, tmp_path / "a.yaml", 50, seed=93, users=8)
    add_input(config, json.dumps({"user": "poison", "page": "/"}).encode())
    with pytest.raises(TaskError) as err:
        run(config, until_caught_up=True)
    assert f"(at {faulty_task.__file__}:" in str(err.value)
    assert " in process)" in str(err.value)


def test_a_failed_send_is_not_blamed_on_the_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a transient produce failure was reported as "every restart fails at this
    message ... task.ignored.exceptions", advice that would drop output and keep the state."""
    from sparkpoint.system.filelog.system import FileLogProducer

    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 300, seed=94, users=8)
    real = FileLogProducer.send_fields  # the task API's output path
    failures = iter([True])

    def flaky(self: FileLogProducer, stream: str, partition: int, fields: RecordFields) -> None:
        if stream == "user-counts" and next(failures, False):
            raise OSError(5, "Input/output error")
        real(self, stream, partition, fields)

    monkeypatch.setattr(FileLogProducer, "send_fields", flaky)
    with pytest.raises(TaskError) as err:
        run(config, until_caught_up=True)
    text = str(err.value)
    assert "sending to filelog.user-counts partition" in text and "Input/output error" in text
    assert "Sending the output failed, not the message" in text
    assert "task.ignored.exceptions" not in text
    run(config, until_caught_up=True)  # the fault was transient: the next run goes on
    assert committed_counts(config) == dict(expected)


def test_a_changed_store_serde_is_blamed_on_the_store_not_the_message(tmp_path: Path) -> None:
    """Issue 37: a store whose serde changed (integer -> json) was blamed on the input message
    ("failed processing ... offset 190"), with advice to skip it."""
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 200, seed=95, users=8)
    run(config, until_caught_up=True)
    generate(config, tmp_path / "b.yaml", 40, seed=96, users=8)
    changed = make(tmp_path, **{"stores.user-counts.msg.serde": "json"})
    with pytest.raises(TaskError) as err:
        run(changed, until_caught_up=True)
    text = str(err.value)
    assert "store user-counts: cannot decode a stored value" in text
    assert "did stores.user-counts.msg.serde change?" in text
    assert "The store failed, not the message" in text
    assert "task.ignored.exceptions" not in text
