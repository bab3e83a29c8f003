"""The example job with its views and counts in Avro through a Schema Registry, exactly-once,
end to end through the CLI on local Spark: its driver killed with SIGKILL mid-run and run
again, or a Python worker killed mid-commit and retried, its state is exact and each user's
counts 1..N went out once each (read back by confluent-kafka's own deserializer). The registry
is the tests' (sparkpoint.testing.schema_registry), which the job's Python workers reach on
loopback."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config, parse_overrides
from tests.e2e.cli import JOB, popen, sp, wait_for_checkpoints
from tests.helpers import committed_counts
from tests.registry import SCHEMAS, emitted_all, registry, send_views

pytestmark = pytest.mark.slow
__all__ = ["registry"]  # the fixture


def avro_job(tmp_path: Path, registry: str, *extra: str) -> tuple[Config, list[str], Counter[str]]:
    """The example in Avro, exactly-once, with 30,000 views in 4 partitions: its config, its
    --set arguments and the count per user."""
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=300",
        "task.batch.max.messages=1500",
        "job.processing.guarantee=exactly-once",
        f"systems.filelog.schema.registry.url={registry}",
        "streams.pageviews.samza.msg.serde=avro",
        "streams.user-counts.samza.msg.serde=counts",
        "serializers.registry.counts.type=avro",
        f"serializers.registry.counts.schema.file={SCHEMAS / 'user-count.avsc'}",
        *extra,
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    expected = send_views(
        config, registry, 30_000, 12, system="filelog", users=200, partitions=4, one_by_one=False
    )
    return config, set_args, expected


def assert_exact_once(config: Config, registry: str, expected: Counter[str]) -> None:
    assert committed_counts(config) == dict(expected)
    sent = emitted_all(config, registry, "filelog")
    wrong = {u: c for u, c in sent.items() if sorted(c) != list(range(1, expected[u] + 1))}
    assert set(sent) == set(expected) and not wrong, list(wrong.items())[:3]


def test_kill_9_mid_run_on_avro_then_restart_is_exact_once(tmp_path: Path, registry: str) -> None:
    config, set_args, expected = avro_job(tmp_path, registry)
    log = tmp_path / "run1.log"
    driver = popen("run", str(JOB), "--until-caught-up", *set_args, log=log)
    wait_for_checkpoints(config, driver, log, 4, 180, progress=6_000)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    partial = committed_counts(config)
    assert 0 < sum(partial.values()) < sum(expected.values())

    result = sp("run", str(JOB), "--until-caught-up", *set_args)
    assert "done (caught up)" in result.stderr
    assert_exact_once(config, registry, expected)


def test_a_python_worker_killed_mid_commit_on_avro_is_retried_and_exact_once(
    tmp_path: Path, registry: str
) -> None:
    flag = tmp_path / "crash"
    flag.write_text("3")  # the fourth snapshot kills its Python worker (os._exit)
    config, set_args, expected = avro_job(
        tmp_path,
        registry,
        "testing.crash.at=after-snapshot",
        f"testing.crash.flag={flag}",
        "testing.crash.mode=exit",
    )
    result = sp("run", str(JOB), "--until-caught-up", *set_args, timeout=400)
    assert "done (caught up)" in result.stderr
    assert not flag.exists()  # the worker died, and Spark retried its task
    assert_exact_once(config, registry, expected)
