"""Global tables' sources (issue 67): a Delta and an Iceberg table at a version, a PostgreSQL
query, a compacted stream (each key's newest value, tombstones deleting) and a directory of
Parquet files; each version read once into a snapshot that a task looks rows up in; a bad
source named in one line."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.errors import CheckpointError, ConfigError, UserError
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.model import TaskName
from sparkpoint.runtime.driver.global_tables import MARKER, GlobalTableVersions
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.system.tables.global_tables import (
    GlobalTableSpec,
    materialize,
    open_global_table,
    snapshot_path,
    source_of,
)


def table_config(tmp_path: Path, **values: str) -> Config:
    return Config({"job.name": "job", "job.data.dir": str(tmp_path / "data"), **values})


def load(config: Config, name: str = "pages") -> tuple[str, Any]:
    """The source's version now (snapshotted) and the table a task gets at it."""
    spec = GlobalTableSpec.of(config, name)
    version = materialize(config, source_of(config, Systems(config), spec), name)
    return version, open_global_table(config, name, version)


def write_rows(config: Config, system: str, rows: list[dict[str, Any]]) -> None:
    producer = Systems(config).producer(system)
    producer.send_rows("pages", rows)
    producer.flush()


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_table_of_a_table_system_is_read_at_each_version(tmp_path: Path, kind: str) -> None:
    config = table_config(
        tmp_path,
        **{"systems.t.factory": kind, "tables.pages.source": "t.pages", "tables.pages.key": "page"},
    )
    write_rows(config, "t", [{"page": "/", "title": "Home"}])
    first, table = load(config)
    assert table.get("/") == {"page": "/", "title": "Home"} and table.get("/x") is None
    assert load(config)[0] == first  # no change: the same version, its snapshot kept
    write_rows(config, "t", [{"page": "/docs", "title": "Docs"}])
    second, table = load(config)
    assert second != first and len(table) == 2 and "/docs" in table
    assert len(open_global_table(config, "pages", first)) == 1  # the old one, as it was
    assert snapshot_path(config, "pages", first).exists()


def test_a_postgres_query_is_a_version_per_distinct_result(tmp_path: Path, postgres: Any) -> None:
    dsn = postgres.new_database("global_query")
    config = table_config(
        tmp_path,
        **{
            "systems.pg.factory": "postgres",
            "systems.pg.postgres.dsn": dsn,
            "tables.pages.source": "pg",
            "tables.pages.query": "SELECT page, title FROM pages WHERE title <> 'hidden'",
            "tables.pages.key": "page",
        },
    )
    write_rows(config, "pg", [{"page": "/", "title": "Home"}, {"page": "/x", "title": "hidden"}])
    first, table = load(config)
    assert len(table) == 1 and table.get("/") == {"page": "/", "title": "Home"}
    assert load(config)[0] == first
    write_rows(config, "pg", [{"page": "/y", "title": "hidden"}])  # not in the query's rows
    assert load(config)[0] == first
    write_rows(config, "pg", [{"page": "/docs", "title": "Docs"}])
    assert load(config)[0] != first


def test_a_compacted_stream_is_each_keys_newest_value(tmp_path: Path) -> None:
    config = table_config(
        tmp_path,
        **{
            "systems.log.factory": "filelog",
            "systems.log.path": str(tmp_path / "log"),
            "tables.pages.source": "log.pages",
            "tables.pages.key": "page",
        },
    )
    systems = Systems(config)
    systems.admin("log").create_stream(StreamSpec("pages", 2, compacted=True))
    producer = systems.producer("log")

    def put(partition: int, key: str, value: dict[str, str] | None) -> None:
        body = None if value is None else json.dumps(value).encode()
        producer.send("pages", partition, Record("", key.encode(), body, 0))

    put(0, "/", {"page": "/", "title": "Home"})
    put(1, "/docs", {"page": "/docs", "title": "Docs"})
    put(0, "/", {"page": "/", "title": "Welcome"})
    put(1, "/old", {"page": "/old", "title": "Old"})
    put(1, "/old", None)  # a tombstone
    producer.flush()
    first, table = load(config)
    assert table.get("/") == {"page": "/", "title": "Welcome"}
    assert len(table) == 2 and "/old" not in table
    put(1, "/docs", {"page": "/docs", "title": "Documentation"})
    producer.flush()
    second, table = load(config)
    assert second != first and table.get("/docs") == {"page": "/docs", "title": "Documentation"}


def test_a_parquet_directory_is_a_version_per_set_of_files(tmp_path: Path) -> None:
    source = tmp_path / "pages"
    source.mkdir()
    pq.write_table(pa.table({"page": ["/"], "title": ["Home"]}), source / "a.parquet")
    config = table_config(
        tmp_path, **{"tables.pages.source": f"parquet:{source}", "tables.pages.key": "page"}
    )
    first, table = load(config)
    assert table.get("/") == {"page": "/", "title": "Home"}
    pq.write_table(pa.table({"page": ["/docs"], "title": ["Docs"]}), source / "b.parquet")
    second, table = load(config)
    assert second != first and len(table) == 2


def test_a_bad_source_or_lookup_is_named(tmp_path: Path) -> None:
    config = table_config(tmp_path, **{"tables.pages.source": "nowhere.pages"})
    with pytest.raises(ConfigError, match=r"tables\.pages\.source='nowhere\.pages': expected"):
        load(config)
    config = table_config(tmp_path, **{"tables.pages.source": f"parquet:{tmp_path / 'none'}"})
    with pytest.raises(UserError, match="no such directory"):
        load(config)
    source = tmp_path / "p"
    source.mkdir()
    pq.write_table(pa.table({"page": ["/"]}), source / "a.parquet")
    config = table_config(tmp_path, **{"tables.pages.source": f"parquet:{source}"})
    _, table = load(config)
    with pytest.raises(UserError, match=r"set tables\.pages\.key to look rows up by it"):
        table.get("/")
    assert table.to_arrow().num_rows == 1


class _Store(MetadataStore):
    """The coordinator stream's interface over a dict."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, str]] = {}

    def get(self, namespace: str, key: str) -> str | None:
        return self.data.get(namespace, {}).get(key)

    def put(self, namespace: str, key: str, value: str) -> None:
        self.data.setdefault(namespace, {})[key] = value

    def put_all(self, namespace: str, entries: Mapping[str, str | None]) -> None:
        for key, value in entries.items():
            if value is None:
                self.delete(namespace, key)
            else:
                self.put(namespace, key, value)

    def delete(self, namespace: str, key: str) -> None:
        self.data.get(namespace, {}).pop(key, None)

    def all(self, namespace: str) -> dict[str, str]:
        return dict(self.data.get(namespace, {}))

    def namespaces(self) -> list[str]:
        return sorted(self.data)

    def flush(self) -> None:
        pass

    def refresh(self) -> None:
        pass


def checkpoint(versions: dict[str, str] | None) -> CheckpointV2:
    markers = {} if versions is None else {MARKER: versions}
    return CheckpointV2(CheckpointId.create(), {}, markers)


def test_a_start_that_moved_at_once_is_remembered_for_the_tasks_that_have_not_committed(
    tmp_path: Path,
) -> None:
    """Found in review: after a clean stop the next run moves to the newest version at once;
    if one task then commits and another does not before a crash, their checkpoints' markers
    differ, and the restart must still know both tasks read with the newest version."""
    source = tmp_path / "pages"
    source.mkdir()
    pq.write_table(pa.table({"page": ["/"], "title": ["Home"]}), source / "a.parquet")
    config = table_config(tmp_path, **{"tables.pages.source": f"parquet:{source}"})
    store = _Store()
    first = GlobalTableVersions(config, Systems(config))
    a, b = TaskName("Partition 0"), TaskName("Partition 1")
    first.start({a: None, b: None}, store)
    old = first.current["pages"]
    stopped = {a: checkpoint({"pages": old}), b: checkpoint({"pages": old})}
    first.stopped_cleanly(stopped, store)
    pq.write_table(pa.table({"page": ["/docs"], "title": ["Docs"]}), source / "b.parquet")
    second = GlobalTableVersions(config, Systems(config))
    second.start(stopped, store)  # a clean stop: the newest version at once
    new = second.current["pages"]
    assert new != old
    crashed = {a: checkpoint({"pages": new}), b: stopped[b]}  # only a committed, then a crash
    third = GlobalTableVersions(config, Systems(config))
    third.start(crashed, store)
    assert third.current["pages"] == new
    with pytest.raises(CheckpointError, match="the tasks' checkpoints record different versions"):
        GlobalTableVersions(config, Systems(config)).start(crashed, _Store())  # no record
