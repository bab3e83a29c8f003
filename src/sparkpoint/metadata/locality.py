"""Where tasks run and ran: host affinity's records in the metadata store.

Samza keeps container locality in the coordinator stream; sparkpoint uses its namespaces for
the assignment, with a Spark executor in the role of a container:

* ``set-task-container-assignment``: task -> executor id;
* ``set-container-host-assignment``: executor id -> host;
* ``task-locality`` (sparkpoint's own): task -> JSON of where it last committed, which
  checkpoint, and its stores' size on disk then;
* ``task-standbys`` (sparkpoint's own): task -> JSON list of its standby copies as the running
  driver last saw them (executor, host, the checkpoint each reached, changelog records behind);
  the next driver keeps those at their tasks' checkpoints.

The assignment rules live in :mod:`sparkpoint.runtime.driver.placement`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkpoint.metadata.base import MetadataStore

TASK_EXECUTOR = "set-task-container-assignment"
EXECUTOR_HOST = "set-container-host-assignment"
TASK_LOCALITY = "task-locality"
TASK_STANDBYS = "task-standbys"


@dataclass(frozen=True, order=True)
class Executor:
    """A Spark executor: its id and host."""

    id: str
    host: str

    @property
    def location(self) -> str:
        """Spark's preferred-location string for this executor (``ExecutorCacheTaskLocation``)."""
        return f"executor_{self.host}_{self.id}"

    def __str__(self) -> str:
        return f"executor {self.id} on {self.host}"


def stored_assignment(store: MetadataStore, tasks: Iterable[str]) -> dict[str, Executor]:
    """The stored executor of each of ``tasks`` that has one (with a known host)."""
    by_task: Mapping[str, str] = store.all(TASK_EXECUTOR)
    hosts: Mapping[str, str] = store.all(EXECUTOR_HOST)
    return {
        t: Executor(by_task[t], hosts[by_task[t]])
        for t in tasks
        if t in by_task and by_task[t] in hosts
    }


def store_assignment(store: MetadataStore, assignment: Mapping[str, Executor]) -> None:
    """Record ``assignment`` (task -> executor) and those executors' hosts."""
    if not assignment:
        return
    store.put_all(TASK_EXECUTOR, {t: e.id for t, e in assignment.items()})
    store.put_all(EXECUTOR_HOST, {e.id: e.host for e in assignment.values()})
    store.flush()


def store_task_locality(store: MetadataStore, records: Mapping[str, Mapping[str, Any]]) -> None:
    """Record where each task last committed (``task -> record``), in one write."""
    encoded = {task: json.dumps(dict(r), sort_keys=True) for task, r in records.items()}
    store.put_all(TASK_LOCALITY, encoded)


def _json_records(store: MetadataStore, namespace: str, kind: type[Any]) -> dict[str, Any]:
    """Each key's JSON value in ``namespace`` that parses to a ``kind`` (others are skipped)."""
    out = {}
    for key, text in store.all(namespace).items():
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if isinstance(data, kind):
            out[key] = data
    return out


def task_locality(store: MetadataStore) -> dict[str, dict[str, Any]]:
    """Each task's ``task-locality`` record (where it last committed)."""
    return _json_records(store, TASK_LOCALITY, dict)


def store_task_standbys(store: MetadataStore, copies: Mapping[str, list[dict[str, Any]]]) -> None:
    """Record each task's standby copies (only those that changed since the last record)."""
    old = store.all(TASK_STANDBYS)
    texts = {t: json.dumps(c, sort_keys=True) for t, c in copies.items()}
    changed: dict[str, str | None] = {t: v for t, v in texts.items() if old.get(t) != v}
    if changed:
        store.put_all(TASK_STANDBYS, changed)
        store.flush()


def task_standbys(store: MetadataStore) -> dict[str, list[dict[str, Any]]]:
    """Each task's standby copies as the last run recorded them."""
    return _json_records(store, TASK_STANDBYS, list)
