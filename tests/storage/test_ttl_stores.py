"""Store TTL in a running job (the example's count per user, on the inline runner with a fake
clock): expired counts are hidden from the state tools, swept from the changelog at a commit,
and a restore from the changelog or the blob store shows exactly what the live store showed."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.config import Config
from sparkpoint.model import SystemStreamPartition
from sparkpoint.model.clock import use_clock
from sparkpoint.storage.changelog.backend import changelog_stream
from sparkpoint.system.registry import Systems
from tests.helpers import changelog_job as make
from tests.helpers import committed_counts, generate
from tests.helpers import run_job as run

TTL = 60_000


class Clock:
    now = 1_700_000_000_000


@pytest.fixture
def clock() -> Iterator[type[Clock]]:
    with use_clock(lambda: Clock.now):
        yield Clock


def changelog_keys(config: Config) -> set[str]:
    """The users whose newest changelog record is a value (not a tombstone)."""
    systems = Systems(config)
    changelog = changelog_stream(config, "user-counts")
    live: set[str] = set()
    for p in range(4):
        ssp = SystemStreamPartition(changelog.system, changelog.stream, p)
        for rec in systems.consumer(changelog.system).read(ssp, "0", "10000000"):
            key = (rec.key or b"").decode()
            if key.startswith("\x00"):
                continue  # the store's format entry
            (live.discard if rec.value is None else live.add)(key)
    systems.close()
    return live


def expire(counts: Counter[str], touched: set[str]) -> Counter[str]:
    """The counts of the users written since the cut (the rest expired)."""
    return Counter({u: n for u, n in counts.items() if u in touched})


@pytest.mark.parametrize("backend", ["changelog", "blobstore"])
def test_expired_counts_are_hidden_swept_and_stay_expired_after_a_restore(
    tmp_path: Path, clock: type[Clock], log_system: dict[str, str], backend: str
) -> None:
    overrides = {"stores.user-counts.rocksdb.ttl.ms": str(TTL)}
    if backend == "blobstore":
        overrides |= {
            "stores.user-counts.changelog": "",
            "stores.user-counts.backup.factories": "blobstore",
        }
    config = make(tmp_path, log_system, **overrides)
    a = generate(config, tmp_path / "a.yaml", 600, seed=71, users=15)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(a)

    clock.now += 40_000
    b = generate(config, tmp_path / "b.yaml", 25, seed=72, users=30)
    run(config, until_caught_up=True)
    clock.now += 30_000  # what only the first batch wrote is 70 s old now; the rest 30 s
    expected = expire(a + b, set(b))
    assert set(a) - set(b), "some users must be written only before the cut"
    assert committed_counts(config) == dict(expected)  # hidden from the state tools at once

    c = generate(config, tmp_path / "c.yaml", 40, seed=73, users=30)
    run(config, until_caught_up=True)  # its commit sweeps the expired counts
    expected += c  # an expired user counts again from zero
    assert committed_counts(config) == dict(expected)
    if backend == "changelog":
        assert changelog_keys(config) == set(expected)  # tombstones for the expired

    shutil.rmtree(config.store_base_dir)  # the host is lost: restore from the backend
    assert committed_counts(config) == dict(expected)
    d = generate(config, tmp_path / "d.yaml", 40, seed=74, users=30)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected + d)

    clock.now += TTL
    assert committed_counts(config) == {}  # everything expired, whatever the backend


def test_a_ttl_added_to_a_store_with_data_counts_from_the_restart(
    tmp_path: Path, clock: type[Clock]
) -> None:
    config = make(tmp_path)
    a = generate(config, tmp_path / "a.yaml", 300, seed=75, users=10)
    run(config, until_caught_up=True)
    with_ttl = make(tmp_path, **{"stores.user-counts.rocksdb.ttl.ms": str(TTL)})
    clock.now += 10 * TTL  # however old the data is, it is stamped at the restart
    b = generate(with_ttl, tmp_path / "b.yaml", 30, seed=76, users=10)
    run(with_ttl, until_caught_up=True)
    assert committed_counts(with_ttl) == dict(a + b)
    clock.now += TTL
    assert committed_counts(with_ttl) == {}
    without = make(tmp_path)  # and removed again: nothing expired comes back
    assert committed_counts(without) == {}


def test_hosts_whose_clocks_disagree_expire_entries_on_the_driver_s_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry written on a host whose clock is 10 minutes behind and read on one 10 minutes
    ahead looked 20 minutes old there, and a 1-minute TTL hid it at once: state lost to the
    skew. A Spark worker now reads processing time as its clock moved to the driver's (the
    batch plan carries the driver's wall clock), so the entry is as old as the driver says."""
    import time

    from sparkpoint.model import clock
    from sparkpoint.storage.kv.memory import InMemoryEngine
    from sparkpoint.storage.kv.ttl import TtlEngine

    def real() -> int:
        return time.time_ns() // 1_000_000

    store = TtlEngine(InMemoryEngine("counts"), 60_000)

    def on_host(skew_ms: int, planned: int | None) -> None:  # a worker given a plan
        monkeypatch.setattr(clock, "wall_ms", lambda: real() + skew_ms)
        clock.follow(None, planned)

    try:
        on_host(-600_000, real())
        store.put(b"k", b"v")
        on_host(+600_000, real())
        assert store.get(b"k") == b"v"  # written and read on the driver's time
        assert clock.now_ms() <= real() + 1_000  # never ahead of the driver's
        on_host(+600_000, None)  # each host's own clock, as before
        assert store.get(b"k") is None  # 20 minutes old to it: expired
    finally:
        clock.follow(None)


def test_a_later_phase_of_a_batch_does_not_read_an_earlier_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each phase of a batch follows the same plan: its offset taken again, processing time
    would start back at the driver's planning time; it never goes below what was read."""
    from sparkpoint.model import clock

    now = [1_000_000]
    monkeypatch.setattr(clock, "wall_ms", lambda: now[0])
    try:
        clock.follow(None, 2_000_000)  # the plan, planned at the driver's 2,000,000
        now[0] += 5_000  # the read phase takes 5 s
        assert clock.now_ms() == 2_005_000
        clock.follow(None, 2_000_000)  # the step phase: the same plan
        assert clock.now_ms() == 2_005_000  # not 2,000,000
        now[0] += 1_000
        assert clock.now_ms() == 2_005_000  # until the driver's time passes it
        now[0] += 9_000
        assert clock.now_ms() == 2_010_000
    finally:
        clock.follow(None)
