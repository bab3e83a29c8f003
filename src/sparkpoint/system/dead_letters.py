"""The dead-letter stream (``task.dlq.stream``): an input record a task cannot decode, or
whose ``process`` raises (``task.dlq.on``), goes there instead of stopping the task.

A dead letter's key is the record's key, byte for byte (so it lands in the partition its
key chooses); its value is a JSON object holding the record's value exactly (base64) and what
a person needs to fix it: the source stream, partition, offset and timestamp, the error's
class, message and the file:line that raised it, the checkpoint the task restarted from, the
attempt and the reason. It is sent through the task's collector like any output, so under
exactly-once it is staged and published once with the checkpoint that covers the record.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from sparkpoint.config import Config
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.refs import raised_at
from sparkpoint.system.base import Record

DECODE, PROCESS = "decode", "process"


def dead_letter_stream(config: Config) -> SystemStream | None:
    """``task.dlq.stream``, parsed (None without one)."""
    value = config.get_str("task.dlq.stream")
    return SystemStream.parse(value) if value else None


@dataclass(frozen=True)
class DeadLetters:
    """Where a task sends what it cannot handle, and for which reasons."""

    stream: SystemStream | None
    reasons: frozenset[str]

    @classmethod
    def from_config(cls, config: Config) -> DeadLetters:
        on = config.get_str("task.dlq.on") or DECODE
        reasons = frozenset({DECODE, PROCESS} if on == "both" else {on})
        return cls(dead_letter_stream(config), reasons)

    def takes(self, reason: str) -> bool:
        return self.stream is not None and reason in self.reasons

    @staticmethod
    def letter(
        task: str,
        ssp: SystemStreamPartition,
        record: Record,
        error: BaseException,
        *,
        reason: str,
        checkpoint: str | None,
        attempt: int,
    ) -> dict[str, Any]:
        """The dead letter's value (see the module docstring)."""
        cause = error.__cause__ if reason == DECODE and error.__cause__ is not None else error
        return {
            "reason": reason,
            "task": task,
            "source": {
                "system": ssp.system,
                "stream": ssp.stream,
                "partition": ssp.partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
            },
            "key": None if record.key is None else base64.b64encode(record.key).decode("ascii"),
            "value": (
                None if record.value is None else base64.b64encode(record.value).decode("ascii")
            ),
            "error": {
                "class": f"{type(cause).__module__}.{type(cause).__qualname__}",
                "message": str(cause),
                "at": raised_at(cause).strip().removeprefix("(at ").removesuffix(")"),
            },
            "checkpoint": checkpoint,
            "attempt": attempt,
        }


def original(letter: dict[str, Any]) -> tuple[bytes | None, bytes | None]:
    """A dead letter's record key and value, as they were."""
    key, value = letter.get("key"), letter.get("value")
    return (
        None if key is None else base64.b64decode(key),
        None if value is None else base64.b64decode(value),
    )
