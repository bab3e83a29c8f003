"""The windowed stream-stream join in the task API (``context.windows.join``), proven against a
plain Python reference: clicks and views of 15 users, sent in rounds, on filelog and Kafka and
across a crash at every failpoint. The pairs that went out are exactly every click and view of
one user at most ``WITHIN_MS`` apart, and the buffers keep only records the watermark has not
passed by ``WITHIN_MS`` (state stays bounded)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import stream_join
from stream_join import WITHIN_MS

from sparkpoint.config import Config, load_config
from sparkpoint.errors import SparkpointError
from sparkpoint.failpoints import POINTS, InjectedCrash
from sparkpoint.model import SystemStream
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.state import committed_raw_entries
from sparkpoint.tools.streams import Message, read_json_lines, send_messages
from tests.helpers import run_job as run

Events = list[tuple[str, str, int]]  # (stream, user, event time)
LATENESS = 1000


def job(tmp_path: Path, system: dict[str, str] | None = None, **overrides: str) -> Config:
    values = {
        **stream_join.config(),
        **(system or {"systems.log.factory": "filelog"}),
        "job.logged.store.base.dir": str(tmp_path / "state"),
        "task.batch.max.messages": "60",
        **overrides,
    }
    if values["systems.log.factory"] == "filelog":
        values["systems.log.path"] = str(tmp_path / "log")
    config = load_config(None, {k: v for k, v in values.items() if v})
    admin = Systems(config).admin("log")
    for stream in ("clicks", "views"):
        admin.create_stream(StreamSpec(stream, 2))
    return config


def events(seed: int, n: int, start: int) -> Events:
    """``n`` clicks and views in time order (each stream in order), 0-400 ms apart."""
    rng = random.Random(seed)
    at, out = start, []
    for _ in range(n):
        at += rng.randint(1, 400)
        out.append((rng.choice(["clicks", "views"]), f"user-{rng.randrange(15):02d}", at))
    return out


def send(config: Config, sent: Events) -> None:
    systems = Systems(config)
    try:
        for stream in ("clicks", "views"):
            messages = [
                Message({"user": u, "ts": t}, key=u, timestamp=t) for s, u, t in sent if s == stream
            ]
            send_messages(config, systems, SystemStream("log", stream), messages)
    finally:
        systems.close()


def reference(sent: Events) -> set[tuple[str, int, int]]:
    clicks = [(u, t) for s, u, t in sent if s == "clicks"]
    views = [(u, t) for s, u, t in sent if s == "views"]
    return {(u, c, v) for u, c in clicks for w, v in views if u == w and abs(c - v) <= WITHIN_MS}


def emitted(config: Config, stream: str = "clicked-views") -> Counter[tuple[str, int, int]]:
    systems = Systems(config)
    try:
        if stream not in systems.admin("log").list_streams():
            return Counter()
        values = [r["value"] for r in read_json_lines(config, systems, SystemStream("log", stream))]
        return Counter((v["user"], v["click_ts"], v["view_ts"]) for v in values)
    finally:
        systems.close()


def still_buffered(config: Config, sent: Events) -> int:
    """The (side, user, time) entries the buffers keep: those the task's watermark (the
    smaller of its two streams' largest event times, less the lateness) has not passed by
    ``WITHIN_MS``."""
    admin = Systems(config).admin("log")
    part = {u: admin.partition_for_key(u.encode(), 2) for _, u, _ in sent}
    top: dict[tuple[int, str], int] = {}
    for s, u, t in sent:
        top[(part[u], s)] = max(top.get((part[u], s), -1), t)
    watermark = {p: min(top[(p, "clicks")], top[(p, "views")]) - LATENESS for p in (0, 1)}
    return len({(s, u, t) for s, u, t in sent if t + WITHIN_MS + 1 > watermark[part[u]]})


def check(config: Config, sent: Events, *, once: bool) -> None:
    pairs = reference(sent)
    got = emitted(config)
    assert pairs and set(got) == pairs
    if once:
        assert max(got.values()) == 1
    stored = sum(
        1 for b in ("click-buffer", "view-buffer") for _ in committed_raw_entries(config, b)
    )
    assert stored == still_buffered(config, sent) < len(sent) // 4


def test_pairs_match_the_reference_and_buffers_stay_bounded(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = job(tmp_path, log_system)
    sent: Events = []
    for round_, n in enumerate((400, 500)):
        batch = events(seed=30 + round_, n=n, start=sent[-1][2] if sent else 0)
        send(config, batch)
        sent += batch
        run(config, until_caught_up=True)
        check(config, sent, once=True)
    assert not emitted(config, "late-clicks-views")


@pytest.mark.parametrize("point", [p for p in POINTS if p != "during-restore"])
def test_a_crash_at_every_step_leaves_the_pairs_exact(tmp_path: Path, point: str) -> None:
    flag = tmp_path / "crash.flag"
    config = job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    sent = events(seed=40, n=300, start=0)
    send(config, sent)
    run(config, until_caught_up=True)
    more = events(seed=41, n=400, start=sent[-1][2])
    send(config, more)
    sent += more
    flag.write_text("1")
    with pytest.raises((InjectedCrash, SparkpointError)):
        run(config, until_caught_up=True)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run(config, until_caught_up=True)
    check(config, sent, once=False)  # a pair may go out again (at-least-once)


def test_a_late_record_is_not_joined_and_goes_to_the_late_stream(tmp_path: Path) -> None:
    config = job(tmp_path)
    sent = events(seed=50, n=300, start=0)
    send(config, sent)
    run(config, until_caught_up=True)
    user = sent[0][1]
    send(config, [("views", user, sent[0][2])])  # long behind the watermark
    run(config, until_caught_up=True)
    assert set(emitted(config)) == reference(sent)
    systems = Systems(config)
    late = [
        r["value"]
        for r in read_json_lines(config, systems, SystemStream("log", "late-clicks-views"))
    ]
    systems.close()
    assert late == [
        {
            "key": user,
            "time": sent[0][2],
            "value": {"user": user, "ts": sent[0][2]},
            "side": "right",
        }
    ]


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (
            {"stores.view-buffer.factory": "", "stores.view-buffer.changelog": ""},
            r"join buffer 'view-buffer': the job has no such store",
        ),
        ({"stores.view-buffer.rocksdb.ttl.ms": "100"}, r"join buffer 'view-buffer' has a TTL"),
        ({"task.timers.store": ""}, r"set task.timers.store"),
    ],
)
def test_bad_join_use_names_the_store_and_the_fix(
    tmp_path: Path, overrides: dict[str, str], error: str
) -> None:
    config = job(tmp_path, **overrides)
    send(config, events(seed=60, n=10, start=0))
    with pytest.raises(SparkpointError, match=error):
        run(config, until_caught_up=True)
