"""What a Python process keeps between batches, in one place, with its rules.

A Spark Python worker lives for many batches, and so does the driver's process (it restores
ahead and runs the last pass; tests run many jobs in one). Everything sparkpoint keeps across
batches in a process is a slot here, declared in :data:`SLOTS` with the module that owns it,
what it holds and when its contents are reused or dropped. A module takes its slot once, at
import (:func:`slot`); nothing else in the product keeps state between batches in module
globals. Imports nothing of sparkpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Slot:
    name: str
    owner: str  # the module that takes the slot
    holds: str
    rule: str  # when what it holds is reused, and when it is dropped


SLOTS: dict[str, Slot] = {
    s.name: s
    for s in (
        Slot(
            "configs",
            "sparkpoint.runtime.executor.task_batch",
            "the Config and Systems (clients) of the last few job configs this process ran",
            "reused by every batch of the same config; the oldest is closed when a fifth comes",
        ),
        Slot(
            "memory-stores",
            "sparkpoint.storage.task_storage",
            "in-memory stores, each tagged with the state id it holds",
            "taken by the task's next batch in this process when that state id is the one "
            "expected; dropped when the task restores",
        ),
        Slot(
            "held-engines",
            "sparkpoint.storage.task_storage",
            "persistent engines a phase of a DataFrame batch closed, for its next phase",
            "only inside held_engines(): taken by the next phase, closed when the block ends",
        ),
        Slot(
            "commit-pool",
            "sparkpoint.storage.commit",
            "the thread pool that runs commits' uploads (min(tasks, 64) threads)",
            "made on first use; replaced by a larger one when a caller needs more threads",
        ),
        Slot(
            "active-uploads",
            "sparkpoint.storage.commit",
            "the uploads running in this process, by (task, checkpoint id)",
            "added when an upload starts, removed when it ends, whatever its outcome",
        ),
        Slot(
            "checkpoint-ids",
            "sparkpoint.checkpoint.id",
            "the greatest checkpoint id this process made",
            "every new id is greater; kept for the life of the process",
        ),
        Slot(
            "frozen-imports",
            "sparkpoint.runtime.executor.worker_heap",
            "whether this Spark worker froze what it had imported (gc.freeze)",
            "set once, by the first task or step that runs; kept for the life of the process",
        ),
        Slot(
            "clock",
            "sparkpoint.model.clock",
            "the source of processing time: a test's (use_clock), or in a Spark worker the "
            "batch plan's (the test kit's fixed time, or the driver's wall clock as an offset "
            "from this host's); else the wall clock",
            "set and reset by use_clock() around a block; in a Spark worker set by follow() "
            "for each plan, and never below what this process read on the driver's time",
        ),
        Slot(
            "ttl-sweeps",
            "sparkpoint.storage.task_storage",
            "when each TTL store of each task was last swept of expired entries",
            "a store is swept at a due commit once a quarter of its TTL has passed since; a "
            "new worker sweeps at its first due commit",
        ),
        Slot(
            "job-modules",
            "sparkpoint.runtime.executor.job_modules",
            "the version of the job's own modules this process last loaded, per job directory",
            "set by each run's first load of the job's code; a new version makes the process "
            "forget the modules it imported (the next import reads the edited files)",
        ),
        Slot(
            "python-checked",
            "sparkpoint.runtime.driver.callers_session",
            "the (Spark application, worker Python) pairs whose workers imported sparkpoint",
            "added by the first run on a session the caller started; kept for the process",
        ),
        Slot(
            "held-table-parts",
            "sparkpoint.system.tables.system",
            "the Arrow rows of the table parts this process staged last (up to 32 MiB)",
            "taken by the publish of the same part in this process while its file is the one "
            "written; the oldest dropped first, so a part published elsewhere ages out",
        ),
        Slot(
            "kafka-clients",
            "sparkpoint.system.kafka.system",
            "idle Kafka consumers, producers and admins, by their settings",
            "given back after each use and taken by the next with the same settings; closed "
            "by close_idle_clients()",
        ),
    )
}

_lock = threading.Lock()
_taken: dict[str, Any] = {}


def slot(name: str, make: Callable[[], T]) -> T:
    """The object kept in slot ``name``, made with ``make()`` the first time. A name not
    declared in :data:`SLOTS` is a :class:`KeyError`: every kept thing has its rule written."""
    if name not in SLOTS:
        raise KeyError(f"worker slot {name!r} is not declared in sparkpoint.worker.SLOTS")
    with _lock:
        if name not in _taken:
            _taken[name] = make()
        kept: T = _taken[name]
        return kept


def taken() -> dict[str, Any]:
    """The slots this process has taken so far, by name."""
    with _lock:
        return dict(_taken)
