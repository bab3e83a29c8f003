"""The checkpoint stream: one compacted, single-partition stream per job, written by the driver.

Each message's key is JSON ``{"taskName": ..., "type": "checkpoint-v2"}`` and its value the
checkpoint's JSON. The last message per key wins. Readers skip message types they do not know,
so newer writers never break older readers. A message that cannot be parsed is an error naming
the stream, offset and task, never silently skipped: a lost checkpoint would rewind a task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.config import Config
from sparkpoint.errors import CheckpointError
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

TYPE_V2 = "checkpoint-v2"


def checkpoint_stream_name(config: Config) -> str:
    return f"__checkpoint-{config.job_name}-{config.job_id}"


class CheckpointManager:
    """Writes and reads task checkpoints on the job's checkpoint stream. Not thread-safe."""

    def __init__(self, config: Config, systems: Systems | None = None) -> None:
        self._config = config
        self._systems = systems or Systems(config)
        self._system = config.checkpoint_system
        self.stream = checkpoint_stream_name(config)
        self._ssp = SystemStreamPartition(self._system, self.stream, 0)
        self._admin = self._systems.admin(self._system)
        self._producer = None
        self._read_upto: str | None = None  # next offset to read
        self._latest: dict[TaskName, CheckpointV2] = {}

    def create_resources(self) -> None:
        """Create the checkpoint stream if absent. Idempotent."""
        self._admin.create_stream(StreamSpec(self.stream, 1, compacted=True))

    def write_checkpoint(self, task: TaskName, checkpoint: CheckpointV2) -> None:
        """Append the checkpoint and flush: durable when this returns."""
        if self._producer is None:
            self._producer = self._systems.producer(self._system)  # type: ignore[assignment]
        key = json.dumps({"taskName": task.name, "type": TYPE_V2}, sort_keys=True).encode()
        assert self._producer is not None
        self._producer.send(self.stream, 0, Record("", key, checkpoint.dumps().encode(), 0))
        self._producer.flush()
        self._latest[task] = checkpoint

    def read_all(self) -> Mapping[TaskName, CheckpointV2]:
        """The last checkpoint of every task, reading what was appended since the last call."""
        if self.stream not in self._admin.list_streams():
            return dict(self._latest)
        meta = self._admin.get_metadata([self._ssp])[self._ssp]
        start = self._read_upto or meta.oldest
        if self._admin.offset_comparator(start, meta.upcoming) < 0:
            consumer = self._systems.consumer(self._system)
            try:
                for rec in consumer.read(self._ssp, start, meta.upcoming):
                    self._apply(rec)
            finally:
                consumer.close()
        self._read_upto = meta.upcoming
        return dict(self._latest)

    def read_last_checkpoint(self, task: TaskName) -> CheckpointV2 | None:
        return self.read_all().get(task)

    def _apply(self, rec: Record) -> None:
        where = f"checkpoint stream {self._ssp} offset {rec.offset}"
        try:
            key = json.loads(rec.key or b"null")
            task = TaskName(str(key["taskName"]))
            kind = str(key["type"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{where}: unreadable key {rec.key!r}: {exc}") from exc
        if kind != TYPE_V2:
            log.debug("%s: skipping message of type %s for %s", where, kind, task)
            return
        if rec.value is None:
            self._latest.pop(task, None)
            return
        try:
            self._latest[task] = CheckpointV2.loads(rec.value)
        except CheckpointError as exc:
            raise CheckpointError(f"{where}: task {task}: {exc}") from exc

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
