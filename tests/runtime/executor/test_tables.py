"""Tables (``stores.<s>.side.inputs``) and the stream-table join, in the task API: every view
is enriched with its user's profile as the table stood when the view's batch ran, on filelog
and Kafka; a bootstrapping table is complete before the first view; a crash at every failpoint
changes no view's enrichment; a table's stream that is not compacted, or partitioned unlike the
inputs, is refused naming the fix."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import table_join

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.failpoints import POINTS, InjectedCrash
from sparkpoint.model import SystemStream
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.state import committed_raw_entries
from sparkpoint.tools.streams import Message, read_json_lines, send_messages
from tests.helpers import run_job as run

USERS = [f"user-{i:02d}" for i in range(20)]
Profiles = dict[str, str | None]


def job(
    tmp_path: Path,
    system: dict[str, str] | None = None,
    *,
    compacted: bool = True,
    table_partitions: int = 2,
    **overrides: str,
) -> Config:
    values = {
        **table_join.config(),
        **(system or {"systems.log.factory": "filelog"}),
        "job.logged.store.base.dir": str(tmp_path / "state"),
        "task.batch.max.messages": "40",
        **overrides,
    }
    if values["systems.log.factory"] == "filelog":
        values["systems.log.path"] = str(tmp_path / "log")
    config = load_config(None, values)
    admin = Systems(config).admin("log")
    admin.create_stream(StreamSpec("pageviews", 2))
    admin.create_stream(StreamSpec("profiles", table_partitions, compacted=compacted))
    return config


def send(config: Config, stream: str, messages: list[Message]) -> None:
    systems = Systems(config)
    try:
        send_messages(config, systems, SystemStream("log", stream), messages)
    finally:
        systems.close()


def set_profiles(config: Config, table: Profiles, seed: int, n: int) -> None:
    """``n`` profile changes (a country, or a delete), applied to ``table`` as well."""
    rng = random.Random(seed)
    changes = []
    for _ in range(n):
        user = rng.choice(USERS)
        country = None if rng.random() < 0.15 else rng.choice(["fr", "de", "jp", "br", "ca"])
        table[user] = country
        changes.append(Message(None if country is None else {"country": country}, key=user))
    send(config, "profiles", changes)


def send_views(config: Config, seed: int, n: int, start: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    sent = [(rng.choice(USERS), start + i) for i in range(n)]
    send(config, "pageviews", [Message({"user": u, "ts": t}, key=u) for u, t in sent])
    return sent


def enriched(config: Config) -> Counter[tuple[str, int, str | None]]:
    systems = Systems(config)
    try:
        records = read_json_lines(config, systems, SystemStream("log", "enriched-views"))
        return Counter(
            (r["value"]["user"], r["value"]["ts"], r["value"]["country"]) for r in records
        )
    finally:
        systems.close()


def expected(views: list[tuple[str, int]], table: Profiles) -> set[tuple[str, int, str | None]]:
    return {(u, t, table.get(u)) for u, t in views}


def two_rounds(config: Config, runner: Any = run) -> None:
    """A table and views; then the table changes and more views come: each round's views see
    the table as it stood at their round (the table is read before the views, batch by batch)."""
    table: Profiles = {}
    set_profiles(config, table, seed=1, n=150)  # more than a batch reads: a bootstrap
    views = send_views(config, seed=2, n=300, start=0)
    runner(config)
    first = expected(views, table)
    got = enriched(config)
    assert set(got) == first
    set_profiles(config, table, seed=3, n=60)
    more = send_views(config, seed=4, n=200, start=1000)
    runner(config)
    assert set(enriched(config)) == first | expected(more, table)
    stored = {k.decode(): v for _, k, v in committed_raw_entries(config, "profiles")}
    assert set(stored) == {u for u, c in table.items() if c is not None}  # deletes are gone


def run_job(config: Config) -> None:
    run(config, until_caught_up=True)


def test_views_see_the_table_as_it_stood_at_their_batch(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = job(tmp_path, log_system)
    two_rounds(config, run_job)
    assert max(enriched(config).values()) == 1


def test_without_bootstrap_views_do_not_wait_for_the_table(tmp_path: Path) -> None:
    config = job(tmp_path, **{"stores.profiles.side.inputs.bootstrap": "false"})
    table: Profiles = {}
    set_profiles(config, table, seed=1, n=150)
    views = send_views(config, seed=2, n=30, start=0)
    run_job(config)
    got = enriched(config)
    assert {(u, t) for u, t, _ in got} == set(views)
    assert set(got) != expected(views, table)  # the first batch read 40 of 150 changes


@pytest.mark.parametrize("point", [p for p in POINTS if p != "during-restore"])
def test_a_crash_at_every_step_changes_no_enrichment(tmp_path: Path, point: str) -> None:
    flag = tmp_path / "crash.flag"
    config = job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    table: Profiles = {}
    set_profiles(config, table, seed=5, n=100)
    views = send_views(config, seed=6, n=100, start=0)
    run_job(config)
    first = expected(views, table)
    set_profiles(config, table, seed=7, n=80)
    more = send_views(config, seed=8, n=150, start=1000)
    flag.write_text("1")
    with pytest.raises((InjectedCrash, SparkpointError)):
        run_job(config)
    assert not flag.exists(), f"the crash point {point} was never reached"
    run_job(config)
    assert set(enriched(config)) == first | expected(more, table)


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        ({"table_partitions": 3}, r"log.profiles has 3 partitions but the job has 2 tasks"),
        (
            {"stores.profiles.changelog": ""},
            r"stores.profiles: a table needs a changelog or a blob store backup",
        ),
        (
            {"task.inputs": "log.pageviews,log.profiles"},
            r"log.profiles is in task.inputs too",
        ),
    ],
)
def test_a_bad_table_is_refused_naming_the_fix(
    tmp_path: Path, setup: dict[str, Any], error: str
) -> None:
    options = {k: v for k, v in setup.items() if k in ("compacted", "table_partitions")}
    overrides = {k: v for k, v in setup.items() if k not in options}
    with pytest.raises(ConfigError, match=error):
        config = job(tmp_path, **options, **overrides)
        run_job(config)


def test_a_table_stream_that_is_not_compacted_is_refused(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    config = job(tmp_path, log_system, compacted=False)
    with pytest.raises(ConfigError, match=r"side.inputs: log.profiles is not compacted: a table"):
        run_job(config)


def test_a_table_record_without_a_key_names_its_offset(tmp_path: Path) -> None:
    config = job(tmp_path)
    send(config, "profiles", [Message({"country": "fr"}, key=None)])
    with pytest.raises(
        SparkpointError, match=r"table record at log.profiles.0 offset 0 has no key"
    ):
        run_job(config)
