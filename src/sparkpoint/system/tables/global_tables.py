"""Global tables: a table every task reads whole, as Kafka Streams' ``GlobalKTable`` or Flink's
broadcast state, joinable without co-partitioning.

``tables.<t>.source`` names where it comes from: ``<system>.<table>`` of a table system (a
Delta or Iceberg table, a PostgreSQL table, or ``tables.<t>.query`` run against the PostgreSQL
system ``<system>``), ``<system>.<stream>`` of a log system (a compacted stream, read whole:
each key's newest value), or ``parquet:<directory>``. Each *version* of the table (a Delta
version, an Iceberg snapshot, the streams' end offsets, a hash of the query's rows or of the
directory's files) is read once, by the driver, into a snapshot file
``<job.data.dir>/global-tables/<t>/<version>.parquet`` that every task (and a DataFrame
pipeline's ``batch.table``) reads: a replayed batch reads the version it first saw, whatever
changed at the source since. The driver's side (which version a batch sees, and its record in
the checkpoints) is :mod:`sparkpoint.runtime.driver.global_tables`.

Owns the sources, the snapshots and the lookup a task gets (:class:`GlobalTable`).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, UserError
from sparkpoint.fsutil import fsync_dir
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.system.registry import Systems, factory_class
from sparkpoint.system.streams import stream_serdes
from sparkpoint.system.tables.system import TableSystemFactory

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkpoint.system.tables.base import TableWriter


def global_table_names(config: Mapping[str, str]) -> list[str]:
    """The global tables a config declares (``tables.<t>.source``), sorted."""
    return sorted(
        k[len("tables.") : -len(".source")]
        for k, v in config.items()
        if k.startswith("tables.") and k.endswith(".source") and v
    )


@dataclass(frozen=True)
class GlobalTableSpec:
    """``tables.<t>.*``: a global table's source, lookup key and refresh interval."""

    name: str
    source: str
    key: str | None
    query: str | None
    refresh_ms: int

    @classmethod
    def of(cls, config: Config, name: str) -> GlobalTableSpec:
        return cls(
            name,
            config.require(f"tables.{name}.source"),
            config.get_str(f"tables.{name}.key"),
            config.get_str(f"tables.{name}.query"),
            config.get_int(f"tables.{name}.refresh.ms"),
        )


class Source(ABC):
    """Where a global table's rows come from."""

    @abstractmethod
    def version(self) -> str:
        """The source's version now (a file name: letters, digits, ``-``)."""

    @abstractmethod
    def read(self, version: str) -> pa.Table:
        """The rows at ``version`` (as probed just before)."""


class TableSource(Source):
    """A table of a table system (Delta, Iceberg, PostgreSQL)."""

    def __init__(self, writer: TableWriter, table: str, query: str | None) -> None:
        self.writer = writer
        self.table = table
        self.query = query
        self._rows: pa.Table | None = None

    def version(self) -> str:
        if self.writer.versioned and self.query is None:
            self.writer.refresh(self.table)
            return self.writer.version(self.table)
        # no versions (a query): the rows are the version
        self._rows = self.writer.read(self.table, query=self.query)
        return "h" + _digest(self._rows)

    def read(self, version: str) -> pa.Table:
        if self._rows is not None:
            rows, self._rows = self._rows, None
            return rows
        return self.writer.read(self.table, version=version)


class StreamSource(Source):
    """A compacted stream of a log system: each key's newest value, tombstones deleting."""

    def __init__(self, config: Config, systems: Systems, stream: SystemStream) -> None:
        self.config = config
        self.systems = systems
        self.stream = stream

    def _ends(self) -> dict[SystemStreamPartition, Any]:
        ssps = self.systems.partitions_of([self.stream])
        return dict(self.systems.admin(self.stream.system).get_committed_metadata(ssps))

    def version(self) -> str:
        ends = {str(s): m.upcoming for s, m in sorted(self._ends().items())}
        return "o" + hashlib.sha1(json.dumps(ends).encode()).hexdigest()[:20]

    def read(self, version: str) -> pa.Table:
        import pyarrow as pa

        key_serde, msg_serde = stream_serdes(self.config, self.stream)
        latest: dict[bytes, bytes] = {}
        consumer = self.systems.consumer(self.stream.system)
        for ssp, meta in sorted(self._ends().items()):
            consumer.register(ssp, meta.oldest)
            at = meta.oldest
            while self.systems.admin(ssp.system).offset_comparator(at, meta.upcoming) < 0:
                records = consumer.read(ssp, at, meta.upcoming, 10_000)
                if not records:
                    break
                for r in records:
                    if r.key is None:
                        continue
                    if r.value is None:
                        latest.pop(r.key, None)
                    else:
                        latest[r.key] = r.value
                at = self.systems.admin(ssp.system).offset_after(ssp, records[-1].offset)
        consumer.close()
        values = [msg_serde.from_bytes(v) for v in latest.values()]
        if values and all(isinstance(v, Mapping) for v in values):
            return pa.Table.from_pylist([dict(v) for v in values])
        keys = [key_serde.from_bytes(k) for k in latest]
        return pa.table({"key": keys, "value": values})


class ParquetSource(Source):
    """A directory of Parquet files."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def version(self) -> str:
        if not self.path.exists():
            raise UserError(f"global table source parquet:{self.path}: no such directory")
        files = sorted(p for p in self.path.rglob("*.parquet") if p.is_file())
        stats = [(p, p.stat()) for p in files]
        listing = [(str(p.relative_to(self.path)), s.st_size, s.st_mtime_ns) for p, s in stats]
        return "f" + hashlib.sha1(json.dumps(listing).encode()).hexdigest()[:20]

    def read(self, version: str) -> pa.Table:
        import pyarrow.dataset as ds

        return ds.dataset(str(self.path), format="parquet").to_table()


def _digest(rows: pa.Table) -> str:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return hashlib.sha1(sink.getvalue().to_pybytes()).hexdigest()[:20]


def source_of(config: Config, systems: Systems, spec: GlobalTableSpec) -> Source:
    """The source ``tables.<t>.source`` names; :class:`ConfigError` says what it may be."""
    key = f"tables.{spec.name}.source"
    if spec.source.startswith("parquet:"):
        return ParquetSource(Path(spec.source[len("parquet:") :]).expanduser())
    system, _, name = spec.source.partition(".")
    if system not in config.systems:
        raise ConfigError(
            f"{key}={spec.source!r}: expected <system>.<table or stream> of a configured "
            f"system ({', '.join(sorted(config.systems)) or 'none'}) or parquet:<directory>"
        )
    factory = factory_class(config.require(f"systems.{system}.factory"))
    if issubclass(factory, TableSystemFactory):
        if not name and spec.query is None:
            raise ConfigError(
                f"{key}={spec.source!r}: name the table, or set tables.{spec.name}.query"
            )
        return TableSource(factory().writer(system, config), name, spec.query)
    if spec.query is not None:
        raise ConfigError(f"tables.{spec.name}.query: {system} is no PostgreSQL system")
    return StreamSource(config, systems, SystemStream(system, name))


def snapshot_path(config: Mapping[str, str], name: str, version: str) -> Path:
    """Where version ``version`` of global table ``name`` is kept."""
    data = config.get("job.data.dir")
    if not data:
        raise UserError("job.data.dir is not set: global tables keep their snapshots under it")
    return Path(data) / "global-tables" / name / f"{version}.parquet"


def materialize(config: Config, source: Source, name: str) -> str:
    """The source's version now, its snapshot written if it is new (durable, whole)."""
    import pyarrow.parquet as pq

    version = source.version()
    path = snapshot_path(config, name, version)
    if path.exists():
        return version
    rows = source.read(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    pq.write_table(rows, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return version


class GlobalTable:
    """One version of a global table, as a task gets it (``context.get_table(name)``): look a
    row up by the key column (``tables.<t>.key``), or take every row."""

    def __init__(self, name: str, version: str, rows: pa.Table, key: str | None) -> None:
        self.name = name
        self.version = version
        self._rows = rows
        self._key = key
        self._index: dict[Any, dict[str, Any]] | None = None

    def to_arrow(self) -> pa.Table:
        return self._rows

    def __len__(self) -> int:
        return int(self._rows.num_rows)

    def _lookup(self) -> dict[Any, dict[str, Any]]:
        if self._index is None:
            if self._key is None:
                raise UserError(
                    f"global table {self.name}: set tables.{self.name}.key to look rows up by it"
                )
            if self._key not in self._rows.schema.names:
                raise UserError(
                    f"global table {self.name}: no column {self._key!r} (tables.{self.name}.key); "
                    f"columns: {', '.join(self._rows.schema.names)}"
                )
            rows = self._rows.to_pylist()
            self._index = {row[self._key]: row for row in rows}
        return self._index

    def get(self, key: Any) -> dict[str, Any] | None:
        """The row whose key column is ``key`` (the last one, if several), else ``None``."""
        return self._lookup().get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._lookup()


@lru_cache(maxsize=16)
def _open(path: str, name: str, version: str, key: str | None) -> GlobalTable:
    import pyarrow.parquet as pq

    return GlobalTable(name, version, pq.read_table(path), key)


def open_global_table(config: Mapping[str, str], name: str, version: str) -> GlobalTable:
    """Version ``version`` of global table ``name``: read, and indexed at its first lookup,
    once per process."""
    path = snapshot_path(config, name, version)
    try:
        return _open(str(path), name, version, config.get(f"tables.{name}.key") or None)
    except FileNotFoundError:
        raise UserError(
            f"global table {name}: its snapshot {path} is missing (the job's data directory "
            "must be shared by every worker)"
        ) from None
