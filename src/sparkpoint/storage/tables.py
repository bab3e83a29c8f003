"""Tables: stores filled from compacted streams (Samza's side inputs, Kafka Streams' KTable).

A store with ``stores.<s>.side.inputs`` is a *table*: each record of those streams is put into
the store under its key (a null value deletes the key). The table streams are read by the
task like its inputs (a task reads the table's partition of the same number, so a table is
partitioned as the inputs are), before any input record of the batch, and their offsets are
checkpointed with the store: a restore brings the table back to the checkpoint and reading
goes on from there, so table and offsets always agree, whatever crashed. With
``stores.<s>.side.inputs.bootstrap`` (the default) the task's input records wait until the
table is read up to where its streams stood when the batch was planned, so the first input
record already sees a complete table.

A table's stream must be compacted (a stream that deletes records by age would lose keys the
table needs at a restore from scratch) and have as many partitions as the job has tasks;
:func:`check_tables` refuses one that is not, naming the fix.

May import config, model, serde, system and the store interfaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, MessageDecodeError
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.serde import Serde
from sparkpoint.storage.backend import store_backends
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems


@dataclass(frozen=True)
class Tables:
    """A job's tables: which stream fills which store, and which stores bootstrap."""

    streams: dict[SystemStream, str]
    bootstrap: frozenset[str]

    @classmethod
    def of(cls, config: Config) -> Tables:
        streams = config.side_inputs
        boot = {
            s for s in set(streams.values()) if config.get_bool(f"stores.{s}.side.inputs.bootstrap")
        }
        return cls(streams, frozenset(boot))

    def __bool__(self) -> bool:
        return bool(self.streams)

    def store_of(self, ssp: SystemStreamPartition) -> str | None:
        """The table ``ssp`` fills, or ``None`` for an input of the task."""
        return self.streams.get(ssp.system_stream)

    def main(self, ssps: frozenset[SystemStreamPartition]) -> frozenset[SystemStreamPartition]:
        """``ssps`` without the tables' streams: the task's inputs."""
        return frozenset(s for s in ssps if s.system_stream not in self.streams)


def apply_records(
    store: KeyValueStore[Any, Any],
    ssp: SystemStreamPartition,
    records: Sequence[Record],
    *,
    serdes: tuple[Serde[Any], Serde[Any]],
    task: object,
) -> None:
    """Put each record into the table ``store`` under its key (the newest record of a key in
    ``records`` wins; a null value deletes the key). A record without a key, or one the
    stream's serdes cannot decode, stops the task naming its offset: a table that silently
    skipped a record would answer with a stale value."""
    key_serde, msg_serde = serdes
    latest: dict[Any, Any] = {}
    for rec in records:
        if rec.key is None:
            raise MessageDecodeError(
                f"task {task}: table record at {ssp} offset {rec.offset} has no key; a table's "
                "stream holds one record per key (send it with a key)"
            )
        try:
            key = key_serde.from_bytes(rec.key)
            latest[key] = None if rec.value is None else msg_serde.from_bytes(rec.value)
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise MessageDecodeError(
                f"task {task}: cannot decode table record at {ssp} offset {rec.offset}: {exc}"
            ) from exc
    store.put_all([(k, v) for k, v in latest.items() if v is not None])
    store.delete_all([k for k, v in latest.items() if v is None])


def check_tables(config: Config, systems: Systems) -> None:
    """Refuse a table whose stream is not compacted or is partitioned unlike the job's tasks."""
    tables = Tables.of(config)
    main = [s for s in config.inputs if s not in tables.streams]
    tasks = max((systems.admin(s.system).partition_count(s.stream) for s in main), default=0)
    for stream, store in tables.streams.items():
        key = f"stores.{store}.side.inputs"
        if not store_backends(config, store, "backup"):
            raise ConfigError(
                f"stores.{store}: a table needs a changelog or a blob store backup "
                f"(stores.{store}.changelog or stores.{store}.backup.factories): its stream's "
                "offsets are checkpointed with it, so a table restored empty would miss every "
                "record before them"
            )
        admin = systems.admin(stream.system)
        compacted = admin.compacted(stream.stream)
        if not compacted:
            how = "cannot tell whether" if compacted is None else "is not compacted:"
            raise ConfigError(
                f"{key}: {stream} {how} a table's stream must keep the newest record of every "
                "key for ever (a stream that deletes records by age, as a changelog-style or "
                "event stream does, would lose keys at a restore); create it compacted "
                "(sparkpoint stream create --compacted, or Kafka cleanup.policy=compact)"
            )
        partitions = admin.partition_count(stream.stream)
        if main and partitions != tasks:
            raise ConfigError(
                f"{key}: {stream} has {partitions} partitions but the job has {tasks} tasks; "
                "a task joins its input partition with the table's partition of the same "
                "number, so the table's stream needs as many partitions as the inputs (and "
                "the same partitioning of keys)"
            )


__all__ = ["Tables", "apply_records", "check_tables"]
