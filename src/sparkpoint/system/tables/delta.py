"""Delta Lake tables through ``deltalake`` (delta-rs: no JVM package):
``systems.<s>.factory: delta``.

Each stream is the table at ``<systems.<s>.delta.path>/<stream>`` (default
``<job.data.dir>/tables/<s>``). A write is one Delta commit: an append, or a merge on the
table's key columns for an upsert. Exactly-once: the commit carries a ``txn`` action (the
owner as application id, the commit key as version), Delta's own idempotent-writer record, as
Spark's ``txnAppId``/``txnVersion`` are (:func:`txn`); a version not above the recorded one is
not written.
A commit that conflicts with another writer's is retried by delta-rs, then by
:class:`~sparkpoint.system.tables.base.Tables`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkpoint.config import ConfigKey
from sparkpoint.errors import UserError
from sparkpoint.system.tables.base import Commit, TableSpec, TableWriter
from sparkpoint.system.tables.system import TableSystemFactory, data_dir

if TYPE_CHECKING:
    import pyarrow as pa


#: a Delta ``txn`` version is a signed 64-bit integer
_VERSION_BITS = 63


def txn(commit: Commit) -> tuple[str, int]:
    """The ``txn`` action (application id, version) of a commit. A key under 2**63 (a task's)
    is the owner's version; a larger one (a DataFrame batch's: the batch log's epoch, then the
    batch) goes under an application id that names its high bits, its low bits the version:
    one id per owner and batch-log epoch, so versions of one id grow with the keys."""
    high, low = commit.key >> _VERSION_BITS, commit.key & ((1 << _VERSION_BITS) - 1)
    return (commit.owner if high == 0 else f"{commit.owner}~{high}"), low


class DeltaTables(TableWriter):
    """The Delta tables under one root directory."""

    kind = "Delta"

    def __init__(self, root: Path, target_file_size: int | None = None) -> None:
        self.root = root
        self.target_file_size = target_file_size
        self._open_tables: dict[str, Any] = {}

    def _path(self, table: str) -> str:
        return str(self.root / table)

    def _open(self, table: str) -> Any:
        """The table as the last :meth:`refresh` read it (``None``: there is none)."""
        if table not in self._open_tables:
            self.refresh(table)
        return self._open_tables[table]

    def refresh(self, table: str) -> None:
        from deltalake import DeltaTable

        dt = self._open_tables.get(table)
        if dt is not None:
            dt.update_incremental()  # only the commits since
            return
        path = self._path(table)
        self._open_tables[table] = DeltaTable(path) if DeltaTable.is_deltatable(path) else None

    def tables(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "_delta_log").is_dir())

    def schema(self, table: str) -> pa.Schema | None:
        import pyarrow as pa

        dt = self._open(table)
        return None if dt is None else pa.schema(dt.schema().to_arrow())

    def published(self, table: str, commit: Commit) -> bool:
        dt = self._open(table)
        if dt is None:
            return False
        app_id, version = txn(commit)
        recorded = dt.transaction_version(app_id)
        return recorded is not None and int(recorded) >= version

    def owners(self, table: str) -> list[str]:
        """The application ids of the table's ``txn`` actions, from its latest snapshot."""
        dt = self._open(table)
        if dt is None:
            return []
        import json

        found: set[str] = set()
        for entry in sorted((self.root / table / "_delta_log").glob("*.json")):
            for line in entry.read_text().splitlines():
                txn = json.loads(line).get("txn") if line.strip() else None
                if txn:
                    found.add(str(txn["appId"]).split("~")[0])  # see txn()
        return sorted(found)

    def write(
        self, spec: TableSpec, data: pa.Table, new_columns: Sequence[str], commit: Commit | None
    ) -> int:
        from deltalake import CommitProperties, Transaction, write_deltalake

        props = None
        if commit is not None:
            props = CommitProperties(app_transactions=[Transaction(*txn(commit))])
        dt = self._open(spec.name)
        if dt is None or spec.mode == "append":
            write_deltalake(
                self._path(spec.name) if dt is None else dt,
                data,
                mode="append",
                partition_by=list(spec.partition_by) or None if dt is None else None,
                schema_mode="merge" if new_columns else None,
                target_file_size=self.target_file_size,
                commit_properties=props,
            )
            return len(data)
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in spec.keys)
        merge = dt.merge(
            data,
            predicate=on,
            source_alias="s",
            target_alias="t",
            merge_schema=bool(new_columns),
            commit_properties=props,
        )
        merge.when_matched_update_all().when_not_matched_insert_all().execute()
        return len(data)

    def retriable(self, exc: BaseException) -> bool:
        from deltalake.exceptions import CommitFailedError

        return isinstance(exc, CommitFailedError) or super().retriable(exc)

    versioned = True

    def version(self, table: str) -> str:
        dt = self._open(table)
        if dt is None:
            raise UserError(f"no Delta table at {self._path(table)}")
        return f"v{dt.version()}"

    def read(self, table: str, *, version: str | None = None, query: str | None = None) -> pa.Table:
        import pyarrow as pa
        from deltalake import DeltaTable

        if query is not None:
            raise UserError(f"Delta table {table}: a query needs a PostgreSQL system")
        if self._open(table) is None:
            raise UserError(f"no Delta table at {self._path(table)}")
        at = None if version is None else int(version.removeprefix("v"))
        return pa.table(DeltaTable(self._path(table), version=at).to_pyarrow_table())


class DeltaSystemFactory(TableSystemFactory):
    """``systems.<s>.factory: delta``."""

    config_keys = (
        *TableSystemFactory.config_keys,
        ConfigKey(
            "systems.<s>.delta.path",
            None,
            "a directory path",
            "delta: the root of the system's tables, one per stream (default "
            "<job.data.dir>/tables/<s>; every worker must see it)",
        ),
        ConfigKey(
            "systems.<s>.delta.target.file.size",
            None,
            "bytes",
            "delta: the size delta-rs aims its data files at (its default: 100 MiB)",
        ),
    )

    def writer(self, system: str, config: Mapping[str, str]) -> DeltaTables:
        root = config.get(f"systems.{system}.delta.path")
        size = config.get(f"systems.{system}.delta.target.file.size")
        return DeltaTables(
            Path(root) if root else data_dir(config) / "tables" / system,
            int(size) if size else None,
        )
