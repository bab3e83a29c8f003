"""The example job with every stream on Kafka (a Tansu broker started here on loopback): input,
output, the changelog, checkpoints and the coordinator stream."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config, parse_overrides
from sparkpoint.testing.services import TansuKafka
from tests.conftest import EXAMPLE_DIR
from tests.e2e.cli import JOB, popen, sp, wait_for_checkpoints
from tests.helpers import (
    assert_at_least_once,
    committed_counts,
    emitted_counts,
    generate,
)

pytestmark = pytest.mark.slow

KAFKA_JOB = EXAMPLE_DIR / "job-kafka.yaml"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[TansuKafka]:
    """A broker per test (it starts in well under a second): no topic is shared."""
    with TansuKafka(tmp_path / "tansu") as b:
        yield b


def prepared(
    job: Path, sets: list[str], tmp_path: Path, events: int, seed: int
) -> tuple[Config, list[str], dict[str, int]]:
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(job, parse_overrides(sets))
    stream = f"{config.inputs[0].system}.pageviews"
    sp("stream", "create", str(job), stream, "--partitions", "4", *set_args)
    expected = generate(config, tmp_path / f"{job.stem}.yaml", events, seed=seed, users=200)
    return config, set_args, dict(expected)


def kafka_sets(broker: TansuKafka, tmp_path: Path, *extra: str) -> list[str]:
    """job-kafka.yaml on this broker."""
    return [
        f"job.data.dir={tmp_path / 'data'}",
        *(f"{k}={v}" for k, v in broker.config().items()),
        *extra,
    ]


def test_kafka_and_filelog_jobs_end_with_identical_stores_and_outputs(
    tmp_path: Path, broker: TansuKafka
) -> None:
    """The same events through the example on filelog and on Kafka: the same count per user in
    the stores and in the output (tasks hold different users: the systems partition keys
    differently, crc32 and Kafka's murmur2)."""
    common = ["task.commit.ms=300", "task.batch.max.messages=500"]
    on_file = [f"job.data.dir={tmp_path / 'file'}", *common]
    file_config, file_args, expected = prepared(JOB, on_file, tmp_path, 2_000, seed=41)
    on_kafka = kafka_sets(broker, tmp_path, *common)
    kafka_config, kafka_args, same = prepared(KAFKA_JOB, on_kafka, tmp_path, 2_000, seed=41)
    assert same == expected
    for job, args in ((JOB, file_args), (KAFKA_JOB, kafka_args)):
        assert "done (caught up)" in sp("run", str(job), "--until-caught-up", *args).stderr
    assert committed_counts(kafka_config) == committed_counts(file_config) == expected
    kafka_out, file_out = emitted_counts(kafka_config), emitted_counts(file_config)
    assert {u: max(c) for u, c in kafka_out.items()} == {u: max(c) for u, c in file_out.items()}
    assert_at_least_once(kafka_out, expected)


def test_kill_9_mid_run_on_kafka_then_restart_gives_exact_state(
    tmp_path: Path, broker: TansuKafka
) -> None:
    sets = kafka_sets(broker, tmp_path, "task.commit.ms=300", "task.batch.max.messages=300")
    config, set_args, expected = prepared(KAFKA_JOB, sets, tmp_path, 5_000, seed=42)
    log = tmp_path / "run1.log"
    driver = popen("run", str(KAFKA_JOB), "--until-caught-up", *set_args, log=log)
    wait_for_checkpoints(config, driver, log, 4, 240, progress=1_200)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    partial = committed_counts(config)
    assert 0 < sum(partial.values()) < sum(expected.values())
    result = sp("run", str(KAFKA_JOB), "--until-caught-up", *set_args)
    assert "done (caught up)" in result.stderr
    assert committed_counts(config) == expected
    assert_at_least_once(emitted_counts(config), expected)


def test_stream_commands_work_on_kafka_topics(tmp_path: Path, broker: TansuKafka) -> None:
    import json

    set_args = [a for s in kafka_sets(broker, tmp_path) for a in ("--set", s)]
    job = str(KAFKA_JOB)
    created = sp("stream", "create", job, "kafka.clicks", "--partitions", "3", *set_args)
    assert "created: kafka.clicks (3 partitions)" in created.stdout
    lines = "".join(json.dumps({"key": f"u{i}", "value": {"n": i}}) + "\n" for i in range(30))
    sp("stream", "write", job, "kafka.clicks", *set_args, stdin=lines)
    assert "kafka.clicks" in sp("stream", "list", job, *set_args).stdout
    read = sp("stream", "read", job, "clicks", *set_args).stdout
    rows = [json.loads(x) for x in read.splitlines()]
    assert sorted(r["value"]["n"] for r in rows) == list(range(30))
    # keys are placed by Kafka's partitioner (murmur2), as a Java producer would place them
    from sparkpoint.system.kafka.partitioner import kafka_partition

    assert all(r["partition"] == kafka_partition(r["key"].encode(), 3) for r in rows)
    one = sp("stream", "read", job, "clicks", "--partition", "1", "--from", "2", *set_args)
    in_one = sorted(int(r["offset"]) for r in rows if r["partition"] == 1)
    assert [int(json.loads(x)["offset"]) for x in one.stdout.splitlines()] == in_one[2:]
