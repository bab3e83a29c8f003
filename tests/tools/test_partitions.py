"""Growing an input stream (``sparkpoint stream add-partitions``) under a job with state: the job
refuses to start, naming the stream, both counts and the fix (``state reshard``,
tests/tools/test_reshard.py), and changes nothing (it never runs with a key's state split
between the tasks of the old and the new partitions); shrinking is refused; a job without state
just runs on the new partitions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.config import load_config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import INPUT_PARTITIONS, PartitionCountChanged
from sparkpoint.model import SystemStream
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import add_partitions
from tests.e2e.cli import sp
from tests.helpers import changelog_job as make
from tests.helpers import committed_counts, generate
from tests.helpers import run_job as run


def stored_counts(config: object) -> dict[str, str]:
    store = CoordinatorStreamStore(config, source="test")  # type: ignore[arg-type]
    try:
        return store.all(INPUT_PARTITIONS)
    finally:
        store.close()


def test_a_stateful_job_refuses_inputs_that_gained_partitions(tmp_path: Path) -> None:
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 300, seed=1)
    run(config, until_caught_up=True)
    assert stored_counts(config) == {f"{config.inputs[0]}": "4"}
    systems = Systems(config)
    stream = config.inputs[0]
    assert add_partitions(config, systems, stream, 6) == 4
    assert systems.admin(stream.system).partition_count(stream.stream) == 6
    with pytest.raises(UserError, match="would not grow it"):
        add_partitions(config, systems, stream, 5)
    systems.close()
    error = (
        rf"input stream {stream} had 4 partitions when job pageviews last ran and has 6 now: "
        r".* Move the state to the new tasks first: sparkpoint state reshard JOB"
    )
    with pytest.raises(PartitionCountChanged, match=error):
        run(config, until_caught_up=True)
    assert stored_counts(config) == {f"{stream}": "4"}  # nothing changed: it refuses again
    assert committed_counts(config) == dict(expected)


def test_a_stateful_job_that_never_ran_is_guarded_too(tmp_path: Path) -> None:
    """Records already in a stream are keyed by its old count whether the job ran or not: the
    grow of a job's input is refused while they are unread, and forced, the job's first start
    refuses (it split 21 of 50 users' counts between two tasks: a reviewer's script). With no
    record in it, the grow is harmless and the first run counts on the new count."""
    empty = make(tmp_path / "empty")
    systems = Systems(empty)
    assert add_partitions(empty, systems, empty.inputs[0], 8) == 4
    systems.close()
    expected = generate(empty, tmp_path / "e.yaml", 200, seed=4)
    run(empty, until_caught_up=True)
    assert committed_counts(empty) == dict(expected)
    assert stored_counts(empty) == {f"{empty.inputs[0]}": "8"}

    config = make(tmp_path / "full")
    generate(config, tmp_path / "a.yaml", 300, seed=3)
    systems = Systems(config)
    stream = config.inputs[0]
    with pytest.raises(UserError, match=r"job pageviews has not read all of filelog.pageviews"):
        add_partitions(config, systems, stream, 8)
    assert systems.admin(stream.system).partition_count(stream.stream) == 4
    add_partitions(config, systems, stream, 8, force=True)
    systems.close()
    with pytest.raises(PartitionCountChanged, match="had 4 partitions .* has 8 now"):
        run(config, until_caught_up=True)
    assert committed_counts(config) == {}


def test_a_running_driver_stops_when_its_input_grows(tmp_path: Path) -> None:
    """A stream grown under a running job by other means (another job's config, the system's
    own tools): the driver commits what was written before and stops, naming the fix, instead
    of reading keys of the new count into the old tasks (15 of 50 users split before)."""
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner

    config = make(tmp_path, **{"task.batch.max.messages": "30"})
    first = generate(config, tmp_path / "a.yaml", 300, seed=5)
    coordinator = JobCoordinator(config, InlineRunner())
    batch = coordinator.run_batch

    def grow_after_the_first(*args: Any, **kwargs: Any) -> Any:
        out = batch(*args, **kwargs)
        if Systems(config).admin("filelog").partition_count("pageviews") == 4:
            Systems(config).admin("filelog").add_partitions("pageviews", 6)
            generate(config, tmp_path / "b.yaml", 300, seed=6)  # placed by 6
        return out

    coordinator.run_batch = grow_after_the_first  # type: ignore[method-assign]
    error = r"input stream filelog.pageviews grew from 4 to 6 partitions while job pageviews"
    try:
        with pytest.raises(PartitionCountChanged, match=error):
            coordinator.run(max_batches=40)  # (without the check: ran on, never stopping)
    finally:
        coordinator.close()
    counts = committed_counts(config)  # only views written before the growth, none twice
    assert all(counts[u] <= first[u] for u in counts) and counts, (counts, first)
    with pytest.raises(PartitionCountChanged, match="had 4 partitions .* has 6 now"):
        run(config, until_caught_up=True)


def test_a_tool_in_the_process_of_a_running_driver_is_refused(tmp_path: Path) -> None:
    """One process may run a driver and call a tool (the Python API): the tool is refused
    while the driver's heartbeat runs (it was let through as "this process", and a reshard
    then had the old driver commit its stale state over the new), and let through once the
    driver closed, or when a driver of this process ended without removing its record."""
    from sparkpoint.metadata.job_state import LIVENESS, DriverConflict
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner

    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 100, seed=7)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    systems = Systems(config)
    try:
        with pytest.raises(DriverConflict, match="held by a driver of this process"):
            add_partitions(config, systems, config.inputs[0], 6)
        store = CoordinatorStreamStore(config, source="test")
        beat = store.get(LIVENESS, "driver")
        store.close()
    finally:
        coordinator.close()
    assert systems.admin("filelog").partition_count("pageviews") == 4
    store = CoordinatorStreamStore(config, source="test")
    store.put(LIVENESS, "driver", beat or "")  # as a driver of this process that died would
    store.close()
    run(config, until_caught_up=True)  # (not refused: no heartbeat of that run beats here)
    assert add_partitions(config, systems, config.inputs[0], 6) == 4
    systems.close()


def test_a_stream_with_output_staged_by_any_job_is_not_grown(tmp_path: Path) -> None:
    """Staged output (exactly-once, re-keyed records) is placed by the stream's count: grown
    before it is published, it would reach tasks without its keys' state. Another job's staged
    parts refuse the grow as the job's own do."""
    from sparkpoint.system.base import Record

    config = make(tmp_path)
    systems = Systems(config)
    staging = systems.admin("filelog").output_staging()
    assert staging is not None
    producer = staging.producer("other-job.Partition_0", "run1-1-abc")
    producer.send("pageviews", 2, Record("", b"user-01", b"{}", 1))
    producer.stage()
    producer.close()
    with pytest.raises(UserError, match=r"filelog.pageviews has 1 records staged .* other-job"):
        add_partitions(config, systems, config.inputs[0], 8)
    assert systems.admin("filelog").partition_count("pageviews") == 4
    systems.close()


def test_a_job_without_state_runs_on_the_new_partitions(tmp_path: Path) -> None:
    config = make(tmp_path)
    values = {k: v for k, v in config.items() if not k.startswith("stores.")}
    stateless = load_config(None, {**values, "task.class": "recorder_task:Recorder"})
    run(stateless, until_caught_up=True)
    systems = Systems(stateless)
    add_partitions(stateless, systems, stateless.inputs[0], 5)
    systems.close()
    run(stateless, until_caught_up=True)
    assert stored_counts(stateless) == {f"{stateless.inputs[0]}": "5"}


def test_the_command_grows_a_stream_and_warns_of_the_job_s_state(tmp_path: Path) -> None:
    config = make(tmp_path / "ran")
    generate(config, tmp_path / "a.yaml", 50, seed=8)
    run(config, until_caught_up=True)
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(config.to_dict()))
    grown = sp("stream", "add-partitions", str(job_file), "pageviews", "--partitions", "8")
    assert "grown: filelog.pageviews (4 -> 8 partitions)" in grown.stdout
    assert "refuses to start until its state is moved to the new tasks" in grown.stdout
    stream = SystemStream("filelog", "pageviews")
    assert Systems(config).admin("filelog").partition_count(stream.stream) == 8
    fresh = make(tmp_path / "fresh")  # never ran, nothing to read: no state to move
    fresh_file = tmp_path / "fresh.json"
    fresh_file.write_text(json.dumps(fresh.to_dict()))
    grown = sp("stream", "add-partitions", str(fresh_file), "pageviews", "--partitions", "8")
    assert "job pageviews has no state yet: it runs on 8 tasks" in grown.stdout


@pytest.mark.kafka
def test_on_kafka_a_changed_count_is_refused(tmp_path: Path) -> None:
    """The partition count a job last ran with, on Kafka: it refuses a count that differs (the
    stored count is made to differ: Tansu cannot add partitions, see below)."""
    from sparkpoint.testing.services import TansuKafka

    with TansuKafka(tmp_path / "tansu") as broker:
        config = make(tmp_path, broker.config("log"))
        generate(config, tmp_path / "a.yaml", 100, seed=2)
        run(config, until_caught_up=True)
        store = CoordinatorStreamStore(config, source="test")
        store.put_all(INPUT_PARTITIONS, {"log.pageviews": "2"})
        store.close()
        with pytest.raises(PartitionCountChanged, match="had 2 partitions .* has 4 now"):
            run(config, until_caught_up=True)


@pytest.mark.kafka
@pytest.mark.xfail(
    strict=True,
    reason="Tansu deviation: CreatePartitions is not supported (librdkafka: 'CreatePartitions "
    "(KIP-195) not supported by broker'); a Kafka broker grows the topic",
)
def test_kafka_grows_a_topic(tmp_path: Path) -> None:
    from sparkpoint.testing.services import TansuKafka

    with TansuKafka(tmp_path / "tansu") as broker:
        config = make(tmp_path, broker.config("log"))
        systems = Systems(config)
        try:
            add_partitions(config, systems, SystemStream("log", "pageviews"), 6)
            assert systems.admin("log").partition_count("pageviews") == 6
        finally:
            systems.close()


class _Topic:
    def __init__(self, partitions: int) -> None:
        self.partitions = dict.fromkeys(range(partitions))
        self.error = None


class _FakeAdminClient:
    """What KafkaAdmin.add_partitions asks of confluent-kafka's AdminClient: CreatePartitions,
    then metadata that shows the new count only after a while (as a broker's does)."""

    def __init__(self, partitions: int, refuse: Exception | None = None) -> None:
        self.partitions, self.refuse = partitions, refuse
        self.requests: list[tuple[str, int]] = []
        self.listed = 0
        self.grown = partitions  # the count once the request took effect

    def create_partitions(self, new: list[object]) -> dict[str, object]:
        from concurrent.futures import Future

        out: dict[str, object] = {}
        for request in new:
            topic, total = request.topic, request.new_total_count  # type: ignore[attr-defined]
            self.requests.append((topic, total))
            done: Future[None] = Future()
            if self.refuse is not None:
                done.set_exception(self.refuse)
            else:
                done.set_result(None)
                self.grown = total
            out[topic] = done
        return out

    def list_topics(self, timeout: float) -> object:
        from types import SimpleNamespace

        self.listed += 1
        count = self.grown if self.listed > 2 else self.partitions
        return SimpleNamespace(topics={"pageviews": _Topic(count)})


def _kafka_admin(client: _FakeAdminClient) -> object:
    import threading

    from sparkpoint.system.kafka.system import KafkaAdmin

    admin = KafkaAdmin.__new__(KafkaAdmin)
    admin.system, admin._admin, admin._lock = "log", client, threading.Lock()
    admin._partitions = {"pageviews": (4, 0.0)}
    return admin


def test_kafka_grows_a_topic_with_create_partitions_and_waits_for_the_metadata() -> None:
    """Without a broker that has CreatePartitions (Tansu has none: the xfail above), the admin's
    side of the growth: one request for the new total, the call returns once the metadata
    shows it, the cached count is dropped; a broker's refusal names the system and topic."""
    from confluent_kafka import KafkaError, KafkaException

    from sparkpoint.errors import SparkpointError

    client = _FakeAdminClient(4)
    admin = _kafka_admin(client)
    admin.add_partitions("pageviews", 8)  # type: ignore[attr-defined]
    assert client.requests == [("pageviews", 8)]
    assert client.listed >= 3  # waited for the metadata to show 8
    assert "pageviews" not in admin._partitions  # type: ignore[attr-defined]
    refused = KafkaException(KafkaError(KafkaError.INVALID_PARTITIONS, "cannot shrink"))
    admin = _kafka_admin(_FakeAdminClient(4, refuse=refused))
    with pytest.raises(SparkpointError, match="kafka system log: adding partitions to topic "):
        admin.add_partitions("pageviews", 8)  # type: ignore[attr-defined]
