"""``sparkpoint dlq show`` and ``dlq replay`` (sparkpoint.tools.dlq, issue 66): the letters
listed with where they came from and why, and chosen ones written back once: to their source
partition, where the fixed job counts them, or to another stream; a second replay writes
nothing; --dry-run writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config
from sparkpoint.errors import UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.dlq import parse_where, read_dead_letters, replay
from tests.helpers import changelog_job as make
from tests.helpers import committed_counts, generate
from tests.helpers import run_job as run

POISON = json.dumps({"user": "poison", "page": "/"}).encode()


def failed_job(tmp_path: Path) -> tuple[Config, dict[str, int]]:
    """A run of the example whose task raises on user 'poison' (twice) and which reads one
    record that is not JSON: three dead letters."""
    config = make(
        tmp_path,
        **{
            "task.dlq.stream": "filelog.dead-letters",
            "task.dlq.on": "both",
            "task.class": "faulty_task:PoisonCounter",
        },
    )
    expected = dict(generate(config, tmp_path / "a.yaml", 100, seed=96, users=8))
    producer = Systems(config).producer("filelog")
    for key, value in ((b"poison", POISON), (b"broken", b"{oops"), (b"poison", POISON)):
        producer.send("pageviews", 1, Record("", key, value, 0))
    producer.flush()
    run(config, until_caught_up=True)
    return config, expected


def test_show_lists_each_letter_with_its_source_and_error(tmp_path: Path) -> None:
    config, _ = failed_job(tmp_path)
    letters = read_dead_letters(config)
    assert [d.letter["reason"] for d in letters] == ["process", "decode", "process"]
    row = letters[1].row()
    assert row["source"] == "filelog.pageviews.1" and row["reason"] == "decode"
    assert row["error"].startswith("json.decoder.JSONDecodeError: ")
    with pytest.raises(UserError, match="use NAME=VALUE with NAME one of reason"):
        parse_where(["colour=red"])


def test_replay_writes_chosen_letters_back_once_and_the_fixed_job_counts_them(
    tmp_path: Path,
) -> None:
    config, expected = failed_job(tmp_path)
    fixed = load_config(None, {**config.to_dict(), "task.class": "pageviews_task:PageViewCounter"})
    where = parse_where(["reason=process"])
    dry = replay(fixed, where=where, dry_run=True)
    assert dry.written == {"filelog.pageviews": 2} and dry.skipped == 0
    report = replay(fixed, where=where)
    assert report.written == {"filelog.pageviews": 2}
    run(fixed, until_caught_up=True)
    assert committed_counts(fixed) == {**expected, "poison": 2}  # the fix counts them
    again = replay(fixed, where=where)
    assert again.written == {} and again.skipped == 2  # once
    # the one that could not be decoded, elsewhere for a look
    Systems(fixed).admin("filelog").create_stream(StreamSpec("quarantine", 1))
    out = replay(fixed, to="filelog.quarantine", where=parse_where(["reason=decode"]))
    assert out.written == {"filelog.quarantine": 1}
    ssp = SystemStreamPartition("filelog", "quarantine", 0)
    records = Systems(fixed).consumer("filelog").read(ssp, "0", "100")
    assert [(r.key, r.value) for r in records] == [(b"broken", b"{oops")]  # as it arrived


def test_a_job_without_a_dead_letter_stream_says_what_to_set(tmp_path: Path) -> None:
    config = make(tmp_path)
    with pytest.raises(UserError, match="has no dead-letter stream: set task.dlq.stream"):
        read_dead_letters(config)
