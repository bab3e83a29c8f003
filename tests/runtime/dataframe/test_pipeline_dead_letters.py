"""The dead-letter stream in the DataFrame API (issue 66): a record the batch cannot decode
(not JSON, a value that does not fit the pipeline's value_schema) leaves the batch as a dead
letter, with its key as it was and its value kept whole; the pipeline goes on and counts the
rest exactly. The letters are sent by each task's finish, once per batch however often Spark
reads the batch, and under exactly-once they are staged with the batch and published once,
also after a crash. The stream is read back with json and base64 alone."""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pageviews_pipeline import job as example_pipeline

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.dataframe.runner import DataFrameRunner
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from tests.conftest import pageviews_config
from tests.helpers import (
    add_input,
    assert_exactly_once,
    committed_counts,
    dead_letters,
    emitted_counts,
    generate,
    run_until_caught_up,
)

NOT_JSON = b"{oops"
MISFIT = json.dumps({"user": "misfit", "page": "/", "ts": "yesterday"}).encode()


def _config(tmp_path: Path, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        **{
            "task.batch.max.messages": "300",
            "task.commit.ms": "0",
            "task.dlq.stream": "filelog.dead-letters",
            **overrides,
        },
    )
    config = load_config(None, values)
    admin = Systems(config).admin("filelog")
    if "pageviews" not in admin.list_streams():
        admin.create_stream(StreamSpec("pageviews", 4))
    return config


def _run(spark: Any, config: Config) -> None:
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, example_pipeline, config)))


def _poisoned(tmp_path: Path, config: Config) -> Counter[str]:
    """600 views, then a record that is not JSON and one whose ts is not a number (partition
    2), then 600 more: the views per user that can be counted."""
    expected = generate(config, tmp_path / "a.yaml", 600, seed=71, users=10)
    add_input(config, NOT_JSON, user="broken")
    add_input(config, MISFIT, user="misfit")
    return expected + generate(config, tmp_path / "b.yaml", 600, seed=72, users=10)


def _check_letters(config: Config) -> None:
    letters = dead_letters(config)
    assert [k for k, _ in letters] == [b"broken", b"misfit"]  # keys as they were, once each
    (_, bad), (_, misfit) = letters
    assert base64.b64decode(bad["value"]) == NOT_JSON  # values kept whole
    assert base64.b64decode(misfit["value"]) == MISFIT
    assert {bad["reason"], misfit["reason"]} == {"decode"}
    assert bad["source"]["stream"] == "pageviews" and bad["source"]["partition"] == 2
    assert int(misfit["source"]["offset"]) == int(bad["source"]["offset"]) + 1
    assert "does not fit the pipeline's value_schema" in misfit["error"]["message"]
    assert misfit["task"] == "Partition 2" and "checkpoint" in misfit


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_records_that_cannot_be_decoded_go_to_the_dead_letter_stream(
    tmp_path: Path, spark: Any, guarantee: str
) -> None:
    config = _config(tmp_path, **{"job.processing.guarantee": guarantee})
    expected = _poisoned(tmp_path, config)
    _run(spark, config)
    assert committed_counts(config) == dict(expected)  # everything else counted once
    if guarantee == "exactly-once":
        assert_exactly_once(config, expected)
    else:
        assert {u: max(c) for u, c in emitted_counts(config).items()} == dict(expected)
    _check_letters(config)
    _run(spark, config)  # run again: nothing more
    assert len(dead_letters(config)) == 2


def test_a_crash_in_the_finish_leaves_each_dead_letter_published_once(
    tmp_path: Path, spark: Any
) -> None:
    """The finish sent the batch's letters (staged), then failed before its commit: the batch
    is read again after the restart, and its letters go out once."""
    flag = tmp_path / "crash.flag"
    flag.write_text("0")
    crash = {"testing.crash.at": "after-snapshot", "testing.crash.flag": str(flag)}
    config = _config(tmp_path, **{"job.processing.guarantee": "exactly-once", **crash})
    expected = _poisoned(tmp_path, config)
    with pytest.raises(Exception, match="InjectedCrash"):
        _run(spark, config)
    assert not flag.exists(), "the crash point was never reached"
    _run(spark, config)
    assert committed_counts(config) == dict(expected)
    assert_exactly_once(config, expected)
    _check_letters(config)


def test_process_failures_are_refused_for_a_pipeline(tmp_path: Path, spark: Any) -> None:
    config = _config(tmp_path, **{"task.dlq.on": "both"})
    with pytest.raises(ConfigError, match="task.dlq.on='both': a DataFrame pipeline has no"):
        DataFrameRunner(spark, example_pipeline, config)
