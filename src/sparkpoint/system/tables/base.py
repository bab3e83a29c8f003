"""What every table system shares: how a table's rows land (:class:`TableSpec`), the interface
of one kind of table (:class:`TableWriter`), and :class:`Tables`, the one place a batch becomes
a table commit: its columns held to the table's (:func:`conform`), an upsert's keys made
unique (:func:`last_per_key`), the write retried when a retry can succeed, and at most once per
``(owner, commit key)`` (:class:`Commit`).

Exactly-once rests on the writer: with a :class:`Commit`, :meth:`TableWriter.write` records the
owner's commit key in the same table commit as the rows (Delta: a ``txn`` action; Iceberg: a
table property set in the snapshot's transaction, and the snapshot's summary; PostgreSQL: a
progress row in the same database transaction), and writes nothing when the owner's recorded
key is not below it. So a replayed publish, whoever runs it, never writes twice.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkpoint.errors import (
    ConfigError,
    SparkpointError,
    TableError,
    TableSchemaError,
    first_line,
)
from sparkpoint.system.retry import is_transient

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

MODES = ("append", "upsert")


def _setting(config: Mapping[str, str], system: str, stream: str, name: str) -> str | None:
    """A table stream's setting: ``streams.<t>.table.<name>``, else the system's default."""
    return config.get(f"streams.{stream}.table.{name}") or config.get(
        f"systems.{system}.default.stream.table.{name}"
    )


def _columns(value: str | None) -> tuple[str, ...]:
    return tuple(c.strip() for c in (value or "").split(",") if c.strip())


@dataclass(frozen=True)
class TableSpec:
    """How the rows of one table land: ``streams.<t>.table.*``."""

    system: str
    name: str
    mode: str = "append"
    keys: tuple[str, ...] = ()
    add_columns: bool = False
    partition_by: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.system}.{self.name}"

    @classmethod
    def of(cls, config: Mapping[str, str], system: str, stream: str) -> TableSpec:
        mode = _setting(config, system, stream, "mode") or "append"
        if mode not in MODES:
            raise ConfigError(f"streams.{stream}.table.mode={mode!r}: expected append or upsert")
        keys = _columns(_setting(config, system, stream, "key"))
        if mode == "upsert" and not keys:
            raise ConfigError(
                f"streams.{stream}.table.key: table {system}.{stream} is upserted "
                "(table.mode: upsert) and needs its key columns, e.g. user or user,page"
            )
        evolution = _setting(config, system, stream, "schema.evolution") or "none"
        if evolution not in ("none", "add-columns"):
            raise ConfigError(
                f"streams.{stream}.table.schema.evolution={evolution!r}: expected none or "
                "add-columns"
            )
        partition_by = _columns(_setting(config, system, stream, "partition.by"))
        return cls(system, stream, mode, keys, evolution == "add-columns", partition_by)


@dataclass(frozen=True)
class Commit:
    """Who writes (a task, or a pipeline's batches) and the key ordering its commits."""

    owner: str
    key: int


class TableWriter(ABC):
    """One system's tables of one kind (Delta, Iceberg, PostgreSQL). Not thread-safe: each
    producer and admin holds its own."""

    #: the kind, as a message names it
    kind = "table"

    @abstractmethod
    def tables(self) -> list[str]:
        """The tables that exist, sorted."""

    @abstractmethod
    def schema(self, table: str) -> pa.Schema | None:
        """The table's columns as Arrow types (``None``: no such table). A column whose type
        has no Arrow equivalent here maps to ``pa.null()``: any value the table accepts."""

    @abstractmethod
    def published(self, table: str, commit: Commit) -> bool:
        """Whether ``table`` holds ``commit``: its owner recorded that key or a later one.
        (Commit keys are unbounded integers: a DataFrame batch's exceed 64 bits.)"""

    @abstractmethod
    def owners(self, table: str) -> list[str]:
        """Every owner that recorded a commit in ``table``."""

    @abstractmethod
    def write(
        self, spec: TableSpec, data: pa.Table, new_columns: Sequence[str], commit: Commit | None
    ) -> int:
        """Write ``data`` (held to the table's columns already; an upsert's keys unique) in
        one table commit, creating the table when missing and adding ``new_columns``; with
        ``commit``, only when the owner's recorded key is below ``commit.key``, recording it in
        the same commit. Returns the rows written (0: the commit was written already)."""

    #: whether :meth:`write` itself refuses a commit the table holds already, atomically, and
    #: needs no :meth:`refresh` before it (then :class:`Tables` refreshes only to retry)
    checks_commit = False

    def refresh(self, table: str) -> None:  # noqa: B027 - optional hook
        """Read the table's state again: what :meth:`published`, :meth:`schema` and
        :meth:`write` see until the next refresh (a writer may keep a table open between
        them)."""

    def retriable(self, exc: BaseException) -> bool:
        """Whether a second try of a failed write may succeed (a commit conflict, a dropped
        connection). The default: the transient faults of :func:`is_transient`."""
        return is_transient(exc)

    #: whether :meth:`version` names versions :meth:`read` can read again (else a global
    #: table's version is a hash of its rows)
    versioned = False

    def version(self, table: str) -> str:
        """The table's version now (a file name), when :attr:`versioned`."""
        raise NotImplementedError(f"{self.kind} tables have no versions")

    @abstractmethod
    def read(self, table: str, *, version: str | None = None, query: str | None = None) -> pa.Table:
        """The table's rows (a global table's load): now, or at ``version``; or the rows
        ``query`` gives, where the kind runs queries."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Idempotent."""


def _widens(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether values of type ``have`` cast into a column of type ``want`` without loss of
    meaning (a wider integer, string to large string, a timestamp's unit)."""
    import pyarrow as pa

    t = pa.types
    if have == want or t.is_null(have) or t.is_null(want):
        return True
    if t.is_integer(have) and t.is_integer(want):
        signs = bool(t.is_signed_integer(want)) or not t.is_signed_integer(have)
        return int(have.bit_width) <= int(want.bit_width) and signs
    if t.is_floating(have) and t.is_floating(want):
        return int(have.bit_width) <= int(want.bit_width)
    pairs = (
        (t.is_string, t.is_large_string),
        (t.is_binary, t.is_large_binary),
    )
    for one, other in pairs:
        if (one(have) or other(have)) and (one(want) or other(want)):
            return True
    if t.is_timestamp(have) and t.is_timestamp(want):
        return (have.tz is None) == (want.tz is None)
    if t.is_date(have) and t.is_date(want):
        return True
    return bool(t.is_decimal(have) and t.is_decimal(want) and have.scale == want.scale)


def _held_to(spec: TableSpec, field: pa.Field, column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` cast to the table's ``field``: a widening always; a narrower integer column
    (a table made elsewhere, ``integer`` where Python's ints are 64-bit) when every value
    fits; else :class:`TableSchemaError` naming the column."""
    import pyarrow as pa

    if _widens(column.type, field.type):
        return column.cast(field.type, safe=False)
    refused = (
        f"table {spec.label}: column {field.name!r} is {field.type} in the table but "
        f"{column.type} in the batch"
    )
    if pa.types.is_integer(column.type) and pa.types.is_integer(field.type):
        try:
            return column.cast(field.type, safe=True)
        except pa.ArrowInvalid:
            raise TableSchemaError(f"{refused}, and a value does not fit") from None
    raise TableSchemaError(
        f"{refused}; a column's type cannot change (cast it in the job, or write to a new table)"
    )


def conform(spec: TableSpec, table: pa.Schema | None, data: pa.Table) -> tuple[pa.Table, list[str]]:
    """``data`` with the table's columns, in its order and types (columns it lacks are null),
    and the columns it adds; :class:`TableSchemaError` names the table and the column when a
    column is new (without ``table.schema.evolution: add-columns``) or changed its type."""
    import pyarrow as pa

    # a column with no value in a batch (null-typed) is left out where the table lacks it:
    # it writes nothing, and a table created from it would get a column of no type
    absent = [
        f.name
        for f in data.schema
        if pa.types.is_null(f.type) and (table is None or f.name not in table.names)
    ]
    if absent:
        data = data.drop_columns(absent)
    if table is None:
        return data, []
    new = [n for n in data.schema.names if n not in table.names]
    if new and not spec.add_columns:
        raise TableSchemaError(
            f"table {spec.label}: column {new[0]!r} is not in the table; set "
            f"streams.{spec.name}.table.schema.evolution: add-columns to add it, or drop it"
        )
    columns, fields = [], []
    for field in table:
        if field.name not in data.schema.names:
            columns.append(pa.nulls(len(data), type=field.type))
            fields.append(field)
            continue
        column = data.column(field.name)
        if column.type != field.type and not pa.types.is_null(field.type):
            column = _held_to(spec, field, column)
        columns.append(column)
        fields.append(pa.field(field.name, column.type))
    for name in new:
        columns.append(data.column(name))
        fields.append(data.schema.field(name))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields)), new


def last_per_key(spec: TableSpec, data: pa.Table) -> pa.Table:
    """An upsert's rows with one row per key, the last sent (in their order); a key column
    missing or null is :class:`TableSchemaError`. Arrow's group-by, no row in Python."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for key in spec.keys:
        if key not in data.schema.names:
            raise TableSchemaError(
                f"table {spec.label}: the rows have no key column {key!r} "
                f"(streams.{spec.name}.table.key)"
            )
        nulls = data.column(key).null_count
        if nulls:
            raise TableSchemaError(
                f"table {spec.label}: {nulls} rows have no value in key column {key!r}"
            )
    if len(data) < 2:
        return data
    numbered = data.append_column("__sparkpoint_row", pa.array(range(len(data)), pa.int64()))
    last = numbered.group_by(list(spec.keys), use_threads=False).aggregate(
        [("__sparkpoint_row", "max")]
    )
    if len(last) == len(data):
        return data
    rows = last.column("__sparkpoint_row_max")
    return data.take(pc.take(rows, pc.sort_indices(rows)))  # the kept rows, in their order


class Tables:
    """A table system's writes (the producer's and the publisher's): the one home of the steps
    every kind shares (see the module docstring)."""

    def __init__(
        self, system: str, config: Mapping[str, str], writer: TableWriter, attempts: int = 5
    ) -> None:
        self.system = system
        self.config = config
        self.writer = writer
        self.attempts = attempts
        self._specs: dict[str, TableSpec] = {}

    def spec(self, table: str) -> TableSpec:
        spec = self._specs.get(table)
        if spec is None:
            spec = self._specs[table] = TableSpec.of(self.config, self.system, table)
        return spec

    def write(self, table: str, data: pa.Table, commit: Commit | None = None) -> int:
        """Write ``data`` to ``table`` (see :meth:`TableWriter.write`); a failure a retry can
        get past is retried with a doubling pause, then :class:`TableError` names the table."""
        spec = self.spec(table)
        if spec.mode == "upsert":
            data = last_per_key(spec, data)
        delay = 0.2
        for attempt in range(1, self.attempts + 1):
            try:
                return self._write_once(spec, data, commit, retry=attempt > 1)
            except SparkpointError:  # the table's answer (its schema), or the config's
                raise
            except Exception as exc:
                if attempt == self.attempts or not self.writer.retriable(exc):
                    raise TableError(
                        f"table {spec.label}: the {self.writer.kind} write failed"
                        + (f" after {attempt} tries" if attempt > 1 else "")
                        + f": {type(exc).__name__}: {first_line(exc)}"
                    ) from exc
                log.warning(
                    "table %s: %s write failed (%s: %s); trying again in %.1fs (%d of %d)",
                    spec.label,
                    self.writer.kind,
                    type(exc).__name__,
                    first_line(exc),
                    delay,
                    attempt + 1,
                    self.attempts,
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def _write_once(
        self, spec: TableSpec, data: pa.Table, commit: Commit | None, *, retry: bool
    ) -> int:
        writer = self.writer
        if retry or not writer.checks_commit:
            writer.refresh(spec.name)
        # asked on every try: a try that failed after its commit landed wrote it
        if commit is not None and not writer.checks_commit and writer.published(spec.name, commit):
            return 0
        try:
            held, new = conform(spec, writer.schema(spec.name), data)
        except TableSchemaError:
            if retry or not writer.checks_commit:
                raise
            writer.refresh(spec.name)  # a schema kept since another writer changed it
            held, new = conform(spec, writer.schema(spec.name), data)
        return writer.write(spec, held, new, commit)
