"""The checkpoint stream: one compacted, single-partition stream per job, written by the driver.

Each message's key is Samza's JSON ``{"systemstreampartition-grouper-factory": ..., "taskName":
..., "type": ...}`` with type ``checkpoint`` (V1) or ``checkpoint-v2`` (V2) (keys without the
grouper factory, from earlier sparkpoint versions, are read too); the value is the checkpoint's
JSON, and the last message per task and type wins.

Writing: every commit is written in each version of ``task.checkpoint.write.versions`` (default
``1,2``), all in one durable append. Reading: ``task.checkpoint.read.versions`` (default
``2,1``, where Samza's is ``1``: V1 carries no blob-store markers) lists versions by priority;
the checkpoint of the first version present is used, unless one of a lower priority is more
than ``task.live.checkpoint.max.age`` ms newer (by checkpoint id). A read
always returns one whole message, so offsets and state markers always come from one commit.
Readers skip message types and versions they do not know; a message of a known type that cannot
be parsed is an error naming the stream, offset and task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV1, CheckpointV2
from sparkpoint.config import Config
from sparkpoint.errors import CheckpointError, ConfigError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.system.base import Record, SystemProducer
from sparkpoint.system.registry import Systems
from sparkpoint.system.retry import retry_transient
from sparkpoint.system.streams import create_or_validate, stream_spec

log = logging.getLogger(__name__)

TYPES: dict[int, str] = {1: "checkpoint", 2: "checkpoint-v2"}
#: what Samza writes in the key for its default grouper, which sparkpoint's grouping matches
GROUPER_FACTORY = "org.apache.samza.container.grouper.stream.GroupByPartitionFactory"
PARSERS: dict[int, type[CheckpointV1] | type[CheckpointV2]] = {1: CheckpointV1, 2: CheckpointV2}


def checkpoint_stream_name(config: Config) -> str:
    return f"__checkpoint-{config.job_name}-{config.job_id}"


def parse_versions(config: Config, key: str, default: str) -> list[int]:
    raw = config.get_str(key) or default
    try:
        versions = [int(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        versions = []
    if not versions or any(v not in TYPES for v in versions) or len(set(versions)) != len(versions):
        raise ConfigError(
            f"{key}={raw!r} is invalid; allowed: a list of distinct versions from 1, 2"
        )
    return versions


class CheckpointManager:
    """Writes and reads task checkpoints on the job's checkpoint stream. Not thread-safe."""

    def __init__(self, config: Config, systems: Systems | None = None) -> None:
        self._config = config
        self._systems = systems or Systems(config)
        self._system = config.checkpoint_system
        self.stream = checkpoint_stream_name(config)
        self._ssp = SystemStreamPartition(self._system, self.stream, 0)
        self._admin = self._systems.admin(self._system)
        self._producer: SystemProducer | None = None
        self._read_upto: str | None = None
        self._latest: dict[int, dict[TaskName, Checkpoint]] = {v: {} for v in TYPES}
        self.write_versions = parse_versions(config, "task.checkpoint.write.versions", "1,2")
        self.read_versions = parse_versions(config, "task.checkpoint.read.versions", "2,1")
        self.max_age_ms = config.get_int("task.live.checkpoint.max.age")

    def create_resources(self) -> None:
        """Create the checkpoint stream if absent, or check the one there. Idempotent."""
        spec = stream_spec(self._config, SystemStream(self._system, self.stream), 1, compacted=True)
        create_or_validate(self._admin, spec)

    def _key(self, task: TaskName, version: int) -> bytes:
        key = {
            "systemstreampartition-grouper-factory": GROUPER_FACTORY,
            "taskName": task.name,
            "type": TYPES[version],
        }
        return json.dumps(key, separators=(",", ":")).encode()

    def write_checkpoint(
        self,
        task: TaskName,
        checkpoint: CheckpointV2,
        *,
        changelog_offsets: Mapping[SystemStreamPartition, str] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        """Write ``checkpoint`` in every configured version, durably, in one append."""
        self.write_checkpoints([(task, checkpoint, changelog_offsets)], versions=versions)

    def write_checkpoints(
        self,
        checkpoints: Sequence[
            tuple[TaskName, CheckpointV2, Mapping[SystemStreamPartition, str] | None]
        ],
        *,
        versions: list[int] | None = None,
        after_each: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """Write each ``(task, checkpoint, changelog offsets)`` in every configured version,
        durably, in one append: a batch's commits cost one flush, however many tasks.
        ``after_each`` is called after each task's records are sent, with the flush (a
        failpoint there makes the checkpoints before it durable, and no later one)."""
        if self._producer is None:
            self._producer = self._systems.producer(self._system)
        written: list[tuple[TaskName, dict[int, Checkpoint]]] = []
        for task, checkpoint, changelog_offsets in checkpoints:
            forms: dict[int, Checkpoint] = {
                1: CheckpointV1.from_v2(checkpoint, changelog_offsets),
                2: checkpoint,
            }
            for version in versions or self.write_versions:
                form = forms[version]
                record = Record("", self._key(task, version), form.dumps().encode(), 0)
                self._producer.send(self.stream, 0, record)
            written.append((task, forms))
            if after_each is not None:
                after_each(self._flush)
        if not written:
            return
        self._flush(f"task {written[0][0]}'s checkpoint" if len(written) == 1 else "checkpoints")
        for task, forms in written:
            for version in versions or self.write_versions:
                self._latest[version][task] = forms[version]

    def _flush(self, what: str = "checkpoints") -> None:
        assert self._producer is not None
        retry_transient(f"writing {what} to {self._ssp}", self._producer.flush)

    def _refresh(self) -> None:
        retry_transient(f"reading {self._ssp}", self._read_new)

    def _read_new(self) -> None:
        if self.stream not in self._admin.list_streams():
            return
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

    def read_version(self, version: int) -> dict[TaskName, Checkpoint]:
        """The last checkpoint of every task in one version, whatever the read config."""
        self._refresh()
        return dict(self._latest[version])

    def read_all(self) -> dict[TaskName, Checkpoint]:
        """The checkpoint to use for every task, by the read versions and their priority."""
        self._refresh()
        tasks = {t for v in self.read_versions for t in self._latest[v]}
        return {t: c for t in tasks if (c := self._choose(t)) is not None}

    def read_last_checkpoint(self, task: TaskName) -> Checkpoint | None:
        self._refresh()
        return self._choose(task)

    def _choose(self, task: TaskName) -> Checkpoint | None:
        chosen: Checkpoint | None = None
        for version in self.read_versions:
            candidate = self._latest[version].get(task)
            if candidate is None:
                continue
            if chosen is None:
                chosen = candidate
                continue
            newer_by = candidate.checkpoint_id.millis - chosen.checkpoint_id.millis
            if newer_by > self.max_age_ms:
                log.warning(
                    "task %s: using the V%d checkpoint %s, %d ms newer than the preferred %s",
                    task,
                    version,
                    candidate.checkpoint_id,
                    newer_by,
                    chosen.checkpoint_id,
                )
                chosen = candidate
        return chosen

    def _apply(self, rec: Record) -> None:
        where = f"checkpoint stream {self._ssp} offset {rec.offset}"
        try:
            key = json.loads(rec.key or b"null")
            task = TaskName(str(key["taskName"]))
            kind = str(key["type"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{where}: unreadable key {rec.key!r}: {exc}") from exc
        version = next((v for v, t in TYPES.items() if t == kind), None)
        if version is None:
            log.debug("%s: skipping message of unknown type %s for %s", where, kind, task)
            return
        if rec.value is None:
            self._latest[version].pop(task, None)
            return
        try:
            data = json.loads(rec.value)
        except ValueError as exc:
            raise CheckpointError(f"{where}: task {task}: checkpoint is not JSON: {exc}") from exc
        if isinstance(data, dict) and data.get("version") not in (None, version):
            log.debug("%s: skipping %s message of version %s", where, kind, data.get("version"))
            return
        try:
            self._latest[version][task] = PARSERS[version].from_json(data)
        except CheckpointError as exc:
            raise CheckpointError(f"{where}: task {task}: {exc}") from exc

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
