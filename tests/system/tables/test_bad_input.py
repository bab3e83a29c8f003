"""A table system's bad input and faults (issue 67), each one line naming the table, system or
key, and no batch counted as written that is not: an unreachable database, unknown
credentials, a catalog that cannot open, a commit conflict (retried, then an error), a table
read as input, an upsert without its key, a message that is not a row."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from sparkpoint.config import Config
from sparkpoint.errors import (
    ConfigError,
    MessageEncodeError,
    TableError,
    TableSchemaError,
    UserError,
)
from sparkpoint.model import SystemStream, TaskName
from sparkpoint.runtime.executor.output import OutputCollector
from sparkpoint.system.base import OutgoingMessageEnvelope, TableProducer
from sparkpoint.system.registry import Systems
from sparkpoint.system.tables.delta import DeltaTables
from sparkpoint.testing.services import PostgresServer
from sparkpoint.testing.spark_cluster import free_port
from tests.system.tables.conftest import TableKind, table_kind


def flush_one(config: dict[str, str], row: dict[str, object], table: str = "views") -> None:
    producer = Systems(config).producer("t")
    producer.send_rows(table, [row])
    producer.flush()


def at_once(writer: Callable[[int], None], n: int) -> list[BaseException]:
    """Run ``writer(0)`` .. ``writer(n - 1)`` in threads at once; what they raised."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            writer(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_an_unreachable_database_is_retried_then_named_in_one_line(tmp_path: Path) -> None:
    dsn = f"postgresql://sparkpoint@127.0.0.1:{free_port()}/db"
    config = {
        "job.data.dir": str(tmp_path),
        "systems.t.factory": "postgres",
        "systems.t.postgres.dsn": dsn,
        "systems.t.write.attempts": "2",
    }
    with pytest.raises(TableError) as failed:
        flush_one(config, {"a": 1})
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("table t.views: the PostgreSQL write failed after 2 tries: ")
    assert f"cannot connect to {dsn} (systems.t.postgres.dsn): connection failed" in message


def test_unknown_credentials_and_a_missing_dsn_are_one_line(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    config = {
        "job.data.dir": str(tmp_path),
        "systems.t.factory": "postgres",
        "systems.t.postgres.dsn": postgres.dsn("postgres").replace("sparkpoint@", "nobody@"),
        "systems.t.write.attempts": "1",
    }
    with pytest.raises(TableError, match='role "nobody" does not exist') as failed:
        flush_one(config, {"a": 1})
    assert "\n" not in str(failed.value)
    del config["systems.t.postgres.dsn"]
    with pytest.raises(ConfigError, match=r"missing required config key systems\.t\.postgres\.dsn"):
        Systems(config).producer("t")


def test_a_catalog_that_cannot_open_names_its_keys(tmp_path: Path) -> None:
    config = {
        "job.name": "job",
        "job.data.dir": str(tmp_path),
        "systems.t.factory": "iceberg",
        "systems.t.iceberg.catalog.type": "sql",
        "systems.t.iceberg.catalog.uri": "sqlite:////nonexistent/dir/catalog.db",
    }
    with pytest.raises(ConfigError) as failed:
        flush_one(config, {"a": 1})
    assert str(failed.value).startswith(
        "systems.t.iceberg.catalog.*: cannot open the Iceberg catalog (type=sql, "
        "uri=sqlite:////nonexistent/dir/catalog.db): OperationalError"
    )


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_concurrent_upserts_are_retried_until_each_lands(tmp_path: Path, kind: str) -> None:
    """Four writers upserting into one table at once: the table refuses the commits that
    conflict (Delta's conflict checker, Iceberg's optimistic concurrency, SQLite's lock), and
    each is tried again against the new version."""
    config = {
        "job.name": "job",
        "job.data.dir": str(tmp_path),
        "systems.t.factory": kind,
        "streams.counts.table.mode": "upsert",
        "streams.counts.table.key": "k",
        "systems.t.write.attempts": "20",
    }
    flush_one(config, {"k": "seed", "v": 0}, "counts")

    def writer(i: int) -> None:
        for j in range(3):
            flush_one(config, {"k": f"w{i}-{j}", "v": j}, "counts")

    assert at_once(writer, 4) == []
    rows = TableKind(kind, config, tmp_path).read("counts")
    assert len(rows) == 13 and {r["k"] for r in rows} >= {"seed", "w3-2"}


def test_a_conflict_that_persists_fails_the_batch_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake.exceptions import CommitFailedError

    def conflict(*args: object) -> int:
        raise CommitFailedError("Transaction failed: version already exists: 3")

    monkeypatch.setattr(DeltaTables, "write", conflict)
    config = {"job.data.dir": str(tmp_path), "systems.t.factory": "delta"}
    with pytest.raises(TableError) as failed:
        flush_one({**config, "systems.t.write.attempts": "2"}, {"a": 1})
    assert str(failed.value) == (
        "table t.views: the Delta write failed after 2 tries: CommitFailedError: Transaction "
        "failed: version already exists: 3"
    )


@pytest.mark.parametrize("kind", ["delta", "postgres"])
def test_a_table_is_no_input_and_an_upsert_needs_its_key(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    tables: TableKind = table_kind(kind, tmp_path, request)
    with pytest.raises(UserError, match="system 't' is a table system: tables are outputs"):
        Systems(tables.config).consumer("t")
    config = {**tables.config, "streams.counts.table.mode": "upsert"}
    with pytest.raises(
        ConfigError, match=r"streams\.counts\.table\.key: table t\.counts is upsert"
    ):
        flush_one(config, {"a": 1}, "counts")


def test_a_message_to_a_table_is_a_row(tmp_path: Path) -> None:
    config = Config(
        {"job.name": "job", "job.data.dir": str(tmp_path), "systems.t.factory": "delta"}
    )
    collector = OutputCollector(config, Systems(config), TaskName("Partition 0"))
    out = SystemStream("t", "views")
    with pytest.raises(MessageEncodeError, match="a message to table t.views is a row, a dict"):
        collector.send(OutgoingMessageEnvelope(out, "k", "not a row"))
    with pytest.raises(MessageEncodeError, match="value column sent is int64, not a struct"):
        collector.send_arrow(out, None, pa.array([1, 2]))
    collector.send(OutgoingMessageEnvelope(out, "k", {"a": 1}))
    collector.send_arrow(out, None, pa.array([{"a": 2}]))
    collector.close()
    assert collector.sent == 2
    producer = Systems(config).producer("t")  # a producer used straight checks the same
    assert isinstance(producer, TableProducer)
    with pytest.raises(UserError, match="a message to table views is a row, a dict"):
        producer.send_rows("views", [{"a": 1}, ["a", 1]])  # type: ignore[list-item]


def test_a_column_postgres_cannot_take_is_named(tmp_path: Path, postgres: PostgresServer) -> None:
    config = {
        "job.data.dir": str(tmp_path),
        "systems.t.factory": "postgres",
        "systems.t.postgres.dsn": postgres.new_database("binary_column"),
    }
    with pytest.raises(TableSchemaError, match="column 'blob' is binary, which this PostgreSQL"):
        flush_one(config, {"a": 1, "blob": b"\x00"})


def test_a_postgres_table_made_elsewhere_takes_rows_that_fit_its_columns(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """Found in review: Python's ints are 64-bit; a table made with ``integer`` columns takes
    them when they fit, and a value that does not fit is named."""
    import psycopg

    dsn = postgres.new_database("made_elsewhere")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE views (id integer, name text)")
    config = {"job.data.dir": str(tmp_path), "systems.t.factory": "postgres"}
    config["systems.t.postgres.dsn"] = dsn
    flush_one(config, {"id": 5, "name": "x"})
    with pytest.raises(
        TableSchemaError,
        match="'id' is int32 in the table but int64 in the batch, and a value does not fit",
    ):
        flush_one(config, {"id": 2**40, "name": "y"})
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT id, name FROM views").fetchall() == [(5, "x")]


def test_first_writes_racing_to_create_a_postgres_table_all_land(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """Found in review: two first writes creating one table at once collide in PostgreSQL's
    catalog; the loser tries again and finds the table."""
    config = {
        "job.data.dir": str(tmp_path),
        "systems.t.factory": "postgres",
        "systems.t.postgres.dsn": postgres.new_database("racing"),
    }
    assert at_once(lambda i: flush_one(config, {"k": i}), 8) == []
    assert (
        len(TableKind("postgres", config, tmp_path, config["systems.t.postgres.dsn"]).read("views"))
        == 8
    )
