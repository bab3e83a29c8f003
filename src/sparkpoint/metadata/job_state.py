"""What the coordinator keeps in the metadata store across restarts.

* ``set-config``: the job's config as last run. A new run compares its config with it, logs
  every added, changed and removed key, and stores the new one.
* ``set-changelog``: task -> changelog partition. Existing tasks keep their partition for ever,
  also when the number of tasks grows; a new task takes its own partition number when that is
  free, else the lowest free one.
* ``input-partitions``: input stream -> its partition count as the job last ran. A task is an
  input partition number, so a stateful job whose input gained (or lost) partitions would
  find its keys in other tasks than their state: it is refused at start
  (:func:`check_input_partitions`) instead of running with split state.
* ``liveness``: the running driver's heartbeat. Tools refuse to change checkpoints under it, a
  second driver refuses to start while it is fresh, and a running driver that finds another
  driver's heartbeat stops (:class:`Heartbeat`). A heartbeat written on this host by a process
  that is gone (``kill -9``) is not a live driver.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sparkpoint.config import Config, redact
from sparkpoint.errors import UserError
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.metadata.coordinator_stream import SET_CHANGELOG, SET_CONFIG, CoordinatorStreamStore
from sparkpoint.model import JobModel, SystemStream

log = logging.getLogger(__name__)

LIVENESS = "liveness"
INPUT_PARTITIONS = "input-partitions"
#: the namespace of a ``job reset`` under way (key ``pending``): written before it deletes
#: anything, gone with the coordinator stream, which it deletes last
RESET = "job-reset"


def refuse_unfinished_reset(store: MetadataStore, job: str) -> None:
    """Refuse to start a job whose ``job reset`` stopped half-way (some of what the job made
    is gone, its checkpoints are not): the fix is to run the reset again."""
    if store.get(RESET, "pending") is not None:
        raise UserError(
            f"job {job}: a job reset did not finish (it deleted part of what the job made, and "
            f"not its checkpoints yet): run sparkpoint job reset JOB again, then start the job"
        )


HEARTBEAT_SECONDS = 5.0


def config_diff(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """Human-readable lines: ``+ key=value``, ``- key (was value)``, ``~ key: old -> new``."""
    lines = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            lines.append(f"+ {key}={redact(key, new[key])}")
        elif key not in new:
            lines.append(f"- {key} (was {redact(key, old[key])})")
        elif old[key] != new[key]:
            lines.append(f"~ {key}: {redact(key, old[key])} -> {redact(key, new[key])}")
    return lines


def store_config(store: MetadataStore, config: Config) -> list[str]:
    """Write ``config`` as the job's config; return (and log) the diff from the stored one.

    Keys set for this run only (``config.one_off``, the CLI's ``--set``) are logged, not
    stored: the next run without them is not a config change."""
    old = store.all(SET_CONFIG)
    values = config.to_dict()
    one_off = {k: v for k, v in values.items() if k in config.one_off}
    if one_off:
        log.info(
            "this run's --set values (not stored as the job's config): %s",
            ", ".join(f"{k}={redact(k, v)}" for k, v in sorted(one_off.items())),
        )
    new = {k: v for k, v in values.items() if k not in one_off}
    kept = {k: v for k, v in old.items() if k in one_off}  # the stored value stays
    diff = config_diff({k: v for k, v in old.items() if k not in one_off}, new)
    if old and diff:
        log.warning("job config changed since the last run:\n  %s", "\n  ".join(diff))
    changes: dict[str, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
    changes.update({k: None for k in old if k not in new and k not in kept})
    if changes:
        store.put_all(SET_CONFIG, changes)
    return diff


def stored_changelog_partitions(store: MetadataStore) -> dict[str, int]:
    """The task -> changelog partition mapping the job last ran with (read only).

    A value that is not a partition number, or two tasks on one partition (their restores
    would mix each other's state), is an error naming the tasks: the mapping must be repaired
    (or the changelogs recreated) before the job can run.
    """
    mapping: dict[str, int] = {}
    owners: dict[int, str] = {}
    for task, value in sorted(store.all(SET_CHANGELOG).items()):
        if not value.strip().isdigit():
            raise UserError(
                f"coordinator stream: task {task} is mapped to changelog partition {value!r}, "
                f"which is not a partition number; write a valid set-changelog value"
            )
        partition = int(value)
        if partition in owners:
            raise UserError(
                f"coordinator stream: tasks {owners[partition]} and {task} are both mapped to "
                f"changelog partition {partition}; their restores would mix each other's state. "
                f"Give each task its own partition (set-changelog), or recreate the changelogs"
            )
        owners[partition] = task
        mapping[task] = partition
    return mapping


def with_changelog_partitions(
    stored: Mapping[str, int], model: JobModel
) -> tuple[JobModel, dict[str, int]]:
    """The model with stable changelog partitions: a task keeps the one in ``stored``; a new
    task takes its own partition number when that is free, else the lowest free one. Also the
    new tasks' partitions, to store."""
    mapping = dict(stored)
    used = set(mapping.values())
    added: dict[str, int] = {}
    for task in model.sorted_tasks():
        name = task.name.name
        if name in mapping:
            continue
        wanted = task.changelog_partition
        if wanted in used:
            wanted = next(p for p in range(len(used) + len(model.tasks) + 1) if p not in used)
        mapping[name] = wanted
        used.add(wanted)
        added[name] = wanted
    tasks = {n: replace(t, changelog_partition=mapping[n.name]) for n, t in model.tasks.items()}
    return JobModel(model.job_name, model.job_id, tasks), added


def assign_changelog_partitions(store: MetadataStore, model: JobModel) -> JobModel:
    """The model with stable changelog partitions (:func:`with_changelog_partitions`), the new
    tasks' stored for the next run."""
    model, added = with_changelog_partitions(stored_changelog_partitions(store), model)
    if added:
        store.put_all(SET_CHANGELOG, {t: str(p) for t, p in added.items()})
    return model


class PartitionCountChanged(UserError):
    """A stateful job's input stream has another partition count than when the job last ran."""


def check_input_partitions(
    store: MetadataStore, config: Config, counts: Mapping[SystemStream, int]
) -> None:
    """Refuse a stateful job (one with stores) whose input streams' partition ``counts`` differ
    from those it last ran with (its keys would now map to other tasks than their state, and
    counts would split silently); then store the counts for the next run. A stateless job only
    logs the change. A job that ran before counts were stored has them stored now."""
    stored = store.all(INPUT_PARTITIONS)
    changed = []
    for stream, count in sorted(counts.items(), key=lambda item: str(item[0])):
        text = stored.get(str(stream))
        if text is not None and text.strip().isdigit() and int(text) != count:
            changed.append((stream, int(text), count))
    if changed and config.stores:
        stream, old, now = changed[0]
        raise PartitionCountChanged(
            f"input stream {stream} had {old} partitions when job {config.job_name} last ran "
            f"and has {now} now: its keys moved to other partitions while their state "
            f"stayed in the tasks of the old ones, so running would split every key's state. "
            f"Move the state to the new tasks first: sparkpoint state reshard JOB"
        )
    for stream, old, now in changed:
        log.info("input stream %s: %d -> %d partitions (no state to split)", stream, old, now)
    new = {str(s): str(n) for s, n in counts.items() if stored.get(str(s)) != str(n)}
    if new:
        store.put_all(INPUT_PARTITIONS, new)


def read_liveness(store: MetadataStore) -> dict[str, Any] | None:
    """The last heartbeat of a running driver, or ``None`` when no driver is registered. A
    record that cannot be read is logged and taken as none: the next beat of a live driver
    overwrites it within :data:`HEARTBEAT_SECONDS`."""
    store.refresh()
    raw = store.get(LIVENESS, "driver")
    if raw is None:
        return None
    try:
        beat = json.loads(raw)
        int(beat["heartbeat"])
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("the driver heartbeat record %r is not valid (%s); ignoring it", raw[:80], exc)
        return None
    return dict(beat)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    except (OverflowError, ValueError):
        return False
    return True


def is_running(store: MetadataStore, now_ms: int | None = None) -> dict[str, Any] | None:
    """The heartbeat if it means a driver is running now: fresh (within three beats), and when
    written on this host, by a process that still exists."""
    beat = read_liveness(store)
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    if not beat or now_ms - int(beat["heartbeat"]) >= 3 * HEARTBEAT_SECONDS * 1000:
        return None
    if beat.get("host") == socket.gethostname() and not _process_alive(int(beat.get("pid", -1))):
        return None
    return beat


def describe_driver(beat: Mapping[str, Any]) -> str:
    """``host H, pid P, run R, last heartbeat N s ago`` for messages."""
    age = max(0.0, time.time() - int(beat["heartbeat"]) / 1000)
    return (
        f"host {beat.get('host', '?')}, pid {beat.get('pid', '?')}, run {beat.get('run-id', '?')}, "
        f"last heartbeat {age:.0f} s ago"
    )


class DriverConflict(UserError):
    """Another driver runs this job: starting (or going on) would mix two drivers' commits."""


def refuse_if_running(store: MetadataStore, job: str, run_id: str, *, force: bool) -> None:
    """Raise :class:`DriverConflict` when a live driver other than ``run_id`` holds the job,
    unless ``force`` (a driver or tool of this process counts while its heartbeat runs: a
    record of this process's with no heartbeat running is one that ended without removing
    it)."""
    beat = is_running(store)
    if beat is None or force or beat.get("run-id") == run_id:
        return
    here = beat.get("host") == socket.gethostname() and beat.get("pid") == os.getpid()
    if here and beat.get("run-id") not in _BEATING:
        return  # this process's earlier driver, gone without removing its record
    if here:
        raise DriverConflict(
            f"job {job} is held by a driver of this process that was not closed (run "
            f"{beat.get('run-id')}): close() that JobCoordinator (or stop its run) first; two "
            f"drivers would commit over each other's state"
        )
    raise DriverConflict(
        f"job {job} is running already ({describe_driver(beat)}): two drivers would commit over "
        f"each other's state. Stop that driver first; if it is gone (its host died), wait "
        f"{3 * HEARTBEAT_SECONDS:.0f} s for its heartbeat to expire, or pass --force"
    )


#: the run ids whose heartbeat this process writes now: a record of this process with another
#: run id is a driver (or tool) that ended without removing it
_BEATING: set[str] = set()


class Heartbeat:
    """Writes the driver's liveness record every few seconds on a daemon thread.

    Before each beat it reads the record back: one written by another live driver since the
    last beat means a second driver took the job over (started with ``--force``, or the two
    started at once). This driver then stops beating and sets :attr:`conflict`, which the
    coordinator checks before every batch and every checkpoint it writes.
    """

    def __init__(self, config: Config, run_id: str) -> None:
        self._config = config
        self._run_id = run_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sparkpoint-heartbeat", daemon=True)
        self._store: CoordinatorStreamStore | None = None
        #: set when another driver's heartbeat replaced this one's: the message to stop with
        self.conflict: str | None = None

    def check(self) -> None:
        """Read the record back; set :attr:`conflict` if another live driver wrote it."""
        assert self._store is not None
        beat = is_running(self._store)
        if beat is not None and beat.get("run-id") != self._run_id:
            self.conflict = (
                f"job {self._config.job_name}: another driver took this job over "
                f"({describe_driver(beat)}); this driver (run {self._run_id}) stops without "
                f"committing, so the two never commit over each other's state"
            )

    def _beat(self) -> None:
        assert self._store is not None
        value = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run-id": self._run_id,
            "heartbeat": int(time.time() * 1000),
        }
        self._store.put(LIVENESS, "driver", json.dumps(value))

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.check()
                if self.conflict is not None:
                    log.error("%s", self.conflict)
                    return
                self._beat()
            except Exception:  # a missed heartbeat must not kill the job
                log.exception("could not write the driver heartbeat")

    def start(self, *, force: bool = False) -> None:
        """Claim the job: refuse (:class:`DriverConflict`) while another live driver holds it,
        unless ``force``; then beat now and every few seconds."""
        store = CoordinatorStreamStore(self._config, source="heartbeat")
        try:
            refuse_if_running(store, self._config.job_name, self._run_id, force=force)
        except DriverConflict:
            store.close()
            raise
        self._store = store
        self._beat()
        _BEATING.add(self._run_id)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove the record (a clean exit), unless another driver's is
        there now. Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        _BEATING.discard(self._run_id)
        if self._store is not None:
            beat = read_liveness(self._store)
            if beat is None or beat.get("run-id") == self._run_id:
                self._store.delete(LIVENESS, "driver")
            self._store.close()
            self._store = None
