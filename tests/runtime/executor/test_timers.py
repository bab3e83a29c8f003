"""Durable per-key timers and event time in the task API, on the inline runner with a fake
clock (``use_clock``): timers fire once in committed state across a crash at every failpoint,
a timer due while the job is down fires at the next start, the watermark advances (and idle
partitions stop holding it back), late records are flagged, and bad use says what to fix."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from generate import events
from timer_task import IDLE_MS

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.failpoints import POINTS, InjectedCrash
from sparkpoint.model import SystemStream
from sparkpoint.model.clock import use_clock
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.runtime.driver.metrics import JobMetrics
from sparkpoint.system.registry import Systems
from sparkpoint.testing.backends import NAME as COPY
from sparkpoint.tools.streams import read_json_lines
from tests.helpers import changelog_job as make
from tests.helpers import committed_counts, generate
from tests.helpers import run_job as run

T0 = 1_700_000_000_000


class Clock:
    now = T0


@pytest.fixture
def clock() -> Iterator[type[Clock]]:
    Clock.now = T0
    with use_clock(lambda: Clock.now):
        yield Clock


def timer_job(tmp_path: Path, log: dict[str, str] | None = None, **overrides: str) -> Config:
    system = "filelog" if log is None else "log"
    return make(
        tmp_path,
        log,
        **{
            "task.class": "timer_task:IdleUsers",
            "stores.timers.factory": "rocksdb",
            "stores.timers.changelog": f"{system}.timers-changelog",
            "task.timers.store": "timers",
            **overrides,
        },
    )


def rows(config: Config, stream: str) -> list[dict[str, Any]]:
    system = config.inputs[0].system
    systems = Systems(config)
    try:
        admin = systems.admin(system)
        if stream not in admin.list_streams():
            return []
        return list(read_json_lines(config, systems, SystemStream(system, stream)))
    finally:
        systems.close()


def idle(config: Config) -> list[tuple[str, int]]:
    return sorted((r["value"]["user"], r["value"]["count"]) for r in rows(config, "idle"))


def test_a_timer_fires_once_when_due_and_never_again(
    tmp_path: Path, clock: type[Clock], log_system: dict[str, str]
) -> None:
    config = timer_job(tmp_path, log_system)
    a = generate(config, tmp_path / "a.yaml", 300, seed=81, users=12)
    run(config, until_caught_up=True)
    assert idle(config) == [] and committed_counts(config) == dict(a)

    clock.now += IDLE_MS - 1
    b = generate(config, tmp_path / "b.yaml", 5, seed=82, users=2)  # users 0 and 1 stay busy
    run(config, until_caught_up=True)
    assert idle(config) == []  # 1 ms early: nothing is due

    clock.now += 1
    c = generate(config, tmp_path / "c.yaml", 3, seed=83, users=1)
    run(config, until_caught_up=True)
    busy = set(b) | set(c)
    fired = sorted((u, n) for u, n in (a + b + c).items() if u not in busy)
    assert idle(config) == fired  # each idle user once, with its count
    assert committed_counts(config) == {u: n for u, n in (a + b + c).items() if u in busy}

    clock.now += 10 * IDLE_MS  # the busy users go idle too (user-00000 views once more)
    generate(config, tmp_path / "d.yaml", 1, seed=84, users=1)
    run(config, until_caught_up=True)
    users = [u for u, _ in idle(config)]
    assert len(users) == len(set(users)), "a timer fired twice"
    assert set(users) == set(a + b + c) - {"user-00000"}


def test_a_timer_due_while_the_job_is_down_fires_at_the_next_start(
    tmp_path: Path, clock: type[Clock]
) -> None:
    config = timer_job(tmp_path)
    a = generate(config, tmp_path / "a.yaml", 100, seed=85, users=5)
    run(config, until_caught_up=True)
    shutil.rmtree(config.store_base_dir)  # and the host is lost while the job is down
    clock.now += 24 * 3600 * 1000
    run(config, until_caught_up=True)  # no new input: the start's first batch fires them
    assert idle(config) == sorted(a.items())
    assert committed_counts(config) == {}


@pytest.mark.parametrize("point", [p for p in POINTS if p != "during-restore"])
def test_a_crash_at_every_step_never_fires_a_timer_twice_in_committed_state(
    tmp_path: Path, clock: type[Clock], point: str
) -> None:
    flag = tmp_path / "crash.flag"
    config = timer_job(
        tmp_path,
        **{
            "stores.user-counts.backup.factories": f"changelog,{COPY}",
            "testing.copy.dir": str(tmp_path / "copies"),
            "testing.crash.at": point,
            "testing.crash.flag": str(flag),
        },
    )
    a = generate(config, tmp_path / "a.yaml", 200, seed=88, users=8)
    run(config, until_caught_up=True)
    clock.now += IDLE_MS
    generate(config, tmp_path / "b.yaml", 2, seed=89, users=1)
    flag.write_text("1")
    with pytest.raises((InjectedCrash, SparkpointError)):
        for _ in range(3):
            run(config, until_caught_up=True)
            generate(config, tmp_path / "c.yaml", 1, seed=90, users=1)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run(config, until_caught_up=True)
    fired = Counter(u for u, _ in idle(config))
    assert set(fired) == set(a) - {"user-00000"}  # at least once each
    assert "user-00000" in committed_counts(config) and len(committed_counts(config)) == 1
    clock.now += IDLE_MS // 2  # nothing new is due; a refire would show up here
    generate(config, tmp_path / "d.yaml", 1, seed=91, users=1)
    run(config, until_caught_up=True)
    assert Counter(u for u, _ in idle(config)) == fired


def test_event_time_timers_fire_as_the_watermark_passes_and_late_records_are_flagged(
    tmp_path: Path, clock: type[Clock]
) -> None:
    config = timer_job(
        tmp_path,
        **{"testing.timers.event": "true", "task.watermark.idle.ms": str(10 * IDLE_MS)},
    )
    generate(config, tmp_path / "a.yaml", 400, seed=92, users=10)  # 4 partitions, all busy
    run(config, until_caught_up=True)
    due = rows(config, "due")
    assert due, "the watermark passed some views' event time + 1000"
    assert all(r["value"]["due"] == r["value"]["at"] + 1000 for r in due)
    assert rows(config, "late") == []
    # with no input for task.watermark.idle.ms, every partition is idle: each task's watermark
    # goes to the largest event time it saw, and every view's timer up to it fires, once
    clock.now += 10 * IDLE_MS + 1
    run(config, until_caught_up=True)
    admin = Systems(config).admin("filelog")
    by_task: dict[int, list[int]] = {}
    for e in events(400, 92, 10):
        by_task.setdefault(admin.partition_for_key(str(e["user"]).encode(), 4), []).append(
            int(str(e["ts"]))
        )
    due = rows(config, "due")
    assert len(due) == sum(1 for ts in by_task.values() for at in ts if at + 1000 <= max(ts))
    assert len({(r["value"]["user"], r["value"]["at"]) for r in due}) == len(due)


def test_records_behind_the_watermark_are_late_never_dropped_and_past_timers_fire_at_once(
    tmp_path: Path, clock: type[Clock]
) -> None:
    config = timer_job(tmp_path, **{"testing.timers.event": "true"})
    first = generate(config, tmp_path / "a.yaml", 200, seed=94, users=10)
    run(config, until_caught_up=True)
    fired = len(rows(config, "due"))
    assert fired > 0
    # the same events again (their event times are behind the watermark now)
    again = generate(config, tmp_path / "b.yaml", 200, seed=94, users=10)
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    end = coordinator.upcoming()
    report, results = coordinator.run_batch(end, commit=True)
    coordinator.close()
    late = [r["value"]["at"] for r in rows(config, "late")]
    assert 0 < len(late) <= 200 and max(late) < max(int(str(e["ts"])) for e in events(200, 94, 10))
    assert sum(r.late for r in results) == len(late)  # counted for the metrics
    assert sum(r.timers_fired for r in results) == fired
    metrics = JobMetrics("j")
    metrics.record(report)
    # each task's watermark after the batch: reported, and a gauge (issue 72)
    marks = {f"sparkpoint.task.{r.task}": r.watermark_ms for r in results}
    assert all(m is not None and m > T0 for m in marks.values())
    gauges = {g: v.get("task_watermark_ms") for g, v in metrics.snapshot().items()}
    assert {g: gauges[g] for g in marks} == marks
    counted = {g: v.get("task_late_messages_total", 0) for g, v in metrics.snapshot().items()}
    assert sum(counted.values()) == len(late)
    assert committed_counts(config) == dict(first + again)  # late views are counted all the same
    # a timer registered behind the watermark (each replayed view's, at its time + 1000) fires
    # at the end of the batch that registered it: every one that fired the first time, again
    assert len(rows(config, "due")) == 2 * fired


def test_a_timer_without_a_timer_store_names_the_key(tmp_path: Path, clock: type[Clock]) -> None:
    config = timer_job(tmp_path, **{"task.timers.store": ""})
    generate(config, tmp_path / "a.yaml", 5, seed=95, users=2)
    with pytest.raises(SparkpointError, match="set task.timers.store to one of the job's stores"):
        run(config, until_caught_up=True)


def test_a_timer_store_that_is_not_a_store_is_a_config_error(
    tmp_path: Path, clock: type[Clock]
) -> None:
    config = timer_job(tmp_path, **{"task.timers.store": "nope"})
    generate(config, tmp_path / "a.yaml", 5, seed=96, users=2)
    with pytest.raises(ConfigError, match=r"task.timers.store='nope': the job has no such store"):
        run(config, until_caught_up=True)


def test_a_message_without_its_event_time_field_names_the_offset(
    tmp_path: Path, clock: type[Clock]
) -> None:
    config = timer_job(tmp_path, **{"streams.pageviews.event.time.field": "when"})
    generate(config, tmp_path / "a.yaml", 5, seed=97, users=2)
    with pytest.raises(
        SparkpointError,
        match=r"message at filelog\.pageviews\.\d offset \d+ has no event time: "
        r"streams\.pageviews\.event\.time\.field='when'",
    ):
        run(config, until_caught_up=True)


def test_an_idle_job_ticks_without_committing_and_its_timers_still_fire(
    tmp_path: Path, clock: type[Clock]
) -> None:
    """Nothing read, nothing fired: ``task.commit.ms`` runs a batch that fires what is due
    and writes no checkpoint (issue 72: an idle job committed every interval); a timer that
    comes due while the job idles fires in the next tick and is committed."""
    config = timer_job(tmp_path, **{"task.commit.ms": "20", "task.poll.interval.ms": "5"})
    views = generate(config, tmp_path / "a.yaml", 60, seed=86, users=4)
    summary = JobCoordinator(config, InlineRunner()).run(max_batches=12)
    assert summary.batches >= 12 and summary.processed == 60
    # the batches that read, the first interval's commit, the stop's: not one a tick
    assert summary.commits <= 3, summary
    assert committed_counts(config) == dict(views)

    class Advance:  # the users go idle while the job runs: after its third batch
        def on_start(self, model: Any) -> None: ...
        def on_startpoint(self, *args: Any) -> None: ...
        def on_end(self, summary: Any) -> None: ...
        def on_batch(self, report: Any) -> None:
            if report.batch == 3:
                clock.now += IDLE_MS

    coordinator = JobCoordinator(config, InlineRunner(), listener=Advance())
    summary = coordinator.run(max_batches=12)
    coordinator.close()
    assert idle(config) == sorted(views.items())  # fired by a tick
    assert committed_counts(config) == {}  # and committed
    assert 1 <= summary.commits <= 3, summary
