"""The example job writing tables (examples/tables) under exactly-once, on the inline runner:
crashed at every failpoint of its commit and of the tables' publish and run again, each view is
in the Delta and the Iceberg table once and each user's count in PostgreSQL is exact, read
back by each table's own client (issue 67). The same crash at-least-once repeats rows: the
check can fail."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sparkpoint.config import Config, load_config, read_job_file
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
    return config


def readers(config: Config) -> tuple[TableKind, TableKind, TableKind]:
    data = config.data_dir
    lake = TableKind("delta", {}, data)
    ice = TableKind("iceberg", {}, data, namespace=config.job_name)
    pg = TableKind("postgres", {}, data, config["systems.pg.postgres.dsn"])
    return lake, ice, pg


def views_per_user(rows: list[dict[str, object]]) -> tuple[Counter[str], int]:
    """(views per user, how many (user, n) pairs are there more than once)."""
    pairs = Counter((str(r["user"]), r["n"]) for r in rows)
    return Counter(str(r["user"]) for r in rows), sum(1 for c in pairs.values() if c > 1)


def assert_tables_exact(config: Config, expected: Counter[str]) -> None:
    lake, ice, pg = readers(config)
    for reader, system in ((lake, "lake"), (ice, "ice")):
        rows = reader.read_at("views", system)
        per_user, repeated = views_per_user(rows)
        assert repeated == 0 and per_user == expected, system
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
