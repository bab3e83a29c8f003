"""Apache Iceberg tables through ``pyiceberg``: ``systems.<s>.factory: iceberg``.

``systems.<s>.iceberg.catalog.<p>`` are the pyiceberg catalog's properties (default: a SQL
catalog on SQLite, ``uri sqlite:///<job.data.dir>/iceberg/catalog.db`` and ``warehouse
<job.data.dir>/iceberg/warehouse``); each stream is the table ``<namespace>.<stream>``, the
namespace ``systems.<s>.iceberg.namespace`` (default: the job's name). A write is one snapshot
(an append, or pyiceberg's upsert on the key columns). Exactly-once: the snapshot's transaction
also sets the table property ``sparkpoint.commit.<owner>`` to the commit key, and the snapshot's
summary carries ``sparkpoint.owner`` and ``sparkpoint.commit``; a key not above the recorded one
is not written. A commit another writer got in first (Iceberg's optimistic concurrency) is
retried against the table's new metadata.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkpoint.config import ConfigKey
from sparkpoint.errors import ConfigError, UserError
from sparkpoint.system.tables.base import Commit, TableSpec, TableWriter
from sparkpoint.system.tables.system import TableSystemFactory, data_dir

if TYPE_CHECKING:
    import pyarrow as pa

#: the table property holding an owner's last commit key
PROGRESS = "sparkpoint.commit."


class IcebergTables(TableWriter):
    """The Iceberg tables of one catalog namespace."""

    kind = "Iceberg"

    def __init__(self, system: str, properties: Mapping[str, str], namespace: str) -> None:
        self.system = system
        self.properties = dict(properties)
        self.namespace = namespace
        self._catalog: Any = None
        self._open_tables: dict[str, Any] = {}

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            try:
                self._catalog = self._load()
            except Exception as exc:
                raise ConfigError(
                    f"systems.{self.system}.iceberg.catalog.*: cannot open the Iceberg catalog "
                    f"({', '.join(f'{k}={v}' for k, v in sorted(self.properties.items()))}): "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                ) from exc
        return self._catalog

    def _load(self, attempts: int = 6) -> Any:
        """The catalog, its namespace created. Workers that open a new SQL catalog at once
        race to create its tables: the loser tries again."""
        from pyiceberg.catalog import load_catalog

        for attempt in range(1, attempts + 1):
            try:
                catalog = load_catalog(self.system, **self.properties)
                catalog.create_namespace_if_not_exists(self.namespace)
                return catalog
            except Exception as exc:
                text = str(exc)
                racing = any(
                    sign in text
                    for sign in ("already exists", "database is locked", "UNIQUE constraint")
                )
                if attempt == attempts or not racing:
                    raise
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    def _ident(self, table: str) -> tuple[str, str]:
        return (self.namespace, table)

    def _open(self, table: str) -> Any:
        """The table as the last :meth:`refresh` loaded it (``None``: there is none)."""
        if table not in self._open_tables:
            self.refresh(table)
        return self._open_tables[table]

    def refresh(self, table: str) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            self._open_tables[table] = self.catalog.load_table(self._ident(table))
        except NoSuchTableError:
            self._open_tables[table] = None

    def tables(self) -> list[str]:
        return sorted(name for _, name in self.catalog.list_tables(self.namespace))

    def schema(self, table: str) -> pa.Schema | None:
        t = self._open(table)
        return None if t is None else t.schema().as_arrow()

    def published(self, table: str, commit: Commit) -> bool:
        t = self._open(table)
        value = None if t is None else t.properties.get(PROGRESS + commit.owner)
        return value is not None and int(value) >= commit.key

    def owners(self, table: str) -> list[str]:
        t = self._open(table)
        props = {} if t is None else t.properties
        return sorted(k[len(PROGRESS) :] for k in props if k.startswith(PROGRESS))

    def _create(self, spec: TableSpec, data: pa.Table) -> Any:
        from pyiceberg.exceptions import TableAlreadyExistsError

        try:
            table = self.catalog.create_table(self._ident(spec.name), schema=data.schema)
        except TableAlreadyExistsError:  # another task created it first
            self.refresh(spec.name)
            return self._open_tables[spec.name]
        if spec.partition_by:
            with table.update_spec() as update:
                for column in spec.partition_by:
                    update.add_identity(column)
        return table

    def write(
        self, spec: TableSpec, data: pa.Table, new_columns: Sequence[str], commit: Commit | None
    ) -> int:
        table = self._open(spec.name) or self._create(spec, data)
        summary = {}
        if commit is not None:
            summary = {"sparkpoint.owner": commit.owner, "sparkpoint.commit": str(commit.key)}
        with table.transaction() as tx:
            if new_columns:
                with tx.update_schema() as update:
                    update.union_by_name(data.schema)
            if spec.mode == "upsert":
                tx.upsert(data, join_cols=list(spec.keys), snapshot_properties=summary)
            else:
                tx.append(data, snapshot_properties=summary)
            if commit is not None:
                tx.set_properties({PROGRESS + commit.owner: str(commit.key)})
        self._open_tables[spec.name] = table  # its metadata is the commit's (pyiceberg's)
        return len(data)

    def retriable(self, exc: BaseException) -> bool:
        from pyiceberg.exceptions import CommitFailedException

        if isinstance(exc, CommitFailedException):
            return True
        # the SQL catalog on SQLite: another writer holds the database for a moment
        return "database is locked" in str(exc) or super().retriable(exc)

    versioned = True

    def _existing(self, table: str) -> Any:
        t = self._open(table)
        if t is None:
            raise UserError(f"no Iceberg table {self.namespace}.{table} (system {self.system})")
        return t

    def version(self, table: str) -> str:
        snapshot = self._existing(table).current_snapshot()
        return "s-none" if snapshot is None else f"s{snapshot.snapshot_id}"

    def read(self, table: str, *, version: str | None = None, query: str | None = None) -> pa.Table:
        if query is not None:
            raise UserError(f"Iceberg table {table}: a query needs a PostgreSQL system")
        t = self._existing(table)
        if version in (None, "s-none"):
            return t.scan().to_arrow()
        return t.scan(snapshot_id=int(version.removeprefix("s"))).to_arrow()


class IcebergSystemFactory(TableSystemFactory):
    """``systems.<s>.factory: iceberg``."""

    config_keys = (
        *TableSystemFactory.config_keys,
        ConfigKey(
            "systems.<s>.iceberg.catalog.<s>",
            None,
            "a pyiceberg catalog property",
            "iceberg: the catalog's properties as pyiceberg names them (type, uri, warehouse, "
            "...); default a SQL catalog on SQLite under <job.data.dir>/iceberg",
        ),
        ConfigKey(
            "systems.<s>.iceberg.namespace",
            None,
            "a namespace",
            "iceberg: the namespace of the system's tables (default: job.name)",
        ),
    )

    def writer(self, system: str, config: Mapping[str, str]) -> IcebergTables:
        prefix = f"systems.{system}.iceberg.catalog."
        props = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}
        if not props:
            root = data_dir(config) / "iceberg"
            root.mkdir(parents=True, exist_ok=True)
            props = {
                "type": "sql",
                "uri": f"sqlite:///{root / 'catalog.db'}",
                "warehouse": Path(root / "warehouse").as_uri(),
            }
        namespace = config.get(f"systems.{system}.iceberg.namespace") or config.get("job.name")
        if not namespace:
            raise ConfigError(f"systems.{system}.iceberg.namespace: set it (or job.name)")
        return IcebergTables(system, props, namespace)
