"""The dead-letter stream's tools (``task.dlq.stream``, :mod:`sparkpoint.system.dead_letters`):
list the dead letters (``sparkpoint dlq show``), and write chosen ones back to their source
stream, or another, once (``sparkpoint dlq replay``).

A replay records each letter it wrote back in the job's coordinator stream (namespace
``dlq-replayed``, key ``<partition>:<offset>`` of the letter), after the records are flushed:
a later replay skips those. A replay stopped between its flush and that record may write the
same letters again when run again (at least once).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.model import SystemStream
from sparkpoint.system.base import Record
from sparkpoint.system.dead_letters import dead_letter_stream, original
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import read_json_lines

NAMESPACE = "dlq-replayed"
#: what --where may filter on, and where each is in a letter
FILTERS = ("reason", "stream", "partition", "error", "task")


@dataclass(frozen=True)
class DeadLetter:
    """One letter of the stream: where it is, and what it says."""

    partition: int
    offset: str
    letter: dict[str, Any]

    @property
    def position(self) -> str:
        return f"{self.partition}:{self.offset}"

    def field(self, name: str) -> str:
        source, error = self.letter.get("source", {}), self.letter.get("error", {})
        values = {
            "reason": self.letter.get("reason"),
            "stream": source.get("stream"),
            "partition": source.get("partition"),
            "error": error.get("class"),
            "task": self.letter.get("task"),
        }
        return str(values[name])

    def row(self) -> dict[str, Any]:
        source, error = self.letter.get("source", {}), self.letter.get("error", {})
        return {
            "letter": self.position,
            "reason": self.letter.get("reason"),
            "source": f"{source.get('system')}.{source.get('stream')}.{source.get('partition')}",
            "offset": source.get("offset"),
            "error": f"{error.get('class')}: {error.get('message')}",
            "at": error.get("at"),
            "task": self.letter.get("task"),
            "checkpoint": self.letter.get("checkpoint"),
            "attempt": self.letter.get("attempt"),
        }


def require_stream(config: Config) -> SystemStream:
    stream = dead_letter_stream(config)
    if stream is None:
        raise UserError(
            f"job {config.job_label} has no dead-letter stream: set task.dlq.stream "
            "(system.stream) for its tasks to send what they cannot handle there"
        )
    return stream


def read_dead_letters(config: Config) -> list[DeadLetter]:
    """Every letter of the job's dead-letter stream, partition by partition."""
    stream = require_stream(config)
    systems = Systems(config)
    if stream.stream not in systems.admin(stream.system).list_streams():
        return []
    return [
        DeadLetter(int(row["partition"]), str(row["offset"]), row["value"])
        for row in read_json_lines(config, systems, stream)
    ]


def parse_where(where: list[str]) -> dict[str, str]:
    """``--where reason=decode`` filters, checked."""
    out = {}
    for item in where:
        name, sep, value = item.partition("=")
        if not sep or name not in FILTERS:
            raise UserError(
                f"--where {item!r}: use NAME=VALUE with NAME one of {', '.join(FILTERS)}"
            )
        out[name] = value
    return out


def chosen(letters: list[DeadLetter], where: Mapping[str, str]) -> list[DeadLetter]:
    return [d for d in letters if all(d.field(k) == v for k, v in where.items())]


@dataclass
class ReplayReport:
    written: dict[str, int]  # per target stream
    skipped: int  # replayed before
    letters: list[str]  # positions written


def replay(
    config: Config,
    *,
    to: str | None = None,
    where: Mapping[str, str] | None = None,
    dry_run: bool = False,
) -> ReplayReport:
    """Write the chosen letters' records (their key and value as they were) back to their
    source stream's partition, or to ``to`` (``system.stream``, placed by key), once."""
    systems = Systems(config)
    store = CoordinatorStreamStore(config, systems, source="dlq-replay")
    try:
        done = store.all(NAMESPACE)
        letters = chosen(read_dead_letters(config), where or {})
        todo = [d for d in letters if d.position not in done]
        report = ReplayReport({}, len(letters) - len(todo), [d.position for d in todo])
        target = SystemStream.parse(to) if to else None
        sends = [_send_of(systems, d, target) for d in todo]
        for stream, _, _, _ in sends:
            report.written[str(stream)] = report.written.get(str(stream), 0) + 1
        if dry_run or not todo:
            return report
        producers: dict[str, Any] = {}
        for stream, partition, key, value in sends:
            producer = producers.setdefault(stream.system, systems.producer(stream.system))
            producer.send(stream.stream, partition, Record("", key, value, int(time.time() * 1000)))
        for producer in producers.values():
            producer.flush()
        stamp = str(int(time.time() * 1000))
        store.put_all(NAMESPACE, {d.position: stamp for d in todo})
        store.flush()
        return report
    finally:
        store.close()


def _send_of(
    systems: Systems, letter: DeadLetter, target: SystemStream | None
) -> tuple[SystemStream, int, bytes | None, bytes | None]:
    key, value = original(letter.letter)
    source = letter.letter["source"]
    if target is None:
        stream = SystemStream(source["system"], source["stream"])
        return stream, int(source["partition"]), key, value
    admin = systems.admin(target.system)
    if target.stream not in admin.list_streams():
        raise UserError(
            f"--to {target}: no such stream (create it first: sparkpoint stream create)"
        )
    partitions = admin.partition_count(target.stream)
    return target, admin.partition_for_key(key, partitions), key, value
