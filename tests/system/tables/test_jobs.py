"""The example job writing tables (examples/tables) under exactly-once, on the inline runner:
crashed at every failpoint of its commit and of the tables' publish and run again, each view is
in the Delta and the Iceberg table once and each user's count in PostgreSQL is exact, read
back by each table's own client (issue 67). The same crash at-least-once repeats rows: the
check can fail."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from catalogue import PAGES, write_catalogue
from generate import events

from sparkpoint.config import Config, load_config, read_job_file
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.testing.services import PostgresServer
from tests.conftest import TABLES_DIR
from tests.helpers import crash_runs, generate, run_job
from tests.system.tables.conftest import TableKind

pytestmark = pytest.mark.slow


def tables_job(tmp_path: Path, postgres: PostgresServer, **overrides: str) -> Config:
    values = read_job_file(TABLES_DIR / "job.yaml")
    values.update(
        {
            "job.data.dir": str(tmp_path / "data"),
            "systems.pg.postgres.dsn": postgres.new_database(f"j_{tmp_path.name[-20:]}".lower()),
            "task.batch.max.messages": "300",
            "task.commit.ms": "0",
            **overrides,
        }
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    write_catalogue(catalogue(config))
    return config


def catalogued(n: int, seed: int) -> int:  # (users=8)
    """How many of ``generate``'s views (``n``, ``seed``) are of a page the catalogue has."""
    pages = {page for page, _, _ in PAGES}
    return sum(1 for e in events(n, seed, 8) if e["page"] in pages)


def catalogue(config: Config) -> Path:
    return config.data_dir / "tables" / "lake" / "pages"


def titled(tag: str) -> list[tuple[str, str, str]]:
    """The catalogue with every title tagged ``tag``: a version the rows can be told by."""
    return [(page, f"{title} {tag}", section) for page, title, section in PAGES]


def readers(config: Config) -> tuple[TableKind, TableKind, TableKind]:
    data = config.data_dir
    lake = TableKind("delta", {}, data)
    ice = TableKind("iceberg", {}, data, namespace=config.job_name)
    pg = TableKind("postgres", {}, data, config["systems.pg.postgres.dsn"])
    return lake, ice, pg


def views_per_user_only(rows: list[dict[str, object]]) -> Counter[str]:
    return Counter(str(r["user"]) for r in rows)


def views_per_user(rows: list[dict[str, object]]) -> tuple[Counter[str], int]:
    """(views per user, how many (user, n) pairs are there more than once)."""
    pairs = Counter((str(r["user"]), r["n"]) for r in rows)
    return Counter(str(r["user"]) for r in rows), sum(1 for c in pairs.values() if c > 1)


def assert_tables_exact(config: Config, expected: Counter[str], counted: bool = True) -> None:
    """Each view once in Delta and Iceberg, with its page's title; each count exact in
    PostgreSQL. ``counted``: the view rows carry the user's running count ``n`` (the task's
    do), so each (user, n) must be there once; else the views per user must be exact."""
    lake, ice, pg = readers(config)
    titles = {page: title for page, title, _ in PAGES}
    for reader, system in ((lake, "lake"), (ice, "ice")):
        rows = reader.read_at("views", system)
        per_user, repeated = views_per_user(rows) if counted else (views_per_user_only(rows), 0)
        assert repeated == 0 and per_user == expected, system
        # the global table's title, or none for a page it lacks (a left join)
        assert all(r["title"] == titles.get(str(r["page"])) for r in rows)
    counts = {str(r["user"]): r["views"] for r in pg.read("user_counts")}
    assert counts == dict(expected)


@pytest.mark.parametrize(
    "point",
    ["after-checkpoint-write", "during-cleanup", "publish-after-intent", "publish-after-append"],
)
def test_every_table_holds_each_row_once_whatever_crashes(
    tmp_path: Path, postgres: PostgresServer, point: str
) -> None:
    flag = tmp_path / "crash.flag"
    config = tables_job(
        tmp_path, postgres, **{"testing.crash.at": point, "testing.crash.flag": str(flag)}
    )
    expected = crash_runs(
        lambda: run_job(config, until_caught_up=True),
        lambda i: generate(config, tmp_path / f"r{i}.yaml", 300 if i else 800, 80 + i, 16),
        flag,
    )
    assert_tables_exact(config, expected)
    for system in ("lake", "ice", "pg"):  # published, or discarded at the restart
        staging = Systems(config).admin(system).output_staging()
        assert staging is not None and staging.staged("views") + staging.staged("user_counts") == []


def test_the_same_crash_at_least_once_repeats_rows(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    flag = tmp_path / "crash.flag"
    config = tables_job(
        tmp_path,
        postgres,
        **{
            "job.processing.guarantee": "at-least-once",
            "testing.crash.at": "after-snapshot",
            "testing.crash.flag": str(flag),
        },
    )
    expected = crash_runs(
        lambda: run_job(config, until_caught_up=True),
        lambda i: generate(config, tmp_path / f"r{i}.yaml", 300 if i else 800, 90 + i, 16),
        flag,
    )
    lake, _, pg = readers(config)
    per_user, repeated = views_per_user(lake.read_at("views", "lake"))
    assert repeated > 0 and per_user != expected  # the replayed batch's rows, twice
    # the upserted counts are right anyway: a replayed row replaces itself
    assert {str(r["user"]): r["views"] for r in pg.read("user_counts")} == dict(expected)


def test_a_replayed_batch_joins_the_global_table_version_it_first_saw(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """At-least-once, so that the first run's rows stay in the table beside the replay's: the
    catalogue changes (v1), the tasks move to it at a commit, read more views and crash before
    the next commit; the catalogue changes again (v2) and the job restarts: the views read again
    are joined with v1 as they were, and only later views see v2."""
    config = tables_job(
        tmp_path,
        postgres,
        **{"job.processing.guarantee": "at-least-once", "tables.pages.refresh.ms": "0"},
    )
    generate(config, tmp_path / "a.yaml", 400, seed=5, users=8)
    job = JobCoordinator(config, InlineRunner())
    job.start()
    job.run_batch(job.upcoming(), commit=True, wait=True)
    write_catalogue(catalogue(config), titled("v1"))
    assert job.global_tables.refresh(now=True)  # read, snapshotted: the tasks still see v0
    job.run_batch(job.upcoming(), commit=True, wait=True)  # every task commits: now v1
    assert not job.global_tables.refresh()
    generate(config, tmp_path / "b.yaml", 200, seed=6, users=8)
    job.run_batch(job.upcoming(), commit=False)  # joined with v1, written, not committed
    job.close()  # the crash: no checkpoint covers those views
    write_catalogue(catalogue(config), titled("v2"))
    run_job(config, until_caught_up=True)
    generate(config, tmp_path / "c.yaml", 100, seed=7, users=8)
    run_job(config, until_caught_up=True)
    lake, _, _ = readers(config)
    rows = lake.read_at("views", "lake")
    tags = Counter(str(r["title"]).rsplit(" ", 1)[-1] for r in rows)
    assert tags["v1"] == 2 * catalogued(200, 6)  # first run and replay, both with v1
    assert tags["v2"] == catalogued(100, 7)
    by_view: dict[tuple[str, object], set[str]] = {}
    for r in rows:
        by_view.setdefault((str(r["user"]), r["n"]), set()).add(str(r["title"]))
    assert all(len(titles) == 1 for titles in by_view.values())


def test_after_a_clean_stop_the_next_run_sees_the_new_version_at_once(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """The catalogue changes while the job is stopped: every view the next run reads is joined
    with the new version (a clean stop read nothing past its checkpoints); and a crash of that
    run before its first commit replays with the version it used, not a newer one."""
    config = tables_job(tmp_path, postgres, **{"tables.pages.refresh.ms": "0"})
    generate(config, tmp_path / "a.yaml", 300, seed=8, users=8)
    run_job(config, until_caught_up=True)
    write_catalogue(catalogue(config), titled("v1"))
    generate(config, tmp_path / "b.yaml", 300, seed=9, users=8)
    job = JobCoordinator(config, InlineRunner())
    job.start()
    assert job.global_tables.current == job.global_tables.latest  # at once
    job.run_batch(job.upcoming(), commit=False)  # read with v1, never committed
    job.close()  # the crash
    write_catalogue(catalogue(config), titled("v2"))
    run_job(config, until_caught_up=True)  # the replay: v1 still, as first read
    lake, _, _ = readers(config)
    tags = Counter(str(r["title"]).rsplit(" ", 1)[-1] for r in lake.read_at("views", "lake"))
    assert tags["v1"] == catalogued(300, 9) and tags["v2"] == 0
