"""Windows in the task API (``context.windows``), proven against a plain Python reference: the
example ``examples/windows`` (1-minute tumbling counts and 30 s sessions per user, watermark
lateness 5 s) run in rounds, on filelog and Kafka, and across a crash at every failpoint. After
each round the windows that went out are exactly the reference's closed windows for the input
so far (so none went out before the watermark passed it), and the window stores hold only the
windows still open (state is bounded)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from windows_reference import Closed, closed_windows

from sparkpoint import OutgoingMessageEnvelope, StreamTask, count, sum_of
from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.failpoints import POINTS, InjectedCrash
from sparkpoint.model import SystemStream, TaskName
from sparkpoint.runtime.executor.windows import TaskWindows
from sparkpoint.storage.windows import WindowSpec
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.testing import JobTestDriver
from sparkpoint.tools.state import committed_raw_entries
from sparkpoint.tools.streams import Message, read_json_lines, send_messages
from tests.conftest import WINDOWS_DIR, pageviews_config
from tests.e2e.cli import sp
from tests.helpers import run_job as run

Views = list[tuple[str, int]]


def job(tmp_path: Path, log: dict[str, str] | None = None, **overrides: str) -> Config:
    values = pageviews_config(
        tmp_path,
        log,
        job=WINDOWS_DIR / "job.yaml",
        **{"task.batch.max.messages": "150", "task.commit.ms": "0", **overrides},
    )
    config = load_config(None, values)
    Systems(config).admin(config.inputs[0].system).create_stream(StreamSpec("pageviews", 4))
    return config


def views(n: int, seed: int, start_ms: int) -> Views:
    """``n`` views of 12 users in time order, 0-4 s apart (sessions end and minutes close)."""
    rng = random.Random(seed)
    at, out = start_ms, []
    for _ in range(n):
        at += rng.randint(0, 4_000)
        out.append((f"user-{rng.randrange(12):02d}", at))
    return out


def send(config: Config, batch: Views) -> None:
    systems = Systems(config)
    try:
        stream = SystemStream(config.inputs[0].system, "pageviews")
        messages = [
            Message({"user": u, "page": "/", "ts": t}, key=u, timestamp=t) for u, t in batch
        ]
        send_messages(config, systems, stream, messages)
    finally:
        systems.close()


def reference(
    config: Config, sent: Views, *, at_end: bool = False
) -> tuple[set[Closed], set[Closed], int]:
    admin = Systems(config).admin(config.inputs[0].system)
    partition_of = lambda user: admin.partition_for_key(user.encode(), 4)  # noqa: E731
    return closed_windows(sent, partition_of, at_end=at_end)


def emitted(config: Config, stream: str, fields: tuple[str, ...]) -> Counter[tuple[Any, ...]]:
    systems = Systems(config)
    try:
        ss = SystemStream(config.inputs[0].system, stream)
        if ss.stream not in systems.admin(ss.system).list_streams():
            return Counter()
        return Counter(
            tuple(r["value"][f] for f in fields) for r in read_json_lines(config, systems, ss)
        )
    finally:
        systems.close()


MINUTE = ("user", "window_start", "window_end", "count")
SESSION = ("user", "session_start", "session_end", "views")


def check(config: Config, sent: Views, *, once: bool, at_end: bool = False) -> None:
    """What went out is the reference's closed windows (``at_end``: every window, the input
    ended), each once with ``once``; the window stores hold the ones still open."""
    minutes, sessions, still_open = reference(config, sent, at_end=at_end)
    assert minutes and sessions and (still_open or at_end)  # some windows closed, not all
    got_minutes = emitted(config, "user-minute-counts", MINUTE)
    got_sessions = emitted(config, "user-sessions", SESSION)
    assert set(got_minutes) == minutes
    assert set(got_sessions) == sessions
    if once:
        assert max(got_minutes.values()) == 1 and max(got_sessions.values()) == 1
    stored = sum(1 for s in ("minute-counts", "sessions") for _ in committed_raw_entries(config, s))
    assert stored == still_open  # a closed window's state is gone


def test_windows_close_exactly_as_the_reference_says(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = job(tmp_path, log_system)
    sent: Views = []
    for round_, n in enumerate((400, 300, 500)):
        batch = views(n, seed=70 + round_, start_ms=sent[-1][1] if sent else 0)
        send(config, batch)
        sent += batch
        run(config, until_caught_up=True)
        check(config, sent, once=True)
    assert emitted(config, "late-views", ("key",)) == Counter()  # in order: nothing late


@pytest.mark.parametrize("point", [p for p in POINTS if p != "during-restore"])
def test_a_crash_at_every_step_leaves_the_windows_exact(tmp_path: Path, point: str) -> None:
    flag = tmp_path / "crash.flag"
    config = job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    sent = crashed_in_round_two(config, flag, point, (500, 80), (600, 81), lambda _c, _s: None)
    check(config, sent, once=False)  # a window may go out again, always with its one value


def crashed_in_round_two(
    config: Config,
    flag: Path,
    point: str,
    first: tuple[int, int],
    second: tuple[int, int],
    check_first: Any,
) -> Views:
    """Views (``(n, seed)``) run to the end, ``check_first(config, sent)``; then more, whose
    run crashes at ``point`` (``flag``), and a run after it: every view sent."""
    sent = views(first[0], seed=first[1], start_ms=0)
    send(config, sent)
    run(config, until_caught_up=True)
    check_first(config, sent)
    more = views(second[0], seed=second[1], start_ms=sent[-1][1])
    send(config, more)
    sent += more
    flag.write_text("1")
    with pytest.raises((InjectedCrash, SparkpointError)):
        run(config, until_caught_up=True)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run(config, until_caught_up=True)
    return sent


class _Sums(StreamTask):
    def init(self, context: Any) -> None:
        self.sums = context.windows.tumbling(
            "w", size_ms=1000, aggregate=sum_of(), emit=lambda window, collector: None
        )

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.sums.add(envelope.key, envelope.event_time, envelope.message)


BAD = {
    "job.name": "sums",
    "systems.log.factory": "filelog",
    "task.inputs": "log.in",
    "streams.in.partitions": "1",
    "stores.w.factory": "rocksdb",
    "stores.w.key.serde": "string",
    "stores.timers.factory": "rocksdb",
    "task.timers.store": "timers",
}


@pytest.mark.parametrize(
    ("overrides", "value", "error"),
    [
        ({}, "x", r"window store 'w': the sum aggregate failed on key 'a' at 5: TypeError"),
        (
            {"stores.w.factory": "", "stores.w.key.serde": ""},
            1,
            r"window store 'w': the job has no such store",
        ),
        ({"stores.w.rocksdb.ttl.ms": "1000"}, 1, r"window store 'w' has a TTL"),
        ({"task.timers.store": ""}, 1, r"set task.timers.store to one of the job's stores"),
    ],
)
def test_bad_window_use_names_the_store_and_the_fix(
    tmp_path: Path, overrides: dict[str, str], value: Any, error: str
) -> None:
    config = {k: v for k, v in {**BAD, **overrides}.items() if v}
    with JobTestDriver(config, tmp_path, task=_Sums) as kit:
        kit.send("in", [Message(value, key="a", timestamp=5)])
        with pytest.raises(SparkpointError, match=error):
            kit.run()


def test_state_dump_decodes_window_session_and_timer_stores(tmp_path: Path) -> None:
    config = job(tmp_path)
    send(config, views(200, seed=75, start_ms=0))
    run(config, until_caught_up=True)
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(config.to_dict()))  # JSON is YAML
    dumped = sp("state", "dump", str(job_file), "--store", "minute-counts", "--raw")
    lines = [json.loads(line) for line in dumped.stdout.splitlines()]
    stored = list(committed_raw_entries(config, "minute-counts"))
    assert len(lines) == len(stored) > 0
    assert lines[0]["key"] == repr(stored[0][1])[2:-1]
    assert json.loads(lines[0]["value"])["acc"] > 0  # the window's count so far
    assert lines[0]["key"].startswith("\\x00\\x07user-")  # <key length><key><window start>

    def dump(store: str, *more: str) -> list[dict[str, Any]]:
        out = sp("state", "dump", str(job_file), "--store", store, *more).stdout
        return [json.loads(line) for line in out.splitlines()]

    minutes = dump("minute-counts")  # decoded: its layout is recognised
    assert len(minutes) == len(stored)
    for row in minutes:
        assert row["window_end"] - row["window_start"] == 60_000
        assert row["window_start"] % 60_000 == 0 and row["value"] > 0
        assert row["key"].startswith("user-") and row["task"].startswith("Partition ")
    sessions = dump("sessions")
    assert sessions and all(r["window_end"] >= r["window_start"] for r in sessions)
    timers = dump("timers")
    by_entry: dict[str, list[dict[str, Any]]] = {}
    for row in timers:
        by_entry.setdefault(row["entry"], []).append(row)
    # every open window has its timer, at its end, in the task that holds it
    due = {(r["task"], r["store"], r["key"], r["window_start"]) for r in by_entry["timer"]}
    for store, rows in (("minute-counts", minutes), ("sessions", sessions)):
        assert {(r["task"], store, r["key"], r["window_start"]) for r in rows} <= due
    # a watermark per task: its partition's largest event time less the lateness
    largest = {r["task"]: r["max"] for r in by_entry["event-time"]}
    lateness = config.get_int("task.watermark.lateness.ms")
    assert {r["task"]: r["time"] for r in by_entry["watermark"]} == {
        t: m - lateness for t, m in largest.items()
    }
    shown = json.loads(sp("job", "show", str(job_file), "--json").stdout)
    marks = {r["task"]: r["time"] for r in by_entry["watermark"]}
    assert {t["task"]: t["watermark"] for t in shown["tasks"]} == marks  # as of the commit
    text = sp("job", "show", str(job_file)).stdout
    tasks = [line for line in text.splitlines() if line.startswith("  Partition ")]
    assert len(tasks) == 4 and all("; watermark 1970-01-01T00:" in line for line in tasks), text
    wrong = sp(
        "state", "dump", str(job_file), "--store", "sessions", "--layout", "plain", check=False
    )
    assert wrong.returncode != 0
    assert "--layout window|join|timers" in wrong.stderr and len(wrong.stderr.splitlines()) == 1


class _Triggered(StreamTask):
    """Counts per 1 s window of key ``a``, with the triggers of ``testing.triggers``."""

    def init(self, context: Any) -> None:
        early, lateness = context.config["testing.triggers"].split(",")
        self.counts = context.windows.tumbling(
            "w",
            size_ms=1000,
            aggregate=count(),
            emit=self.emit,
            late_stream="log.late",
            early=early == "early",
            allowed_lateness_ms=int(lateness),
        )

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.counts.add(envelope.key, envelope.event_time, collector=collector)

    def emit(self, window: Any, collector: Any) -> None:
        out = {"start": window.start, "count": window.value, "emission": window.emission}
        collector.send(OutgoingMessageEnvelope(SystemStream("log", "out"), window.key, out))


def _triggered(
    tmp_path: Path, triggers: str, rounds: list[list[int]]
) -> tuple[list[list[tuple[int, int, str]]], list[int], int]:
    """Each round's records (event times of key ``a``) in a batch of their own: what went
    out after each round, the late stream's times, and how many windows the store keeps."""
    config = {**BAD, "testing.triggers": triggers}
    with JobTestDriver(config, tmp_path, task=_Triggered) as kit:
        return run_rounds(kit, rounds, "count")


def run_rounds(
    kit: JobTestDriver, rounds: list[list[int]], value: str
) -> tuple[list[list[tuple[int, int, str]]], list[int], int]:
    """``_triggered``'s rounds on ``kit`` (whose output names the window's value ``value``)."""
    out = []
    for times in rounds:
        kit.send("in", [Message(1, key="a", timestamp=t) for t in times])
        kit.run()
        sent = [m.value for m in kit.output("out")]
        out.append([(v["start"], v[value], v["emission"]) for v in sent])
    late = [m.value["time"] for m in kit.output("late")]
    return out, late, sum(1 for _ in committed_raw_entries(kit.config, "w"))


def test_windows_near_time_zero_wait_for_a_watermark_below_zero(tmp_path: Path) -> None:
    """Issue 72: event times below task.watermark.lateness.ms make the watermark negative,
    which sorted after every timer: each open window went out at the batch's end, then
    reopened and went out again."""
    config = {**BAD, "testing.triggers": "on-time,0", "task.watermark.lateness.ms": "5000"}
    with JobTestDriver(config, tmp_path, task=_Triggered) as kit:
        out, _late, _kept = run_rounds(kit, [[3000, 3200], [4000], [9500]], "count")
    assert out[0] == [] and out[1] == []  # watermarks -1800 and -1000: nothing is closed
    assert out[2] == [(3000, 2, "on_time")]  # 4500: [3000, 4000) closed, once, whole


def test_a_final_watermark_closes_every_window_once(tmp_path: Path) -> None:
    """Issue 72: a bounded run (--until-caught-up) left its still-open windows unemitted;
    --final-watermark ends the input: they go out, once, and a record after it is late."""
    config = {**BAD, "testing.triggers": "on-time,0"}
    with JobTestDriver(config, tmp_path, task=_Triggered) as kit:
        kit.send("in", [Message(1, key="a", timestamp=t) for t in (100, 1500, 2500, 2700)])
        kit.run()
        assert [(m.value["start"], m.value["count"]) for m in kit.output("out")] == [
            (0, 1),
            (1000, 1),
        ]  # the watermark (2700) is inside [2000, 3000)
        kit.run(final_watermark=True)
        assert [(m.value["start"], m.value["count"]) for m in kit.output("out")] == [
            (0, 1),
            (1000, 1),
            (2000, 2),
        ]
        assert sum(1 for _ in committed_raw_entries(kit.config, "w")) == 0  # nothing open
        kit.run(final_watermark=True)  # ended already: nothing again
        assert len(kit.output("out")) == 3
        kit.send("in", [Message(1, key="a", timestamp=2800)])
        kit.run()
        assert len(kit.output("out")) == 3
        assert [m.value["time"] for m in kit.output("late")] == [2800]


def test_allowed_lateness_sends_late_updates_then_forgets_the_window(tmp_path: Path) -> None:
    rounds = [[100], [1500], [500], [700, 3500], [600]]
    out, late, kept = _triggered(tmp_path, "on-time,2000", rounds)
    assert out[0] == []  # the watermark (100) is before the window's end
    assert out[1] == [(0, 1, "on_time")]  # the watermark (1500) passed it: out, and kept
    assert out[2] == [*out[1], (0, 2, "late")]  # 500: late, but within 2 s: an update
    # 700 updates it again; 3500 moves the watermark past [1000, 2000) and past 1000 + 2000,
    # when window [0, 1000) is forgotten
    assert out[3] == [*out[2], (0, 3, "late"), (1000, 1, "on_time")]
    assert out[4] == out[3]  # 600 is past the window's end + its lateness: late
    assert late == [600]
    assert kept == 2  # [1000, 2000) within its lateness, [3000, 4000) open; [0, 1000) gone


def test_early_emissions_go_out_each_batch_that_changes_a_window(tmp_path: Path) -> None:
    out, late, _kept = _triggered(tmp_path, "early,0", [[100, 200], [300], [1500]])
    assert out[0] == [(0, 2, "early")]
    assert out[1] == [(0, 2, "early"), (0, 3, "early")]
    assert out[2][2:] == [(1000, 1, "early"), (0, 3, "on_time")]
    assert late == []


def test_allowed_lateness_is_refused_for_sessions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="allowed_lateness_ms is for event-time tumbling"):
        TaskWindows(TaskName("t"), Config({}), {}, None).open(  # type: ignore[arg-type]
            "w", WindowSpec.session(100), aggregate=count(), emit=print, allowed_lateness_ms=5
        )


def test_a_users_timer_finds_the_windows_closed_before_it_gone(tmp_path: Path) -> None:
    """Closed windows leave the store in one write batch, and before a user's timer due after
    them goes out: its ``on_timer`` finds them gone from the store itself, not only from the
    window store's reads."""
    from sparkpoint.config import load_config
    from sparkpoint.model import SystemStreamPartition, TaskName
    from sparkpoint.runtime.executor.timers import TaskTimers
    from sparkpoint.runtime.executor.windows import WindowedStore
    from sparkpoint.serde import JsonSerde, StringSerde
    from sparkpoint.storage.kv.factory import open_engine
    from sparkpoint.storage.kv.store import SerializedKeyValueStore
    from sparkpoint.storage.timers import TimeKind
    from sparkpoint.storage.windows import WindowSpec, count

    def store(name: str) -> SerializedKeyValueStore[Any, Any]:
        engine = open_engine(name, "in-memory", tmp_path / name)
        return SerializedKeyValueStore(name, engine, StringSerde(), JsonSerde())

    ssp = SystemStreamPartition("log", "in", 0)
    config = load_config(None, {"job.name": "t", "task.watermark.lateness.ms": "0"})
    timers = TaskTimers(TaskName("Partition 0"), config, store("timers"), frozenset({ssp}))
    minutes = store("minutes")
    emitted: list[tuple[str, int]] = []
    windows = WindowedStore(
        "minutes",
        minutes,
        timers,
        WindowSpec.tumbling(10),
        count(),
        lambda window, _collector: emitted.append((window.key, window.start)),
        TimeKind.EVENT,
        None,
    )
    for key, at in (("a", 5), ("b", 5), ("a", 15)):
        windows.add(key, at)
    timers.register("user", 12, "event")  # due after [0, 10) closed, before [10, 20) does
    seen: list[list[bytes]] = []

    class Task:
        def on_timer(self, key: Any, timestamp_ms: int, collector: Any, coordinator: Any) -> None:
            seen.append([k for k, _ in minutes.engine.all()])

    timers.seen(ssp, 12)
    timers.end_of_batch(Task(), None, None)  # type: ignore[arg-type]
    assert emitted == [("a", 0), ("b", 0)]
    assert len(seen) == 1 and len(seen[0]) == 1  # only a's [10, 20) is left
    assert [w.start for w in windows.windows("a")] == [10]


class _Nowhere:
    """A collector that takes nothing (these windows send nothing themselves)."""

    def send(self, envelope: Any) -> None:
        raise AssertionError(f"sent {envelope}")


class _Recorded:
    """A window store over an in-memory engine, its timers, and every key written to either."""

    def __init__(self, tmp_path: Path, spec: WindowSpec, lateness_ms: int = 0) -> None:
        from sparkpoint.model import SystemStreamPartition
        from sparkpoint.serde import JsonSerde, StringSerde
        from sparkpoint.storage.kv.factory import open_engine
        from sparkpoint.storage.kv.store import SerializedKeyValueStore

        self.written: list[bytes] = []

        def store(name: str) -> SerializedKeyValueStore[Any, Any]:
            engine = open_engine(name, "in-memory", tmp_path / name)
            write_batch = engine.write_batch

            def recorded(entries: Any) -> None:
                entries = list(entries)
                self.written += [k for k, _ in entries if not k.startswith((b"W", b"S", b"M"))]
                write_batch(entries)

            engine.write_batch = recorded  # type: ignore[method-assign]
            return SerializedKeyValueStore(name, engine, StringSerde(), JsonSerde())

        self.ssp = SystemStreamPartition("log", "in", 0)
        self.config = load_config(
            None, {"job.name": "t", "task.watermark.lateness.ms": str(lateness_ms)}
        )
        self.timer_store = store("timers")
        self.windows_store = store("windows")
        self.spec = spec

    def batch(
        self,
        records: list[tuple[str, int]],
        *,
        triggers: Any = None,
        user_timers: tuple[tuple[str, int], ...] = (),
        on_emit: Any = None,
    ) -> list[Any]:
        """One batch (its own timers and window store, as a task's): the records in, the
        watermark to the last one's time; what went out, in order: ``(key, start, value)``
        of a window (``+ emission`` with ``triggers``), ``("timer", key, time)`` of a user's
        timer (``user_timers`` are registered first). ``on_emit(windows, window)`` runs as a
        window goes out."""
        from sparkpoint.runtime.executor.timers import TaskTimers
        from sparkpoint.runtime.executor.windows import WindowedStore
        from sparkpoint.storage.timers import TimeKind

        emitted: list[Any] = []
        timers = TaskTimers(
            TaskName("Partition 0"), self.config, self.timer_store, frozenset({self.ssp})
        )

        def emit(w: Any, _collector: Any) -> None:
            extra = (w.emission,) if triggers is not None else ()
            emitted.append((w.key, w.start, w.value, *extra))
            if on_emit is not None:
                on_emit(windows, w)

        windows = WindowedStore(
            "windows",
            self.windows_store,
            timers,
            self.spec,
            count(),
            emit,
            TimeKind.EVENT,
            None,
            triggers,
        )
        for key, at in user_timers:
            timers.register(key, at, "event")
        for key, at in records:
            windows.add(key, at, collector=_Nowhere())
        timers.seen(self.ssp, max(at for _, at in records))

        class Task:
            def on_timer(self, key: Any, timestamp_ms: int, *_: Any) -> None:
                emitted.append(("timer", key, timestamp_ms))

        timers.end_of_batch(Task(), _Nowhere(), None)  # type: ignore[arg-type]
        return emitted

    def stored(self) -> int:
        return sum(1 for _ in self.windows_store.engine.all())


def test_a_window_that_opens_and_closes_in_one_batch_is_never_written(tmp_path: Path) -> None:
    """A batch that spans more event time than its windows closes most of them itself: those
    go out from memory, and neither the window nor its timer is written (nor logged)."""
    recorded = _Recorded(tmp_path, WindowSpec.tumbling(10))
    out = recorded.batch([("a", 1), ("b", 2), ("a", 3), ("a", 12), ("b", 25), ("a", 31)])
    assert out == [("a", 0, 2), ("b", 0, 1), ("a", 10, 1), ("b", 20, 1)]
    assert recorded.stored() == 1  # a's [30, 40), open: written with its timer
    assert sorted(recorded.written) == sorted(
        [b"\x00\x01a" + (30).to_bytes(8, "big"), *[k for k in recorded.written if k[:1] == b"T"]]
    )
    assert len([k for k in recorded.written if k[:1] == b"T"]) == 1  # its timer, nothing else


def test_windows_held_and_windows_stored_go_out_in_one_firing_order(tmp_path: Path) -> None:
    """Windows stored by an earlier batch (with their timers) and windows held from this one
    go out merged, by close time then key, as the timer store orders timers."""
    recorded = _Recorded(tmp_path, WindowSpec.tumbling(10))
    assert recorded.batch([("b", 1), ("d", 12), ("a", 5)]) == [("a", 0, 1), ("b", 0, 1)]
    assert recorded.stored() == 1  # d's [10, 20), stored
    out = recorded.batch([("c", 13), ("a", 14), ("e", 21), ("d", 15), ("b", 33)])
    assert out == [("a", 10, 1), ("c", 10, 1), ("d", 10, 2), ("e", 20, 1)]
    assert recorded.stored() == 1  # b's [30, 40)


def test_sessions_held_in_a_batch_close_exactly(tmp_path: Path) -> None:
    """A session stored by an earlier batch, grown in this one and closed by it, goes out once
    with its whole value, and its entry and old timer are gone."""
    recorded = _Recorded(tmp_path, WindowSpec.session(5))
    assert recorded.batch([("a", 1), ("a", 4)]) == []
    assert recorded.stored() == 1
    assert recorded.batch([("a", 8), ("b", 9), ("b", 30)]) == [("a", 1, 3), ("b", 9, 1)]
    assert recorded.stored() == 1  # b's session at 30
    timers = [k for k, _ in recorded.timer_store.engine.all() if k[:1] == b"T"]
    assert len(timers) == 1 and timers[0][:2] == b"Te"  # b's session's; a's old one is gone


def test_held_windows_past_the_batch_s_limit_go_out_in_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held windows the per-batch limit leaves are written back with their timers, and go out
    in the next batch: none lost, none twice."""
    import sparkpoint.runtime.executor.timers as timers_module

    monkeypatch.setattr(timers_module, "MAX_FIRED_PER_BATCH", 2)
    recorded = _Recorded(tmp_path, WindowSpec.tumbling(10))
    first = recorded.batch([("a", 1), ("b", 2), ("c", 3), ("d", 4), ("a", 50)])
    assert first == [("a", 0, 1), ("b", 0, 1)]
    assert recorded.stored() == 3  # c's and d's, written back; a's [50, 60)
    assert recorded.batch([("a", 51)]) == [("c", 0, 1), ("d", 0, 1)]
    assert recorded.stored() == 1


def _reference_windows(
    spec: WindowSpec, records: list[tuple[str, int]], watermark: int
) -> tuple[list[tuple[str, int, int]], int]:
    """The windows of in-order ``records`` closed by ``watermark`` as ``(key, start, count)``,
    and how many are still open: by the definitions, a record at a time."""
    windows: dict[tuple[str, int], list[int]] = {}  # (key, start) -> [end, count]
    if spec.is_session:
        by_key: dict[str, list[int]] = {}
        for key, at in records:
            by_key.setdefault(key, []).append(at)
        for key, times in by_key.items():
            start = end = times[0]
            n = 0
            for at in times:
                if at - end > spec.gap_ms:
                    windows[(key, start)] = [end, n]
                    start, n = at, 0
                end, n = at, n + 1
            windows[(key, start)] = [end, n]
    else:
        for key, at in records:
            for start, end in spec.windows_of(at):
                windows.setdefault((key, start), [end, 0])[1] += 1
    closed = sorted(
        (key, start, n)
        for (key, start), (end, n) in windows.items()
        if spec.closes_at(end) <= watermark
    )
    return closed, len(windows) - len(closed)


@pytest.mark.parametrize(
    "spec", [WindowSpec.tumbling(10), WindowSpec.hopping(12, 4), WindowSpec.session(6)]
)
def test_windows_held_or_stored_across_random_batches_match_the_definitions(
    tmp_path: Path, spec: WindowSpec
) -> None:
    """In-order records of a few keys in batches of random sizes: some windows open and close
    within a batch (held), others span batches (stored, then closed by their timers, or held
    once a later batch changes and closes them). Everything that went out, and what the store
    keeps, is what the definitions say."""
    rng = random.Random(17)
    recorded = _Recorded(tmp_path, spec)
    at, sent, out = 0, [], []
    for _ in range(30):
        batch = []
        for _ in range(rng.randint(1, 25)):
            at += rng.choice([0, 1, 2, 3, 9])
            batch.append((rng.choice("abcd"), at))
        out += recorded.batch(batch)
        sent += batch
    closed, still_open = _reference_windows(spec, sent, at)
    assert sorted(out) == closed and len(out) == len(set(out))
    assert recorded.stored() == still_open


#: the hopping windows of the hopping tests: a minute, starting every 20 s
HOP_SIZE, HOP_SLIDE = 60_000, 20_000


class _Hops(StreamTask):
    """Views per user in hopping windows, in the example's ``minute-counts`` store, sent to
    ``user-minute-counts`` as the example's minutes are."""

    def init(self, context: Any) -> None:
        self.hops = context.windows.hopping(
            "minute-counts",
            size_ms=HOP_SIZE,
            slide_ms=HOP_SLIDE,
            aggregate=count(),
            emit=self.emit,
        )

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.system = envelope.ssp.system
        self.hops.add(envelope.key, envelope.event_time)

    def emit(self, window: Any, collector: Any) -> None:
        out = {"user": window.key, "window_start": window.start, "window_end": window.end}
        stream = SystemStream(self.system, "user-minute-counts")
        collector.send(OutgoingMessageEnvelope(stream, window.key, {**out, "count": window.value}))


def check_hops(config: Config, sent: Views) -> None:
    """The hopping windows that went out are those each task's watermark (its largest event
    time less the job's 5 s lateness) closed, with their counts; the store keeps the rest."""
    admin = Systems(config).admin(config.inputs[0].system)
    spec = WindowSpec.hopping(HOP_SIZE, HOP_SLIDE)
    top: dict[int, int] = {}
    counts: Counter[tuple[str, int]] = Counter()
    for user, at in sent:
        p = admin.partition_for_key(user.encode(), 4)
        top[p] = max(top.get(p, at), at)
        for start, _end in spec.windows_of(at):
            counts[(user, start)] += 1
    closed = set()
    for (user, start), n in counts.items():
        if start + HOP_SIZE <= top[admin.partition_for_key(user.encode(), 4)] - 5_000:
            closed.add((user, start, start + HOP_SIZE, n))
    assert 0 < len(closed) < len(counts)  # the input closes some windows, not all
    assert set(emitted(config, "user-minute-counts", MINUTE)) == closed
    stored = sum(1 for _ in committed_raw_entries(config, "minute-counts"))
    assert stored == len(counts) - len(closed)


@pytest.mark.parametrize("point", ["after-checkpoint-write", "during-cleanup"])
def test_hopping_windows_are_exact_across_a_crash(
    tmp_path: Path, log_system: dict[str, str], point: str
) -> None:
    flag = tmp_path / "crash.flag"
    config = job(
        tmp_path,
        log_system,
        **{
            "task.class": f"{__name__}:_Hops",
            "testing.crash.at": point,
            "testing.crash.flag": str(flag),
        },
    )
    check_hops(config, crashed_in_round_two(config, flag, point, (400, 84), (500, 85), check_hops))


def test_windows_with_triggers_still_go_out_in_the_batch_that_closes_them(tmp_path: Path) -> None:
    """A window store with early emissions or an allowed lateness keeps its windows after they
    go out (no window is held): its changes are written before the timers fire, so a window
    opened and closed in one batch goes out on time in that batch."""
    from sparkpoint.runtime.executor.windows import Triggers

    late = _Recorded(tmp_path / "late", WindowSpec.tumbling(10))
    assert late.batch([("a", 1), ("a", 40)], triggers=Triggers(allowed_lateness_ms=5)) == [
        ("a", 0, 1, "on_time")
    ]
    early = _Recorded(tmp_path / "early", WindowSpec.tumbling(10))
    assert early.batch([("a", 1), ("a", 40)], triggers=Triggers(early=True)) == [
        ("a", 0, 1, "early"),
        ("a", 40, 1, "early"),
        ("a", 0, 1, "on_time"),
    ]


def test_a_user_s_timer_among_held_windows_keeps_the_firing_order(tmp_path: Path) -> None:
    """A user's timer due before held windows writes them back (its ``on_timer`` sees them in
    the store); they still go out in their turn, before windows that close later."""
    recorded = _Recorded(tmp_path, WindowSpec.tumbling(10))
    assert recorded.batch([("a", 3), ("c", 5), ("b", 9)]) == []  # watermark 9: all stored
    out = recorded.batch([("a", 4), ("b", 15), ("d", 30)], user_timers=(("u", 6),))
    # a's [0, 10) changed (held), b's and c's stored; b's [10, 20) new (held)
    assert out == [("timer", "u", 6), ("a", 0, 2), ("b", 0, 1), ("c", 0, 1), ("b", 10, 1)]
    assert recorded.stored() == 1  # d's [30, 40): still open


def test_reading_a_window_store_while_its_windows_go_out_delays_none(tmp_path: Path) -> None:
    """Emit code that reads the store's windows writes the held ones back: they still go out
    in this batch, in their turn."""
    recorded = _Recorded(tmp_path, WindowSpec.tumbling(10))
    seen: list[int] = []

    def read(windows: Any, window: Any) -> None:
        seen.append(len(windows.windows(window.key)))

    records = [("x", 1), ("x", 12), ("y", 25), ("z", 33), ("z", 45)]
    out = recorded.batch(records, on_emit=read)
    assert out == [("x", 0, 1), ("x", 10, 1), ("y", 20, 1), ("z", 30, 1)]
    assert seen == [1, 0, 0, 1]  # x's [10, 20) after [0, 10); z's [40, 50) is open
    assert recorded.stored() == 1


def test_a_window_store_opened_twice_in_a_batch_is_refused(tmp_path: Path) -> None:
    """Two objects over one window store would each hold their own changes and windows (and
    one would be dropped): the second open names the store and the fix."""
    from sparkpoint.runtime.executor.timers import TaskTimers

    recorded = _Recorded(tmp_path, WindowSpec.tumbling(10))
    timers = TaskTimers(
        TaskName("Partition 0"), recorded.config, recorded.timer_store, frozenset({recorded.ssp})
    )
    stores = {"minutes": recorded.windows_store}
    opener = TaskWindows(TaskName("Partition 0"), recorded.config, stores, timers)
    opener.tumbling("minutes", size_ms=10, aggregate=count(), emit=lambda w, c: None)
    with pytest.raises(ConfigError, match="store 'minutes' is opened twice in one batch"):
        opener.tumbling("minutes", size_ms=10, aggregate=count(), emit=lambda w, c: None)


@pytest.mark.parametrize("rollup_first", [True, False], ids=["rollup-opened-first", "after"])
def test_an_early_emission_that_adds_to_another_window_store_is_written(
    tmp_path: Path, rollup_first: bool
) -> None:
    """A store's early updates go out as it writes the batch's windows; an ``emit`` that adds
    them to another window store (a rollup) changes that store after its own write may have
    run in the same pass (here: a record added by ``window()``, after the timers). The change
    is written before the batch ends, in either order of opening (before, the rollup's change
    was dropped when it was opened first)."""
    from sparkpoint.runtime.executor.timers import TaskTimers
    from sparkpoint.runtime.executor.windows import Triggers, WindowedStore
    from sparkpoint.serde import JsonSerde, StringSerde
    from sparkpoint.storage.kv.factory import open_engine
    from sparkpoint.storage.kv.store import SerializedKeyValueStore
    from sparkpoint.storage.timers import TimeKind

    def store(name: str) -> SerializedKeyValueStore[Any, Any]:
        engine = open_engine(name, "in-memory", tmp_path / name)
        return SerializedKeyValueStore(name, engine, StringSerde(), JsonSerde())

    ssp = _Recorded(tmp_path / "ssp", WindowSpec.tumbling(10)).ssp
    config = load_config(None, {"job.name": "t"})
    timer_store, hours_store, minutes_store = store("timers"), store("hours"), store("minutes")

    def task_timers() -> TaskTimers:
        return TaskTimers(TaskName("Partition 0"), config, timer_store, frozenset({ssp}))

    def open_hours(timers: TaskTimers) -> WindowedStore:
        return WindowedStore(
            "hours", hours_store, timers, WindowSpec.tumbling(3_600_000), sum_of(),
            lambda w, c: None, TimeKind.EVENT, None, None,
        )  # fmt: skip

    timers = task_timers()
    hours = open_hours(timers) if rollup_first else None

    def roll_up(window: Any, _collector: Any) -> None:
        assert hours is not None
        hours.add(window.key, window.start, window.value)

    minutes = WindowedStore(
        "minutes", minutes_store, timers, WindowSpec.tumbling(60_000), count(), roll_up,
        TimeKind.EVENT, None, Triggers(early=True),
    )  # fmt: skip
    hours = hours or open_hours(timers)
    for at in (1_000, 2_000, 61_000):
        minutes.add("a", at, collector=_Nowhere())
    timers.seen(ssp, 61_000)

    class Task:
        def on_timer(self, *_: Any) -> None:
            raise AssertionError("no user timer")

    timers.end_of_batch(Task(), _Nowhere(), None)  # type: ignore[arg-type]
    # rolled up: minute 0 early (2) and on time (2), minute 1 early (1)
    assert [w.value for w in hours.windows("a")] == [5]
    minutes.add("a", 62_000, collector=_Nowhere())  # as the task's window() may
    timers.flush_owned()  # as the executor does before the task closes
    assert [w.value for w in hours.windows("a")] == [7]  # minute 1 early again (2)
    # what the next batch reads from the store: the same
    again = open_hours(task_timers())
    assert [w.value for w in again.windows("a")] == [7]


def test_early_updates_that_feed_their_own_store_are_stopped_naming_it(tmp_path: Path) -> None:
    """An ``emit`` that adds a store's early updates to that store changes it on every write:
    the batch stops with an error naming the store, rather than looping."""
    from sparkpoint.errors import TaskError
    from sparkpoint.runtime.executor.timers import MAX_FLUSH_PASSES, TaskTimers
    from sparkpoint.runtime.executor.windows import Triggers, WindowedStore
    from sparkpoint.serde import JsonSerde, StringSerde
    from sparkpoint.storage.kv.factory import open_engine
    from sparkpoint.storage.kv.store import SerializedKeyValueStore
    from sparkpoint.storage.timers import TimeKind

    def store(name: str) -> SerializedKeyValueStore[Any, Any]:
        engine = open_engine(name, "in-memory", tmp_path / name)
        return SerializedKeyValueStore(name, engine, StringSerde(), JsonSerde())

    ssp = _Recorded(tmp_path / "ssp", WindowSpec.tumbling(10)).ssp
    config = load_config(None, {"job.name": "t"})
    timers = TaskTimers(TaskName("Partition 0"), config, store("timers"), frozenset({ssp}))
    emitted: list[int] = []

    def again(window: Any, _collector: Any) -> None:
        emitted.append(window.value)
        echo.add(window.key, window.start, collector=_Nowhere())

    echo = WindowedStore(
        "echo", store("echo"), timers, WindowSpec.tumbling(60_000), count(), again,
        TimeKind.EVENT, None, Triggers(early=True),
    )  # fmt: skip
    echo.add("a", 1_000, collector=_Nowhere())
    with pytest.raises(TaskError, match=r"window stores echo still had changes .*\(a cycle\)"):
        timers.flush_owned()
    assert emitted == list(range(1, MAX_FLUSH_PASSES + 1))  # each pass's early update, once


class _Rollup(StreamTask):
    """Views counted per minute, each closed minute added to its hour (docs/windows.md: a
    rollup, minutes into hours); the hours store is opened first (the order is the task's)."""

    def init(self, context: Any) -> None:
        self.hours = context.windows.tumbling(
            "hours", size_ms=3_600_000, aggregate=sum_of(), emit=self.hour, late_stream="log.late"
        )
        self.minutes = context.windows.tumbling(
            "minutes", size_ms=60_000, aggregate=count(), emit=self.minute, late_stream="log.late"
        )

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.minutes.add(envelope.key, envelope.event_time, late_to=collector)

    def minute(self, window: Any, collector: Any) -> None:
        self.hours.add(window.key, window.start, window.value, late_to=collector)

    def hour(self, window: Any, collector: Any) -> None:
        record = {"start": window.start, "n": window.value}
        collector.send(OutgoingMessageEnvelope(SystemStream("log", "hours"), window.key, record))


@pytest.mark.parametrize(
    ("batches", "hours"),
    [
        # the minute [59:00, 60:00) closes with its hour, in a later batch
        ([[10_000, 3_550_000], [7_300_000]], [(0, 2)]),
        # every minute and the hour open and close in one batch (held, never written)
        ([[10_000, 70_000, 3_550_000, 7_300_000]], [(0, 3)]),
        # an hour made by its last minute alone, as the timers fire: out in the same batch
        ([[3_570_000], [7_300_000]], [(0, 1)]),
        # a batch spanning an hour's end: each of its minutes closes in it
        ([[3_500_000], [3_530_000, 3_590_000, 3_610_000, 7_300_000]], [(0, 3), (3_600_000, 1)]),
    ],
    ids=["last-minute-later", "one-batch", "new-hour", "spanning"],
)
def test_a_rollup_of_minutes_into_hours_counts_every_minute_once(
    tmp_path: Path, batches: list[list[int]], hours: list[tuple[int, int]]
) -> None:
    """A minute's window closes with its hour's (their ends meet): the minute's emit added
    to the hour after the watermark had passed the hour's end, so the add was refused as late
    though the hour had not gone out, and every hour lost its last minute (a reviewer found
    it). While the timers go out, a window is closed once the time of the timer going out
    passes it, and a minute goes out before the hour that ends with it."""
    config = {k: v for k, v in BAD.items() if not k.startswith("stores.w.")}
    config["job.name"] = "rollup"
    for store in ("hours", "minutes"):
        config.update({f"stores.{store}.factory": "rocksdb", f"stores.{store}.key.serde": "string"})
    with JobTestDriver(config, tmp_path, task=_Rollup) as kit:
        for batch in batches:
            kit.send("in", [Message({"t": at}, key="a", timestamp=at) for at in batch])
            kit.run()
        got = [(m.value["start"], m.value["n"]) for m in kit.output("hours")]
        assert got == hours
        assert kit.output("late") == []
