"""Helpers for runtime tests: generate example input, count it independently, read results."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from generate import events, write

from sparkpoint.config import Config
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.tools.state import committed_entries
from sparkpoint.tools.streams import read_json_lines


def generate(config: Config, job_file: Path, n: int, seed: int, users: int = 50) -> Counter[str]:
    """Write ``n`` events for ``config`` and return the expected count per user."""
    write_config = job_file.parent / f"gen-{seed}.yaml"
    write_config.write_text(json.dumps({k: v for k, v in config.items()}))
    written = write(str(write_config), n, seed, users)
    assert written == n
    return Counter(str(e["user"]) for e in events(n, seed, users))


def changelog_job(
    tmp_path: Path, log: dict[str, str] | None = None, partitions: int = 4, **overrides: str
) -> Config:
    """The example with a changelog, on filelog, or with every stream on ``log`` (the
    ``log_system`` fixture's system); its input stream created with ``partitions``."""
    from sparkpoint.config import load_config
    from sparkpoint.system.base import StreamSpec
    from tests.conftest import pageviews_config

    system = "filelog" if log is None else "log"
    values = pageviews_config(
        tmp_path,
        log,
        **{
            "stores.user-counts.changelog": f"{system}.user-counts-changelog",
            "task.batch.max.messages": "100",
            "task.commit.ms": "0",
            **overrides,
        },
    )
    config = load_config(None, values)
    Systems(config).admin(system).create_stream(StreamSpec("pageviews", partitions))
    return config


def run_job(config: Config, **kwargs: Any) -> Any:
    """Run the job in this process (the inline runner) with ``kwargs`` for
    ``JobCoordinator.run`` (``until_caught_up=True`` ...); returns the closed coordinator."""
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner

    coordinator = JobCoordinator(config, InlineRunner())
    try:
        coordinator.run(**kwargs)
    finally:
        coordinator.close()
    return coordinator


def changelog_records(config: Config) -> int:
    """How many records the example's changelog holds, over its partitions."""
    from sparkpoint.storage.changelog.backend import changelog_ssp, changelog_stream

    systems = Systems(config)
    changelog = changelog_stream(config, "user-counts")
    partitions = systems.admin(changelog.system).partition_count(changelog.stream)
    ssps = [changelog_ssp(config, "user-counts", p) for p in range(partitions)]
    return sum(len(systems.consumer(s.system).read(s, "0", "10000000")) for s in ssps)


def committed_counts(config: Config) -> dict[str, int]:
    return {k: v for _t, k, v in committed_entries(config, "user-counts")}


def emitted_counts(config: Config) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    output = SystemStream(config.inputs[0].system, "user-counts")  # the example's output
    rows = read_json_lines(config, Systems(config), output)
    for row in rows:
        value: Any = row["value"]
        out.setdefault(value["user"], []).append(int(value["count"]))
    return out


def assert_exactly_once(config: Config, expected: Mapping[str, int]) -> None:
    """Every user's counts 1..N went out once each: none twice, none missing."""
    emitted = emitted_counts(config)
    assert set(emitted) == {u for u, n in expected.items() if n}
    wrong = {
        u: sorted(c) for u, c in emitted.items() if sorted(c) != list(range(1, expected[u] + 1))
    }
    assert not wrong, f"{len(wrong)} users' output is not 1..N once: {list(wrong.items())[:3]}"


def assert_at_least_once(emitted: dict[str, list[int]], expected: Counter[str]) -> None:
    """Every view's effect is in the output: for each user the counts cover 1..final."""
    assert set(emitted) == set(expected)
    for user, final in expected.items():
        assert set(emitted[user]) == set(range(1, final + 1)), user


def counts_at_offsets(config: Config, offsets: dict[Any, str]) -> Counter[str]:
    """An independent count of views per user in the input up to ``offsets`` (inclusive)."""
    systems = Systems(config)
    consumer = systems.consumer(config.inputs[0].system)
    counts: Counter[str] = Counter()
    for ssp, last in offsets.items():
        if ssp.stream != "pageviews":
            continue  # V1 checkpoints also hold changelog positions
        for rec in consumer.read(ssp, "0", str(int(last) + 1)):
            counts[json.loads(rec.value or b"{}")["user"]] += 1
    return counts


def assert_committed_state_matches_its_offsets(config: Config) -> None:
    """Every task's committed store equals the input counted up to its checkpoint's offsets."""
    from sparkpoint.checkpoint.manager import CheckpointManager

    offsets: dict[Any, str] = {}
    for checkpoint in CheckpointManager(config).read_all().values():
        offsets.update(checkpoint.input_offsets)
    assert committed_counts(config) == dict(counts_at_offsets(config, offsets))


def live_counts(config: Config) -> dict[str, int]:
    """The live stores' contents (not the committed checkpoints), over every task."""
    from sparkpoint.storage.kv.rocksdb import RocksDBEngine

    out: dict[str, int] = {}
    for task_dir in sorted(config.store_base_dir.iterdir()):
        if task_dir.name.startswith("."):
            continue  # not a task's directory (standby copies)
        engine = RocksDBEngine("user-counts", task_dir / "user-counts")
        out.update({k.decode(): int.from_bytes(v, "big", signed=True) for k, v in engine.all()})
        engine.close()
    return out


def changelog_view(config: Config) -> dict[str, int]:
    """The store as its changelog says: the newest value per key over every partition."""
    from sparkpoint.model import SystemStreamPartition
    from sparkpoint.storage.changelog.backend import changelog_stream

    systems = Systems(config)
    changelog = changelog_stream(config, "user-counts")
    out: dict[str, int] = {}
    for p in range(systems.admin(changelog.system).partition_count(changelog.stream)):
        ssp = SystemStreamPartition(changelog.system, changelog.stream, p)
        for rec in systems.consumer(changelog.system).read(ssp, "0", "10000000"):
            key = (rec.key or b"").decode()
            if rec.value is None:
                out.pop(key, None)
            else:
                out[key] = int.from_bytes(rec.value, "big", signed=True)
    return out


def run_until_caught_up(coordinator: Any) -> None:
    """Run a started or new job coordinator until it has read all its input; close it."""
    try:
        coordinator.run(until_caught_up=True)
    finally:
        coordinator.close()


def input_progress(checkpoints: Mapping[Any, Any], config: Config) -> int:
    """The input messages the checkpoints cover, summed over the job's input SSPs (a task's V1
    checkpoint, read while it is the only one yet, also holds changelog offsets, as
    ``<checkpoint id>:<offset>``)."""
    return sum(
        int(o) + 1
        for c in checkpoints.values()
        for ssp, o in c.input_offsets.items()
        if ssp.system_stream in config.inputs
    )


T = TypeVar("T")


def crash_runs(
    run_job: Callable[[], object], write: Callable[[int], Counter[T]], flag: Path
) -> Counter[T]:
    """Input in rounds (``write(round)``: what it wrote), the job run to the end after each,
    crashing once at its failpoint on the way (after ``flag``'s count of passes), then run to
    the end again; everything written."""
    import pytest

    from sparkpoint.errors import SparkpointError
    from sparkpoint.failpoints import InjectedCrash

    expected = write(0)
    run_job()
    flag.write_text("1")
    with pytest.raises((InjectedCrash, SparkpointError)):
        for i in range(1, 5):
            expected += write(i)
            run_job()
    assert not flag.exists(), "the crash point was never reached"
    run_job()
    return expected


def add_input(config: Config, value: bytes, user: str, partition: int = 2) -> None:
    """One record of ``user`` with the value ``value`` (bytes as they are) on pageviews."""
    producer = Systems(config).producer("filelog")
    producer.send("pageviews", partition, Record("", user.encode(), value, 0))
    producer.flush()


def dead_letters(config: Config) -> list[tuple[bytes | None, dict[str, Any]]]:
    """The (key, letter) of every record on filelog.dead-letters, partition by partition,
    parsed with json alone."""
    systems = Systems(config)
    admin = systems.admin("filelog")
    if "dead-letters" not in admin.list_streams():
        return []
    out = []
    for p in range(admin.partition_count("dead-letters")):
        ssp = SystemStreamPartition("filelog", "dead-letters", p)
        end = admin.get_metadata([ssp])[ssp].upcoming
        records = systems.consumer("filelog").read(ssp, "0", end)
        out += [(r.key, json.loads(r.value)) for r in records]
    return out
