"""The table systems' fixtures: each kind of table system with an independent reader of its
tables (the table library's own client, never sparkpoint's code); the PostgreSQL server is the
session's (``postgres`` in tests/conftest.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.testing.services import PostgresServer

KINDS = ("delta", "iceberg", "postgres")


@dataclass
class TableKind:
    """A table system named ``t`` of one kind: its config, and how to read its tables back."""

    kind: str
    config: dict[str, str]
    data_dir: Path
    dsn: str = ""
    namespace: str = "job"  # Iceberg's: the job's name

    def read(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` of system ``t``, by the kind's own client, sorted."""
        return self.read_at(table, "t")

    def read_at(self, table: str, system: str) -> list[dict[str, Any]]:
        """Every row of ``table`` of ``system`` (with its default places), sorted."""
        if self.kind == "delta":
            from deltalake import DeltaTable

            rows = DeltaTable(str(self.data_dir / "tables" / system / table)).to_pyarrow_table()
            out = rows.to_pylist()
        elif self.kind == "iceberg":
            out = self.iceberg_table(table, system).scan().to_arrow().to_pylist()
        else:
            import psycopg

            with psycopg.connect(self.dsn) as conn:
                cur = conn.execute(f'SELECT * FROM "{table}"')
                names = [d.name for d in cur.description or ()]
                out = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        return sorted(out, key=lambda r: tuple(str(v) for v in r.values()))

    def iceberg_table(self, table: str, system: str = "t") -> Any:
        from pyiceberg.catalog import load_catalog

        root = self.data_dir / "iceberg"
        catalog = load_catalog(
            system,  # the SQL catalog keeps the catalog's name: the system's
            type="sql",
            uri=f"sqlite:///{root / 'catalog.db'}",
            warehouse=(root / "warehouse").as_uri(),
        )
        return catalog.load_table((self.namespace, table))

    def commits(self, table: str) -> int:
        """How many commits (Delta versions, Iceberg snapshots) the table has: PostgreSQL
        keeps no history (-1)."""
        if self.kind == "delta":
            from deltalake import DeltaTable

            return len(DeltaTable(str(self.data_dir / "tables" / "t" / table)).history())
        if self.kind == "iceberg":
            return len(self.iceberg_table(table).snapshots())
        return -1


def table_kind(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> TableKind:
    data = tmp_path / "data"
    config = {"job.name": "job", "job.data.dir": str(data), "systems.t.factory": kind}
    dsn = ""
    if kind == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        dsn = server.new_database(f"t_{uuid.uuid4().hex[:12]}")
        config["systems.t.postgres.dsn"] = dsn
    return TableKind(kind, config, data, dsn)


@pytest.fixture(params=KINDS)
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> TableKind:
    """Each kind of table system, in turn (the contract every kind keeps)."""
    return table_kind(request.param, tmp_path, request)
