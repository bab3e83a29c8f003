"""PostgreSQL tables through ``psycopg`` 3: ``systems.<s>.factory: postgres``.

``systems.<s>.postgres.dsn`` is the connection string; each stream is the table of its name
in the connection's schema (``systems.<s>.postgres.schema`` names another). A write is one
database transaction: appends go in with COPY (the batch as CSV that Arrow writes, no row in
Python), upserts with COPY into a temporary table and one ``INSERT ... ON CONFLICT`` on the key
columns (the table's primary key). Exactly-once: the transaction's first statement advances
the owner's row of ``sparkpoint_commits`` (owner, table, commit key: a ``numeric``, as keys
exceed 64 bits) only if the key is above
it, which also locks the row until the transaction ends; when it does not advance, nothing is
written. So the rows and the progress commit together, or neither does.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparkpoint.config import ConfigKey
from sparkpoint.errors import ConfigError, TableSchemaError
from sparkpoint.system.tables.base import Commit, TableSpec, TableWriter
from sparkpoint.system.tables.system import TableSystemFactory

if TYPE_CHECKING:
    import pyarrow as pa

PROGRESS_TABLE = "sparkpoint_commits"

#: PostgreSQL's type of each Arrow type id (pyarrow.types predicate name), and back
_SQL_TYPES = (
    ("is_boolean", "boolean"),
    ("is_int8", "smallint"),
    ("is_int16", "smallint"),
    ("is_int32", "integer"),
    ("is_int64", "bigint"),
    ("is_uint8", "smallint"),
    ("is_uint16", "integer"),
    ("is_uint32", "bigint"),
    ("is_float16", "real"),
    ("is_float32", "real"),
    ("is_float64", "double precision"),
    ("is_string", "text"),
    ("is_large_string", "text"),
    ("is_date", "date"),
)


def sql_type(table: str, name: str, dtype: pa.DataType) -> str:
    """The column type PostgreSQL gets for an Arrow type; :class:`TableSchemaError` names a
    column whose type has none here."""
    import pyarrow as pa

    for predicate, sql in _SQL_TYPES:
        if getattr(pa.types, predicate)(dtype):
            return sql
    if pa.types.is_timestamp(dtype):
        return "timestamptz" if dtype.tz else "timestamp"
    if pa.types.is_decimal(dtype):
        return f"numeric({dtype.precision},{dtype.scale})"
    raise TableSchemaError(
        f"table {table}: column {name!r} is {dtype}, which this PostgreSQL sink does not "
        "write (booleans, integers, floats, strings, dates, timestamps, decimals): cast it, "
        "e.g. to a JSON string"
    )


def _arrow_type(sql: str) -> pa.DataType:
    import pyarrow as pa

    return {
        "boolean": pa.bool_(),
        "smallint": pa.int16(),
        "integer": pa.int32(),
        "bigint": pa.int64(),
        "real": pa.float32(),
        "double precision": pa.float64(),
        "text": pa.string(),
        "character varying": pa.string(),
        "date": pa.date32(),
        "timestamp without time zone": pa.timestamp("us"),
        "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    }.get(sql, pa.null())


def _redacted(dsn: str) -> str:
    return re.sub(r"(password\s*=\s*)\S+|(://[^:/@]+:)[^@]+@", r"\1\2****@", dsn)


class PostgresTables(TableWriter):
    """The tables of one PostgreSQL database schema, over one connection."""

    kind = "PostgreSQL"

    def __init__(self, system: str, dsn: str, schema: str | None, timeout_s: int = 10) -> None:
        self.system = system
        self.dsn = dsn
        self.schema_name = schema
        self.timeout_s = timeout_s
        self._conn: Any = None
        #: each table's columns as the last refresh read them
        self._schemas: dict[str, pa.Schema | None] = {}
        self._progress_ready = False

    @property
    def conn(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            try:  # autocommit: a read is its own statement; a write, one explicit transaction
                conn = psycopg.connect(self.dsn, connect_timeout=self.timeout_s, autocommit=True)
            except psycopg.OperationalError as exc:
                raise psycopg.OperationalError(
                    f"cannot connect to {_redacted(self.dsn)} (systems.{self.system}."
                    f"postgres.dsn): {str(exc).strip().splitlines()[0]}"
                ) from exc
            if self.schema_name:
                conn.execute(
                    psycopg.sql.SQL("SET search_path TO {}").format(
                        psycopg.sql.Identifier(self.schema_name)
                    )
                )
            self._conn = conn
        return self._conn

    def _ident(self, name: str) -> Any:
        from psycopg import sql

        return sql.Identifier(name)

    def tables(self) -> list[str]:
        rows = self.conn.execute(  # (the catalog: information_schema takes ms a query)
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname <> %s "
            "ORDER BY 1",
            (PROGRESS_TABLE,),
        ).fetchall()
        return [r[0] for r in rows]

    #: the write's first statement advances the owner's progress, or writes nothing
    checks_commit = True

    def refresh(self, table: str) -> None:
        """Forget the table's columns (kept between writes: a write that finds them changed
        fails, and its retry refreshes)."""
        self._schemas.pop(table, None)

    def schema(self, table: str) -> pa.Schema | None:
        if table not in self._schemas:
            self._schemas[table] = self._read_schema(table)
        return self._schemas[table]

    def _read_schema(self, table: str) -> pa.Schema | None:
        import pyarrow as pa

        rows = self.conn.execute(
            "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relname = %s AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum",
            (table,),
        ).fetchall()
        return pa.schema([(n, _arrow_type(t)) for n, t in rows]) if rows else None

    def _progress_exists(self) -> bool:
        if not self._progress_ready:
            row = self.conn.execute("SELECT to_regclass(%s)", (PROGRESS_TABLE,)).fetchone()
            self._progress_ready = row is not None and row[0] is not None
        return self._progress_ready

    def published(self, table: str, commit: Commit) -> bool:
        if not self._progress_exists():
            return False
        row = self.conn.execute(
            f"SELECT commit >= %s FROM {PROGRESS_TABLE} WHERE owner = %s AND tbl = %s",
            (commit.key, commit.owner, table),
        ).fetchone()
        return row is not None and bool(row[0])

    def owners(self, table: str) -> list[str]:
        if not self._progress_exists():
            return []
        rows = self.conn.execute(
            f"SELECT owner FROM {PROGRESS_TABLE} WHERE tbl = %s ORDER BY 1", (table,)
        ).fetchall()
        return [r[0] for r in rows]

    def write(
        self, spec: TableSpec, data: pa.Table, new_columns: Sequence[str], commit: Commit | None
    ) -> int:
        from psycopg import sql

        conn = self.conn
        try:
            with conn.transaction():
                if commit is not None and not self._advance(commit, spec.name):
                    return 0
                target = self._ident(spec.name)
                self._ensure(spec, data, new_columns)
                columns = sql.SQL(", ").join(self._ident(n) for n in data.schema.names)
                if spec.mode == "append":
                    self._copy(sql.SQL("COPY {} ({})").format(target, columns), data)
                    return len(data)
                staged = self._ident(f"_sparkpoint_upsert_{spec.name}")
                conn.execute(
                    sql.SQL(
                        "CREATE TEMP TABLE {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DROP"
                    ).format(staged, target)
                )
                self._copy(sql.SQL("COPY {} ({})").format(staged, columns), data)
                keys = sql.SQL(", ").join(self._ident(k) for k in spec.keys)
                rest = [n for n in data.schema.names if n not in spec.keys]
                action = (
                    sql.SQL("DO UPDATE SET ")
                    + sql.SQL(", ").join(
                        sql.SQL("{} = EXCLUDED.{}").format(self._ident(n), self._ident(n))
                        for n in rest
                    )
                    if rest
                    else sql.SQL("DO NOTHING")
                )
                conn.execute(
                    sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) ").format(
                        target, columns, columns, staged, keys
                    )
                    + action
                )
                return len(data)
        except Exception:
            if conn.closed or conn.broken:
                self._conn = None
            self._progress_ready = False  # a rolled-back transaction may have created it
            self._schemas.pop(spec.name, None)
            raise

    def _advance(self, commit: Commit, table: str) -> bool:
        """Move the owner's progress to ``commit.key`` if it is above it (the row stays locked
        until the transaction ends); whether it moved."""
        if not self._progress_ready:
            self.conn.execute(
                f"CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (owner text NOT NULL, tbl text NOT "
                "NULL, commit numeric NOT NULL, PRIMARY KEY (owner, tbl))"
            )
            self._progress_ready = True
        row = self.conn.execute(
            f"INSERT INTO {PROGRESS_TABLE} AS p (owner, tbl, commit) VALUES (%s, %s, %s) "
            "ON CONFLICT (owner, tbl) DO UPDATE SET commit = EXCLUDED.commit "
            "WHERE p.commit < EXCLUDED.commit RETURNING commit",
            (commit.owner, table, commit.key),
        ).fetchone()
        return row is not None

    def _ensure(self, spec: TableSpec, data: pa.Table, new_columns: Sequence[str]) -> None:
        """Create the table from the batch's columns (an upserted one with its key as primary
        key), or add ``new_columns``: in the write's transaction."""
        from psycopg import sql

        label = spec.label
        known = self._schemas.get(spec.name) or self._read_schema(spec.name)
        if new_columns or known is None:  # changed by this transaction (or its rollback)
            self._schemas.pop(spec.name, None)
        if known is None:
            cols = [
                sql.SQL("{} {}").format(
                    self._ident(f.name), sql.SQL(sql_type(label, f.name, f.type))
                )
                for f in data.schema
            ]
            if spec.mode == "upsert":
                keys = sql.SQL(", ").join(self._ident(k) for k in spec.keys)
                cols.append(sql.SQL("PRIMARY KEY ({})").format(keys))
            self.conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                    self._ident(spec.name), sql.SQL(", ").join(cols)
                )
            )
            return
        for name in new_columns:
            dtype = sql_type(label, name, data.schema.field(name).type)
            self.conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    self._ident(spec.name), self._ident(name), sql.SQL(dtype)
                )
            )

    def _copy(self, statement: Any, data: pa.Table) -> None:
        """COPY ``data`` in as CSV written by Arrow: strings quoted, a null unquoted and empty
        (PostgreSQL's CSV null), so no row passes through Python."""
        import pyarrow.csv as pacsv
        from psycopg import sql

        buffer = io.BytesIO()
        pacsv.write_csv(
            data, buffer, pacsv.WriteOptions(include_header=False, quoting_style="needed")
        )
        with self.conn.cursor().copy(statement + sql.SQL(" FROM STDIN (FORMAT csv)")) as copy:
            copy.write(buffer.getvalue())

    def retriable(self, exc: BaseException) -> bool:
        import psycopg
        from psycopg import errors

        # (two first writes creating one table at once: the loser's CREATE ... IF NOT EXISTS
        # fails on the catalog, and its second try finds the table)
        racing = (errors.UniqueViolation, errors.DuplicateObject, errors.DuplicateTable)
        return isinstance(exc, (psycopg.OperationalError, *racing)) or super().retriable(exc)

    def read(self, table: str, *, version: str | None = None, query: str | None = None) -> pa.Table:
        import pyarrow as pa
        from psycopg import sql

        statement = (
            sql.SQL(query) if query else sql.SQL("SELECT * FROM {}").format(self._ident(table))
        )
        cur = self.conn.execute(statement)
        names = [d.name for d in cur.description or ()]
        rows = cur.fetchall()
        if not rows:  # (its columns, with no type to tell)
            return pa.table({n: pa.nulls(0) for n in names})
        return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresSystemFactory(TableSystemFactory):
    """``systems.<s>.factory: postgres``."""

    config_keys = (
        *TableSystemFactory.config_keys,
        ConfigKey(
            "systems.<s>.postgres.dsn",
            None,
            "a libpq connection string",
            "postgres: the database, e.g. postgresql://user@host:5432/db (a password is "
            "better in PGPASSWORD or ~/.pgpass than here)",
        ),
        ConfigKey(
            "systems.<s>.postgres.schema",
            None,
            "a schema name",
            "postgres: the schema of the system's tables (default: the connection's)",
        ),
        ConfigKey(
            "systems.<s>.postgres.connect.timeout.s",
            "10",
            "an integer >= 1",
            "postgres: how long a connection attempt waits for the server",
        ),
    )

    def writer(self, system: str, config: Mapping[str, str]) -> PostgresTables:
        key = f"systems.{system}.postgres.dsn"
        dsn = config.get(key)
        if not dsn:
            raise ConfigError(
                f"missing required config key {key} (the database, e.g. "
                "postgresql://user@localhost:5432/db)"
            )
        timeout = int(config.get(f"systems.{system}.postgres.connect.timeout.s") or "10")
        return PostgresTables(system, dsn, config.get(f"systems.{system}.postgres.schema"), timeout)
