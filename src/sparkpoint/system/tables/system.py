"""A table system's admin, producers and exactly-once staging, over a :class:`TableWriter`.

A table has no partitions and no offsets: each stream of the system is a table with one
partition (0), written and never read through the stream interfaces (a table is read as a
global table). The producer (at-least-once) writes what it holds at each :meth:`flush`, one
table commit per table. Exactly-once output is staged as Arrow IPC files, one per task
attempt's batch and table, under ``systems.<s>.staging.path`` (default
``<job.data.dir>/staging/<s>``, a directory every worker sees, as the embedded log's), and
published by :class:`~sparkpoint.system.tables.base.Tables` under the owner's commit key:
the table records that key in the same commit, so a second publish writes nothing; the part
file is deleted after its commit.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from abc import abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sparkpoint import worker
from sparkpoint.config import ConfigKey
from sparkpoint.errors import UserError
from sparkpoint.failpoints import maybe_crash
from sparkpoint.fsutil import fsync_dir
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import (
    PartitionMetadata,
    Record,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
    TableProducer,
    not_rows,
)
from sparkpoint.system.staging import OutputStaging, StagedPart, StagingProducer, swept_by
from sparkpoint.system.tables.base import Commit, Tables, TableWriter

if TYPE_CHECKING:
    import pyarrow as pa

#: a staged part's file: one table's rows of one task attempt's batch
PART = ".arrow"


def _output_only(system: str) -> UserError:
    return UserError(
        f"system {system!r} is a table system: tables are outputs (task.inputs cannot read "
        "them); read one whole in every task as a global table"
    )


class _Rows:
    """Rows held per table until they are written: Arrow batches, and task API rows (dicts)
    gathered into a batch once."""

    def __init__(self) -> None:
        self.batches: dict[str, list[pa.RecordBatch | pa.Table]] = {}
        self.rows: dict[str, list[Mapping[str, object]]] = {}

    def add_rows(self, table: str, rows: Sequence[Mapping[str, object]]) -> None:
        problem = not_rows(table, rows)
        if problem:
            raise UserError(problem)
        self.rows.setdefault(table, []).extend(rows)

    def add_batch(self, table: str, batch: pa.RecordBatch) -> None:
        self._seal(table)
        self.batches.setdefault(table, []).append(batch)

    def _seal(self, table: str) -> None:
        import pyarrow as pa

        rows = self.rows.pop(table, None)
        if rows:  # (the columns of every row: from_pylist would take the first row's only)
            batch = pa.RecordBatch.from_struct_array(pa.array(rows))
            self.batches.setdefault(table, []).append(batch)

    def take(self) -> dict[str, pa.Table]:
        """Every table's rows, in the order sent; nothing is held after."""
        import pyarrow as pa

        for table in list(self.rows):
            self._seal(table)
        out = {}
        for table, parts in self.batches.items():
            tables = [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in parts]
            out[table] = pa.concat_tables(tables, promote_options="permissive")
        self.batches.clear()
        return out


class _Holding(TableProducer):
    """A table producer holding what is sent until it writes it."""

    def __init__(self) -> None:
        self._held = _Rows()

    def send_rows(self, stream: str, rows: Sequence[Mapping[str, object]]) -> None:
        self._held.add_rows(stream, rows)

    def send_batch(self, stream: str, batch: pa.RecordBatch) -> None:
        self._held.add_batch(stream, batch)


class TableRowsProducer(_Holding):
    """At-least-once: each :meth:`flush` writes what was sent, a table commit per table."""

    def __init__(self, tables: Tables) -> None:
        super().__init__()
        self._tables = tables

    def flush(self) -> None:
        for table, data in self._held.take().items():
            self._tables.write(table, data)

    def close(self) -> None:
        self.flush()
        self._tables.writer.close()


class TableStagingProducer(_Holding, StagingProducer):
    """Exactly-once: holds one task attempt's batch output; :meth:`stage` writes each table's
    rows as a staged part file (durable), which its commit's publish writes to the table."""

    def __init__(self, staging: TableStaging, owner: str, part: str) -> None:
        super().__init__()
        self._staging = staging
        self._owner = owner
        self._part = part

    def flush(self) -> None:
        """Nothing to do: a part is written whole, durable, by :meth:`stage`."""

    def stage(self) -> dict[tuple[str, int], str]:
        staged = {}
        for table, data in self._held.take().items():
            if len(data):
                self._staging.write_part(table, self._owner, self._part, data)
                staged[(table, 0)] = self._part
        return staged

    def close(self) -> None:
        self._held = _Rows()  # what was not staged is dropped: no commit names it


#: bytes of staged rows a process keeps in memory for their publish by the same process (all
#: its table systems together, counted by the Arrow buffers they hold)
HELD_BYTES = 32 << 20


class _HeldParts:
    """The staged parts this process wrote last, up to :data:`HELD_BYTES` in all, the oldest
    dropped first (a part published by another process is never taken here: it ages out)."""

    def __init__(self) -> None:
        self.parts: OrderedDict[Path, tuple[tuple[int, int, int], pa.Table, int]] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def hold(self, path: Path, stamp: tuple[int, int, int], data: pa.Table) -> None:
        size = data.get_total_buffer_size()  # (a slice keeps its parent's buffers alive)
        with self.lock:
            self._drop(path)
            if size > HELD_BYTES:
                return
            self.parts[path] = (stamp, data, size)
            self.bytes += size
            while self.bytes > HELD_BYTES:
                self._drop(next(iter(self.parts)))

    def take(self, path: Path) -> tuple[tuple[int, int, int], pa.Table] | None:
        """The rows held for ``path`` and the stamp of the file they were written to; held
        no longer."""
        with self.lock:
            held = self._drop(path)
        return None if held is None else (held[0], held[1])

    def _drop(self, path: Path) -> tuple[tuple[int, int, int], pa.Table, int] | None:
        held = self.parts.pop(path, None)
        if held is not None:
            self.bytes -= held[2]
        return held


_HELD = worker.slot("held-table-parts", _HeldParts)


class TableStaging(OutputStaging):
    """Staged parts as Arrow IPC files: ``<root>/<table>/<owner>/<part>.arrow``. The parts this
    process staged last are also kept in memory (:class:`_HeldParts`): a task publishes its
    own parts after its checkpoint, and need not read them back while the file is the one it
    wrote (same inode, size and time)."""

    def __init__(self, root: Path, tables: Tables) -> None:
        self.root = root
        self.tables = tables

    def _path(self, table: str, owner: str, part: str) -> Path:
        return self.root / table / owner / f"{part}{PART}"

    def write_part(self, table: str, owner: str, part: str, data: pa.Table) -> None:
        import pyarrow as pa

        path = self._path(table, owner, part)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as f:
            with pa.ipc.new_file(f, data.schema) as writer:
                writer.write_table(data)
            f.flush()
            os.fsync(f.fileno())
            stamp = _stamp(os.fstat(f.fileno()))
        os.replace(tmp, path)
        fsync_dir(path.parent)
        _HELD.hold(path, stamp, data)

    def _read(self, table: str, owner: str, part: str) -> pa.Table:
        import pyarrow as pa

        path = self._path(table, owner, part)
        held = _HELD.take(path)
        if held is not None and _stamp(path.stat()) == held[0]:
            return held[1]
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()

    def _read_commit(self, table: str, commit: Commit, parts: Sequence[str]) -> pa.Table | None:
        """The rows of a commit's parts, together; ``None`` when a part is gone because the
        commit is in the table (its parts are deleted after it)."""
        import pyarrow as pa

        data = []
        for part in parts:
            try:
                data.append(self._read(table, commit.owner, part))
            except FileNotFoundError:
                self.tables.writer.refresh(table)
                if self.tables.writer.published(table, commit):
                    return None
                raise UserError(
                    f"table {self.tables.system}.{table}: staged part {part} of {commit.owner} "
                    f"is missing from {self._path(table, commit.owner, part).parent}, and its "
                    "commit has not reached the table: its rows are lost; restore the staging "
                    "directory, or reset the job"
                ) from None
        return pa.concat_tables(data, promote_options="permissive")

    def producer(self, owner: str, part: str) -> TableStagingProducer:
        return TableStagingProducer(self, owner, part)

    def publish(
        self,
        stream: str,
        partition: int,
        owner: str,
        key: int,
        parts: Sequence[str],
        failpoints: Mapping[str, str] | None = None,
    ) -> int:
        if not parts:
            return 0
        commit = Commit(owner, key)
        written = 0
        table = self._read_commit(stream, commit, parts)
        if table is not None:  # (its write writes nothing if the table holds it already)
            maybe_crash(failpoints or {}, "publish-after-intent")
            written = self.tables.write(stream, table, commit)
            maybe_crash(failpoints or {}, "publish-after-append")
        for part in parts:
            _HELD.take(path := self._path(stream, owner, part))
            path.unlink(missing_ok=True)
        return written

    def streams(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def _owners(self, stream: str) -> list[Path]:
        root = self.root / stream
        return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def staged(self, stream: str) -> list[StagedPart]:
        import pyarrow as pa

        out = []
        for owner in self._owners(stream):
            for f in sorted(owner.glob(f"*{PART}")):
                if f.name.startswith("."):
                    continue
                try:
                    with pa.memory_map(str(f)) as source:
                        rows = pa.ipc.open_file(source).read_all().num_rows
                except FileNotFoundError:
                    continue  # published since it was listed
                out.append(StagedPart(stream, 0, owner.name, f.name[: -len(PART)], rows))
        return out

    def read_part(self, stream: str, partition: int, owner: str, part: str) -> list[Record]:
        """The part's rows, each as a record whose value is the row as JSON."""
        try:
            rows = self._read(stream, owner, part).to_pylist()
        except FileNotFoundError:
            return []  # published (and deleted) since it was listed
        return [
            Record("", None, json.dumps(r, default=str).encode(), 0) for r in rows
        ]  # for tools that show what waits

    def publishers(self, stream: str, partition: int) -> list[str]:
        return self.tables.writer.owners(stream)

    def sweep(self, stream: str, owner_prefix: str, keep: Collection[str] = ()) -> Counter[str]:
        swept: Counter[str] = Counter()
        for owner in self._owners(stream):
            if not swept_by(owner.name, owner_prefix):
                continue
            for f in owner.iterdir():
                if f.name.endswith(PART) and not f.name.startswith("."):
                    if f.name[: -len(PART)] in keep:
                        continue
                    swept[owner.name] += 1
                _HELD.take(f)
                f.unlink(missing_ok=True)
        return swept


class TableAdmin(SystemAdmin):
    """A table system's admin: its streams are its tables, one partition each, no offsets."""

    def __init__(self, system: str, tables: Tables, staging_root: Path) -> None:
        self.system = system
        self.tables = tables
        self._staging = TableStaging(staging_root, tables)

    def create_stream(self, spec: StreamSpec) -> bool:
        """Nothing to create yet: a table is created from its first batch's columns."""
        return spec.name not in self.list_streams()

    def list_streams(self) -> list[str]:
        return self.tables.writer.tables()

    def partition_count(self, stream: str) -> int:
        return 1

    def get_metadata(
        self, ssps: Iterable[SystemStreamPartition]
    ) -> dict[SystemStreamPartition, PartitionMetadata]:
        raise _output_only(self.system)

    def offset_comparator(self, a: str, b: str) -> int:
        raise _output_only(self.system)

    def offset_after(self, ssp: SystemStreamPartition, offset: str) -> str:
        raise _output_only(self.system)

    def offset_for_timestamp(self, ssp: SystemStreamPartition, timestamp_ms: int) -> str:
        raise _output_only(self.system)

    def output_staging(self) -> TableStaging:
        return self._staging

    def close(self) -> None:
        self.tables.writer.close()


#: the keys every table system reads (each kind adds its own)
TABLE_SYSTEM_KEYS = (
    ConfigKey(
        "systems.<s>.staging.path",
        None,
        "a directory path",
        "tables: where exactly-once output waits for its checkpoint (default "
        "<job.data.dir>/staging/<s>; every worker must see the same directory)",
    ),
    ConfigKey(
        "systems.<s>.write.attempts",
        "5",
        "an integer >= 1",
        "tables: tries of a table write that failed for a reason a retry can get past (a "
        "commit conflict, a lost connection), with a doubling pause; then the batch fails "
        "with one line naming the table",
    ),
)


class TableSystemFactory(SystemFactory):
    """A factory of one kind of table system: :meth:`writer` is the kind's."""

    config_keys: tuple[ConfigKey, ...] = TABLE_SYSTEM_KEYS

    @abstractmethod
    def writer(self, system: str, config: Mapping[str, str]) -> TableWriter:
        """This kind's tables for ``system``."""

    def tables(self, system: str, config: Mapping[str, str]) -> Tables:
        attempts = config.get(f"systems.{system}.write.attempts") or "5"
        try:
            n = int(attempts)
        except ValueError:
            n = 0
        if n < 1:
            raise UserError(f"systems.{system}.write.attempts={attempts!r}: expected >= 1")
        return Tables(system, config, self.writer(system, config), n)

    def get_admin(self, system: str, config: Mapping[str, str]) -> TableAdmin:
        return TableAdmin(system, self.tables(system, config), staging_root(system, config))

    def get_consumer(self, system: str, config: Mapping[str, str]) -> SystemConsumer:
        raise _output_only(system)

    def get_producer(self, system: str, config: Mapping[str, str]) -> SystemProducer:
        return TableRowsProducer(self.tables(system, config))


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    """What tells a staged file from another written at the same path."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def data_dir(config: Mapping[str, str]) -> Path:
    """``job.data.dir`` (a loaded config always has it: the job's directory by default)."""
    value = config.get("job.data.dir")
    if not value:
        raise UserError("job.data.dir is not set: a table system keeps its defaults under it")
    return Path(value)


def staging_root(system: str, config: Mapping[str, str]) -> Path:
    value = config.get(f"systems.{system}.staging.path")
    return Path(value) if value else data_dir(config) / "staging" / system
