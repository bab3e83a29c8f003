"""The contract of exactly-once output staging (:mod:`sparkpoint.system.staging`), run on every
system that has it: the filelog, and Kafka on a Tansu broker. Staged records are invisible until
their commit is published; a publish happens once and whole, also when its publisher dies
half-way; a sweep discards what no commit names."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.errors import CorruptRecordError, UserError
from sparkpoint.failpoints import PUBLISH_POINTS, InjectedCrash
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec, SystemAdmin, SystemFactory
from sparkpoint.system.staging import OutputStaging

_streams = itertools.count()


@dataclass
class Env:
    """One system with output staging, and a two-partition stream on it."""

    kind: str
    system: str
    factory: SystemFactory
    config: dict[str, str]
    admin: SystemAdmin
    stream: str

    @property
    def staging(self) -> OutputStaging:
        staging = self.admin.output_staging()
        assert staging is not None
        return staging

    def values(self, partition: int = 0) -> list[str]:
        """What a (read-committed) reader of the partition sees, in order."""
        ssp = SystemStreamPartition(self.system, self.stream, partition)
        meta = self.admin.get_metadata([ssp])[ssp]
        consumer = self.factory.get_consumer(self.system, self.config)
        try:
            got = consumer.read(ssp, meta.oldest, meta.upcoming, None)
        finally:
            consumer.close()
        return [(r.value or b"").decode() for r in got]

    def stage(self, owner: str, part: str, *vals: str, partition: int = 0) -> str:
        """Stage ``vals`` as ``owner``'s part ``part``; the name it is staged under."""
        producer = self.staging.producer(owner, part)
        for v in vals:
            producer.send(self.stream, partition, Record("", None, v.encode(), 1_000))
        staged = producer.stage()
        producer.close()
        assert set(staged) == ({(self.stream, partition)} if vals else set())
        return staged.get((self.stream, partition), "")

    def append(self, *vals: str, partition: int = 0) -> None:
        """Plain (not staged) appends."""
        producer = self.factory.get_producer(self.system, self.config)
        for v in vals:
            producer.send(self.stream, partition, Record("", None, v.encode(), 5))
        producer.close()


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from sparkpoint.testing.services import TansuKafka

    with TansuKafka(tmp_path_factory.mktemp("tansu")) as broker:
        yield broker


@pytest.fixture(params=["filelog", pytest.param("kafka", marks=pytest.mark.kafka)])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    stream = f"out-{next(_streams)}"
    if request.param == "filelog":
        from sparkpoint.system.filelog import FileLogSystemFactory

        factory: SystemFactory = FileLogSystemFactory()
        config = {"systems.fl.path": str(tmp_path / "fl")}
        system = "fl"
    else:
        from sparkpoint.system.kafka import KafkaSystemFactory

        factory = KafkaSystemFactory()
        config = request.getfixturevalue("tansu").config("kafka")
        system = "kafka"
    admin = factory.get_admin(system, config)
    admin.create_stream(StreamSpec(stream, 2))
    return Env(request.param, system, factory, config, admin, stream)


def test_staged_records_are_invisible_until_published_then_in_order_once(env: Env) -> None:
    owner = f"job-1.{env.stream}"
    first = env.stage(owner, "r1-1-a", "a", "b")
    second = env.stage(owner, "r1-2-b", "c")
    assert env.values() == []  # staged: nobody reads it
    waiting = env.staging.staged(env.stream)
    assert [(p.owner, p.part, p.records) for p in waiting] == [
        (owner, first, 2),
        (owner, second, 1),
    ]
    assert env.staging.read_part(env.stream, 0, owner, second)[0].value == b"c"
    if env.kind == "kafka":  # kept by this process, which staged it; the same read back
        from sparkpoint.system.kafka import staging as kafka_staging

        kept = env.staging.read_part(env.stream, 0, owner, first)
        with kafka_staging._KEPT.lock:
            kafka_staging._KEPT.parts.clear()
            kafka_staging._KEPT.size = 0
        assert env.staging.read_part(env.stream, 0, owner, first) == kept
        assert [r.value for r in kept] == [b"a", b"b"] and kept[0].timestamp == 1_000
    assert env.staging.publish(env.stream, 0, owner, 10, [first, second]) == 3
    assert env.values() == ["a", "b", "c"]
    assert env.staging.staged(env.stream) == []  # published parts are no longer waiting
    assert env.staging.publishers(env.stream, 0) == [owner]
    assert env.staging.publishers(env.stream, 1) == []
    # again (a restarted task, the driver's start): already done, nothing twice
    assert env.staging.publish(env.stream, 0, owner, 10, [first, second]) == 0
    assert env.values() == ["a", "b", "c"]


def test_owners_are_independent_and_plain_appends_interleave(env: Env) -> None:
    t0, t1 = f"t0-{env.stream}", f"t1-{env.stream}"
    p0 = env.stage(t0, "p1", "t0-a")
    p1 = env.stage(t1, "p1", "t1-a")
    env.append("plain")
    assert env.staging.publish(env.stream, 0, t1, 7, [p1]) == 1
    assert env.staging.publish(env.stream, 0, t0, 3, [p0]) == 1  # keys are per owner
    assert env.values() == ["plain", "t1-a", "t0-a"]
    assert env.staging.publishers(env.stream, 0) == sorted([t0, t1])


def _crash_at(point: str, tmp_path: Path) -> dict[str, str]:
    flag = tmp_path / "flag"
    flag.write_text("0")
    return {"testing.crash.at": point, "testing.crash.flag": str(flag)}


@pytest.mark.parametrize("point", PUBLISH_POINTS)
def test_a_publisher_that_dies_half_way_shows_nothing_and_the_next_publishes_once(
    env: Env, point: str, tmp_path: Path
) -> None:
    """(On Tansu, which shows aborted records to read-committed readers, a Kafka publisher that
    died after appending is finished right only because its published-through mark, aborted
    with its records, shows as well: see docs/exactly-once.md.)"""
    owner = f"t0-{env.stream}"
    part = env.stage(owner, "p1", "a", "b", "c")
    with pytest.raises(InjectedCrash):
        env.staging.publish(env.stream, 0, owner, 5, [part], _crash_at(point, tmp_path))
    # the publish is in neither state for readers: none of its records are visible
    assert env.values() == []
    # the next publish of the commit (a restarted task, the driver's start) finishes it once
    env.staging.publish(env.stream, 0, owner, 5, [part])
    env.append("after")
    assert env.values() == ["a", "b", "c", "after"]
    assert env.staging.publish(env.stream, 0, owner, 5, [part]) == 0
    assert env.values() == ["a", "b", "c", "after"]
    assert env.staging.staged(env.stream) == []


def test_a_part_that_is_never_staged_is_never_listed(env: Env) -> None:
    producer = env.staging.producer(f"t0-{env.stream}", "p1")
    producer.send(env.stream, 1, Record("", None, b"x", 1))
    producer.flush()  # durable where it waits, but not a staged part
    producer.close()  # the batch failed
    assert env.staging.staged(env.stream) == []
    assert env.values(1) == []


def test_a_part_flushed_many_times_is_one_part_in_send_order(env: Env) -> None:
    owner = f"t0-{env.stream}"
    producer = env.staging.producer(owner, "p1")
    for i in range(10):  # records, and plain tuples as the task API's collector sends them
        if i % 2:
            producer.send_fields_many(
                env.stream, 1, [("", b"k", f"{i}-{j}".encode(), 1) for j in range(2)]
            )
            producer.send_fields(env.stream, 1, ("", b"k", f"{i}-2".encode(), 1))
        else:
            batch = [Record("", b"k", f"{i}-{j}".encode(), 1) for j in range(3)]
            producer.send_many(env.stream, 1, batch)
        producer.flush()
    staged = producer.stage()
    producer.close()
    assert list(staged) == [(env.stream, 1)]
    assert env.staging.publish(env.stream, 1, owner, 1, [staged[(env.stream, 1)]]) == 30
    assert env.values(1) == [f"{i}-{j}" for i in range(10) for j in range(3)]


def test_a_missing_staged_part_is_an_error_naming_it(env: Env) -> None:
    with pytest.raises(CorruptRecordError, match=r"staged output t0/gone@5-9 is missing"):
        env.staging.publish(env.stream, 0, "t0", 1, ["gone@5-9"])
    assert env.values() == []


def test_bad_owner_and_part_names_are_refused(env: Env) -> None:
    with pytest.raises(UserError, match="invalid staged output owner"):
        env.staging.producer("a/b", "p")
    with pytest.raises(UserError, match="invalid staged output part"):
        env.staging.producer("a", "../p")


def test_a_sweep_discards_one_owner_or_every_owner_under_a_job_but_what_it_keeps(
    env: Env,
) -> None:
    job = f"job-{env.stream}"
    a = env.stage(f"{job}.Partition_0", "a", "x")
    b = env.stage(f"{job}-batches", "b", "x")
    c = env.stage(f"{job}-batches", "c", "x")
    d = env.stage(f"{job}-batches-x", "d", "x")  # another job whose label starts the same
    swept = env.staging.sweep(env.stream, f"{job}-batches", keep={c})
    assert swept == {f"{job}-batches": 1}  # that owner: b
    assert sorted(p.part for p in env.staging.staged(env.stream)) == sorted([a, c, d])
    assert env.staging.sweep(env.stream, f"{job}.") == {f"{job}.Partition_0": 1}  # every task: a
    assert sorted(p.part for p in env.staging.staged(env.stream)) == sorted([c, d])
    assert env.staging.sweep(env.stream, f"{job}.") == {}  # nothing left to discard
    assert b not in {p.part for p in env.staging.staged(env.stream)}
    # the kept part is still published whole
    assert env.staging.publish(env.stream, 0, f"{job}-batches", 1, [c]) == 1
    assert env.values() == ["x"]


def _published_once(tansu: Any) -> tuple[Env, str, str]:
    """A one-partition stream on Kafka with owner ``t0-<stream>``'s commit 1 ("a") published
    by this process (its publisher cached) and commit 2's part ("b") staged: (env, owner, part)."""
    from sparkpoint.system.kafka import KafkaSystemFactory

    factory, config = KafkaSystemFactory(), tansu.config("kafka")
    stream = f"out-{next(_streams)}"
    admin = factory.get_admin("kafka", config)
    admin.create_stream(StreamSpec(stream, 1))
    env = Env("kafka", "kafka", factory, config, admin, stream)
    owner = f"t0-{stream}"
    assert env.staging.publish(stream, 0, owner, 1, [env.stage(owner, "p1", "a")]) == 1
    return env, owner, env.stage(owner, "p2", "b")


@pytest.mark.kafka
def test_on_kafka_a_publisher_fenced_by_another_process_writes_nothing_twice(
    tansu: Any, tmp_path: Path
) -> None:
    """Kafka's publishers are fenced by ``transactional.id``: a publisher of the same owner in
    another process (a task attempt elsewhere, the driver's start) fences this process's. This
    one then finds that commit published, and for the next commit starts a new producer."""
    import json
    import subprocess
    import sys

    env, owner, second = _published_once(tansu)
    config, stream = env.config, env.stream
    script = (
        "import json, sys\n"
        "from sparkpoint.system.kafka import KafkaSystemFactory\n"
        "config, stream, owner, part = json.loads(sys.argv[1]), *sys.argv[2:]\n"
        "staging = KafkaSystemFactory().get_admin('kafka', config).output_staging()\n"
        "print(staging.publish(stream, 0, owner, 2, [part]))\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config), stream, owner, second],
        capture_output=True,
        text=True,
        check=True,
    )
    assert other.stdout.split() == ["1"]
    assert env.values() == ["a", "b"]
    # this process's publisher is fenced: the commit is done, nothing is written again
    assert env.staging.publish(stream, 0, owner, 2, [second]) == 0
    # the next commit: the fenced producer fails, a new one (fencing the other) publishes it
    assert env.staging.publish(stream, 0, owner, 3, [env.stage(owner, "p3", "c")]) == 1
    assert env.values() == ["a", "b", "c"]


@pytest.mark.kafka
def test_on_kafka_a_publisher_killed_in_its_transaction_does_not_hold_the_owner_back(
    tansu: Any, tmp_path: Path
) -> None:
    """Another process's publisher of the owner is killed (``os._exit``) after appending, its
    transaction left open. This process's cached publisher does not wait for the broker to
    time it out: a new producer ends it (Kafka: aborted, and published again here; Tansu:
    shown with its mark, so found done), and the records are visible once."""
    import json
    import subprocess
    import sys

    env, owner, second = _published_once(tansu)
    config, stream = env.config, env.stream
    flag = tmp_path / "flag"
    flag.write_text("0")
    script = (
        "import json, sys\n"
        "from sparkpoint.system.kafka import KafkaSystemFactory\n"
        "config, stream, owner, part, flag = json.loads(sys.argv[1]), *sys.argv[2:]\n"
        "staging = KafkaSystemFactory().get_admin('kafka', config).output_staging()\n"
        "staging.publish(stream, 0, owner, 2, [part], {'testing.crash.at': "
        "'publish-after-append', 'testing.crash.flag': flag, 'testing.crash.mode': 'exit'})\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config), stream, owner, second, str(flag)]
    )
    assert killed.returncode == 137 and not flag.exists()
    assert env.staging.publish(stream, 0, owner, 2, [second]) in (0, 1)
    assert env.values() == ["a", "b"]
    assert env.staging.publish(stream, 0, owner, 3, [env.stage(owner, "p3", "c")]) == 1
    assert env.values() == ["a", "b", "c"]
