"""The job model: systems, streams, partitions (SSPs), tasks and the grouping of SSPs into tasks;
:mod:`sparkpoint.model.startpoint` holds the startpoint values (what a system resolves to an
offset, what the startpoint manager stores). The model layer imports only ``errors``.

All values are immutable. ``TaskName`` strings follow Samza: ``Partition <n>``. Offsets are opaque
strings; only a system's admin compares them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sparkpoint.errors import ConfigError


class SystemStream(NamedTuple):
    """A stream within a system, e.g. ``filelog.pageviews``. A named tuple: tasks make one per
    message they send, and the output looks each up, so it is built and hashed in C."""

    system: str
    stream: str

    def __str__(self) -> str:
        return f"{self.system}.{self.stream}"

    @classmethod
    def parse(cls, text: str) -> SystemStream:
        """Parse ``system.stream``; the stream name may itself contain dots."""
        system, sep, stream = text.strip().partition(".")
        if not sep or not system or not stream:
            raise ConfigError(f"invalid system stream {text!r}: expected 'system.stream'")
        return cls(system, stream)


@dataclass(frozen=True, order=True)
class SystemStreamPartition:
    """One partition of a stream: the unit of ordering and of offsets."""

    system: str
    stream: str
    partition: int

    @property
    def system_stream(self) -> SystemStream:
        return SystemStream(self.system, self.stream)

    def __str__(self) -> str:
        return f"{self.system}.{self.stream}.{self.partition}"

    @classmethod
    def parse(cls, text: str) -> SystemStreamPartition:
        """Parse ``system.stream.partition`` (the form used as checkpoint keys)."""
        head, sep, part = text.strip().rpartition(".")
        if not sep or not part.isdigit():
            raise ValueError(f"invalid SSP {text!r}: expected 'system.stream.partition'")
        ss = SystemStream.parse(head)
        return cls(ss.system, ss.stream, int(part))

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "stream": self.stream, "partition": self.partition}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SystemStreamPartition:
        return cls(str(data["system"]), str(data["stream"]), int(data["partition"]))


SSP = SystemStreamPartition


@dataclass(frozen=True, order=True)
class TaskName:
    """The name of a task, stable across restarts (it keys checkpoints and state)."""

    name: str

    def __str__(self) -> str:
        return self.name

    @classmethod
    def for_partition(cls, partition: int) -> TaskName:
        return cls(f"Partition {partition}")


@dataclass(frozen=True)
class TaskModel:
    """A task: its name, the SSPs it consumes and its changelog partition."""

    name: TaskName
    ssps: frozenset[SystemStreamPartition]
    changelog_partition: int

    def sorted_ssps(self) -> list[SystemStreamPartition]:
        return sorted(self.ssps)

    def to_json(self) -> dict[str, Any]:
        return {
            "task-name": self.name.name,
            "system-stream-partitions": [s.to_json() for s in self.sorted_ssps()],
            "changelog-partition": self.changelog_partition,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskModel:
        return cls(
            TaskName(str(data["task-name"])),
            frozenset(SystemStreamPartition.from_json(s) for s in data["system-stream-partitions"]),
            int(data["changelog-partition"]),
        )


@dataclass(frozen=True)
class JobModel:
    """Every task of the job, keyed by name. Serialises to JSON and back unchanged."""

    job_name: str
    job_id: str
    tasks: Mapping[TaskName, TaskModel] = field(default_factory=dict)

    def task(self, name: TaskName | str) -> TaskModel:
        key = name if isinstance(name, TaskName) else TaskName(name)
        try:
            return self.tasks[key]
        except KeyError:
            known = ", ".join(sorted(t.name for t in self.tasks)) or "none"
            raise LookupError(f"task {key} is not in job {self.job_name}; tasks: {known}") from None

    def sorted_tasks(self) -> list[TaskModel]:
        return sorted(self.tasks.values(), key=lambda t: t.changelog_partition)

    def to_json(self) -> dict[str, Any]:
        return {
            "job-name": self.job_name,
            "job-id": self.job_id,
            "tasks": [t.to_json() for t in self.sorted_tasks()],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobModel:
        tasks = [TaskModel.from_json(t) for t in data["tasks"]]
        return cls(str(data["job-name"]), str(data["job-id"]), {t.name: t for t in tasks})

    @classmethod
    def loads(cls, text: str) -> JobModel:
        return cls.from_json(json.loads(text))


def group_by_partition(
    job_name: str,
    job_id: str,
    ssps: Iterable[SystemStreamPartition],
    broadcast: Iterable[SystemStreamPartition] = (),
) -> JobModel:
    """One task per partition number across all input streams (Samza's GroupByPartition).

    Task ``Partition n`` consumes partition ``n`` of every input stream that has one; its
    changelog partition is ``n``. Every task also consumes every ``broadcast`` SSP.
    """
    shared = frozenset(broadcast)
    by_partition: dict[int, set[SystemStreamPartition]] = {}
    for ssp in ssps:
        if ssp not in shared:
            by_partition.setdefault(ssp.partition, set()).add(ssp)
    tasks = {
        TaskName.for_partition(p): TaskModel(
            TaskName.for_partition(p), frozenset(members) | shared, p
        )
        for p, members in sorted(by_partition.items())
    }
    return JobModel(job_name, job_id, tasks)
