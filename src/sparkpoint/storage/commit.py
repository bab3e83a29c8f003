"""The commit of one task's state: a fast synchronous snapshot, then an asynchronous upload.

How this lives across Spark micro-batches. A commit starts at the end of a batch on the
executor (docs/architecture.md, "The commit"): stores are flushed, each persistent store makes a
local checkpoint directory named by a new checkpoint id (RocksDB hard links), every backup
manager takes its snapshot, and the input offsets are taken: all while processing waits, in
milliseconds. The upload then runs on this Python worker's commit pool (``min(tasks, 64)``
threads) while the Spark task returns and later batches run. Its progress is a *commit record*
on the executor's local disk, ``<task dir>/commits/<checkpoint id>``: ``uploading`` (with the
worker's host and pid and the start time), then ``done`` (with the final markers) or
``failed`` (with the error).
Because records are on disk, the next batch of the task sees them in whatever worker it runs.

* The driver writes a checkpoint only when a batch reports its record ``done``, so a checkpoint
  never names an upload that has not finished; then the next batch cleans up (older local
  checkpoints, each backend's ``clean_up``, old records).
* A record still ``uploading`` whose worker is gone is a lost upload: like a failed one, it is
  reported as an error at the next commit, with task, store and checkpoint id. Nothing is lost
  silently, and the state stays at the last written checkpoint.
* While an upload runs, a new commit is skipped until it has run ``task.commit.max.delay.ms``;
  after that the commit waits for it, and fails the task after ``task.commit.timeout.ms``. A
  commit is also skipped while a finished one waits to be written by the driver; a batch that
  must commit (``wait``) builds on that finished one instead (the backups are re-initialised
  from it), and the driver writes both in order. Each record names the checkpoint it builds on,
  and the driver writes a commit only if that is the last written checkpoint: a task that ran
  on two executors at once (an upload finishing after the task moved) cannot fork the chain of
  snapshots (incremental backends diff against their base).
* With ``task.commit.skip.commit.during.failures.enabled`` (Samza's key, off by default) a
  failed upload or a commit timeout is logged and the commit skipped, until more than
  ``task.commit.skip.commit.exception.max.limit`` failures (or ``...timeout.max.limit``
  timeouts) happen in a row; a finished upload resets both counts. Skipping loses no state:
  the driver writes only finished commits, so the task stays at its last written checkpoint.
* With ``task.commit.async.enabled=false`` (and always for the final commit of a run) the batch
  waits for its uploads before returning.
* If the task moves to another host mid-upload, the new host never sees the record; the commit
  is simply not written, and the task restores from the last written checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from sparkpoint import worker
from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.errors import CommitError
from sparkpoint.failpoints import InjectedCrash, maybe_crash
from sparkpoint.fsutil import atomic_write
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.storage.backend import TaskBackupManager
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.storage.outputs import OUTPUTS, TaskOutputs

log = logging.getLogger(__name__)


class CommitState(StrEnum):
    """Where a commit's asynchronous stage is; the ``state`` of its commit record."""

    UPLOADING = "uploading"
    DONE = "done"
    FAILED = "failed"


UPLOADING, DONE, FAILED = CommitState.UPLOADING, CommitState.DONE, CommitState.FAILED


class _CommitPool:
    """The process's commit pool (the ``commit-pool`` slot of :mod:`sparkpoint.worker`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: ThreadPoolExecutor | None = None
        self.size = 0


_POOL = worker.slot("commit-pool", _CommitPool)
# uploads running in this process, by (task, checkpoint id)
_active: set[tuple[str, str]] = worker.slot("active-uploads", set)


def _start_upload(
    manager: TaskBackupManager, checkpoint_id: CheckpointId, markers: Mapping[str, str]
) -> Future[dict[str, str]]:
    """``manager.upload(...)``; an upload that raises at once becomes a failed future, so the
    commit fails like any other failed upload instead of staying "uploading"."""
    try:
        return manager.upload(checkpoint_id, markers)
    except InjectedCrash:
        raise
    except Exception as exc:
        failed: Future[dict[str, str]] = Future()
        failed.set_exception(exc)
        return failed


def commit_pool(tasks: int) -> ThreadPoolExecutor:
    """This process's commit pool of ``min(tasks, 64)`` threads.

    Made on first use; when a later caller needs more threads a larger pool replaces it (the old
    one finishes what it was given).
    """
    size = max(1, min(tasks, 64))
    with _POOL.lock:
        if _POOL.pool is None or size > _POOL.size:
            _POOL.pool = ThreadPoolExecutor(size, thread_name_prefix="sparkpoint-commit")
            _POOL.size = size
        return _POOL.pool


def _alive(record: CommitRecord, task: TaskName) -> bool:
    """Whether the worker that started an upload may still be running it."""
    host, pid = record.host, record.pid
    if host != socket.gethostname():
        return True  # cannot tell from here; assume it is still working
    if pid == os.getpid():
        return (task.name, record.checkpoint_id) in _active
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class CommitRecord:
    run_id: str
    checkpoint_id: str
    state: CommitState
    host: str
    pid: int
    started_ms: int
    checkpoint: dict[str, Any]
    error: str = ""
    metrics: dict[str, int] = field(default_factory=dict)
    base: str | None = None  # the written checkpoint this commit's snapshot builds on

    def dumps(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def load(cls, path: Path) -> CommitRecord:
        record = cls(**json.loads(path.read_bytes()))
        record.state = CommitState(record.state)
        return record


@dataclass(frozen=True)
class SkipPolicy:
    """Samza's task.commit.skip.commit.during.failures.* settings."""

    enabled: bool = False
    max_exceptions: int = 5
    max_timeouts: int = 2

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> SkipPolicy:
        prefix = "task.commit.skip.commit."
        return cls(
            config.get(prefix + "during.failures.enabled", "false").lower() == "true",
            int(config.get(prefix + "exception.max.limit") or 5),
            int(config.get(prefix + "timeout.max.limit") or 2),
        )


@dataclass(frozen=True)
class CommitSettings:
    """How commits behave: ``task.commit.max.delay.ms``, ``task.commit.timeout.ms``, the skip
    policy, and the size of the commit pool (the number of tasks)."""

    max_delay_ms: int = 60_000
    timeout_ms: int = 1_800_000
    pool_size: int = 1
    skip: SkipPolicy = SkipPolicy()

    @classmethod
    def from_config(cls, config: Config, *, pool_size: int) -> CommitSettings:
        return cls(
            config.get_int("task.commit.max.delay.ms"),
            config.get_int("task.commit.timeout.ms"),
            pool_size,
            SkipPolicy.from_config(config),
        )


@dataclass(frozen=True)
class CommitScope:
    """The task state a commit works on (made by :class:`~sparkpoint.storage.task_storage.
    TaskStorage`): its stores, their backup managers and where the task's files live."""

    task: TaskName
    run_id: str
    local: LocalTaskState
    engines: Mapping[str, KeyValueEngine]
    backups: Mapping[str, TaskBackupManager]
    store_backends: Mapping[str, list[str]]  # store -> its backup backends
    config: Mapping[str, str] = field(default_factory=dict)  # for the failpoints
    #: exactly-once output staged since the last written checkpoint (:mod:`.outputs`)
    outputs: TaskOutputs | None = None
    #: publishes the staged output a written checkpoint names (at its clean-up)
    publish: Callable[[Checkpoint], int] | None = None


@dataclass
class CommitOutcome:
    started: str | None = None  # checkpoint id of a commit started in this batch
    skipped: bool = False
    waited_seconds: float = 0.0


class TaskCommitManager:
    """Runs the commit sequence for one task in one batch (see the module docstring)."""

    def __init__(
        self, scope: CommitScope, settings: CommitSettings, *, committed: str | None
    ) -> None:
        self.task = scope.task
        self.run_id = scope.run_id
        self.committed = committed
        self.local = scope.local
        self.engines = dict(scope.engines)  # a copy: the upload thread outlives the batch
        self.backups = scope.backups
        self.store_backends = scope.store_backends
        self.config = scope.config
        self.outputs = scope.outputs
        self.publish = scope.publish
        self._base_commit: Checkpoint | None = None  # an unwritten commit this one builds on
        self.settings = settings
        self.skip = settings.skip
        self.dir = scope.local.commits_dir()
        self._failures_file = scope.local.commit_failures_file()
        self._abandoned_file = scope.local.abandoned_commits_file()

    # -- successive failures (task.commit.skip.commit.during.failures.*)
    def _failures(self) -> dict[str, int]:
        try:
            data = json.loads(self._failures_file.read_bytes())
            return {"exceptions": int(data["exceptions"]), "timeouts": int(data["timeouts"])}
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return {"exceptions": 0, "timeouts": 0}

    def _tolerate(self, kind: str, limit: int, error: CommitError) -> None:
        """Count a failure of ``kind``; re-raise unless skipping is on and within the limit."""
        if not self.skip.enabled:
            raise error
        counts = self._failures()
        counts[kind] += 1
        atomic_write(self._failures_file, json.dumps(counts).encode())
        if counts[kind] > limit:
            raise CommitError(
                f"{error} ({counts[kind]} successive commit {kind}, more than "
                f"task.commit.skip.commit.{kind[:-1]}.max.limit={limit})"
            ) from error
        log.warning(
            "%s; skipped (%d successive commit %s of at most %d tolerated)",
            error,
            counts[kind],
            kind,
            limit,
        )

    def _check_tolerating(self) -> CommitRecord | None:
        """:meth:`_check`, with failures counted and skipped when the policy allows."""
        while True:
            try:
                return self._check()
            except CommitError as exc:
                self._tolerate("exceptions", self.skip.max_exceptions, exc)

    def check_uploads(self) -> bool:
        """In a batch that does not commit: an upload of this run that failed or was lost is
        raised, or counted and tolerated under the skip policy, as the next commit would
        (an idle job's next commit may be far off); whether one was tolerated (its commit
        never happened: the driver commits again)."""
        before = self._failures()
        self._check_tolerating()
        return self._failures() != before

    # -- records
    def _abandoned_until(self) -> int:
        """This run's commits started at or before this time (ms) are abandoned: the task
        restored since, and its state no longer continues theirs (-1: none is)."""
        try:
            run_id, ms = self._abandoned_file.read_text().split()
        except (FileNotFoundError, ValueError):
            return -1
        return int(ms) if run_id == self.run_id else -1

    def records(self) -> list[CommitRecord]:
        """This run's commit records, oldest first. Those of earlier runs are abandoned, and
        so are those of this run the task left when it restored: finished, their records go
        (never written, their uploads expire); still uploading, they are not waited for."""
        if not self.dir.is_dir():
            return []
        abandoned = self._abandoned_until()
        out = []
        for path in sorted(self.dir.iterdir()):
            if path.suffix == ".tmp":
                continue
            try:
                record = CommitRecord.load(path)
            except (ValueError, TypeError, OSError) as exc:
                log.warning(
                    "task %s: removing unreadable commit record %s: %s", self.task, path, exc
                )
                path.unlink(missing_ok=True)
                continue
            if record.run_id != self.run_id:
                # a commit the previous driver never wrote: the job restored from an older
                # checkpoint, so this one is dropped (its local files go with the clean-up)
                path.unlink(missing_ok=True)
                continue
            if record.started_ms <= abandoned:
                if record.state != UPLOADING:
                    path.unlink(missing_ok=True)
                continue
            out.append(record)
        return sorted(out, key=lambda r: CheckpointId.parse(r.checkpoint_id))

    def _write(self, record: CommitRecord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / record.checkpoint_id, record.dumps())

    def completed(self, after: str | None) -> list[CommitRecord]:
        """Finished uploads the driver can still write after the committed checkpoint ``after``,
        oldest first, from one read of the records: those built on ``after``, then those built
        on one of them (a chained final commit). A finished upload built on anything else (made
        by this executor before the task moved away and a commit elsewhere was written) can
        never be written: its record is removed here, so it does not hold back later commits,
        and its uploads expire with their TTL."""
        floor = CheckpointId.parse(after) if after else None
        chain: list[CommitRecord] = []
        bases: set[str | None] = {after}
        for r in self.records():
            if r.state != DONE or (
                floor is not None and CheckpointId.parse(r.checkpoint_id) <= floor
            ):
                continue
            if r.base in bases:
                chain.append(r)
                bases.add(r.checkpoint_id)
            else:
                log.info(
                    "task %s: dropping commit %s: built on %s, but %s was written since",
                    self.task,
                    r.checkpoint_id,
                    r.base,
                    after,
                )
                (self.dir / r.checkpoint_id).unlink(missing_ok=True)
        return chain

    def _finished_unwritten(self) -> CommitRecord | None:
        """The newest commit of this run whose upload finished but that is not written yet."""
        done = self.completed(self.committed)
        return done[-1] if done else None

    def _check(self) -> CommitRecord | None:
        """Raise the first failed or lost upload of this run; else the upload still running.

        One read of the records answers both questions, so an upload that fails while this
        runs is seen either as failed or as still running (and then waited for), never missed
        until a later commit. A record seen uploading whose upload is no longer active here is
        read again: it may have finished or failed in between.
        """
        running = None
        for r in self.records():
            if r.state == UPLOADING and not _alive(r, self.task):
                r = self._reload(r)
            if r.state == FAILED:
                self._report(r, r.error)
            elif r.state == UPLOADING and not _alive(r, self.task):
                self._report(
                    r, f"the upload was lost: worker {r.pid} on {r.host} died while uploading"
                )
            elif r.state == UPLOADING and running is None:
                running = r
        return running

    def _reload(self, record: CommitRecord) -> CommitRecord:
        try:
            return CommitRecord.load(self.dir / record.checkpoint_id)
        except (ValueError, TypeError, OSError):
            return record

    def _report(self, record: CommitRecord, reason: str) -> None:
        # the record has been reported; the next attempt starts clean
        (self.dir / record.checkpoint_id).unlink(missing_ok=True)
        raise CommitError(f"task {self.task}: commit {record.checkpoint_id} failed: {reason}")

    # -- the sequence
    def commit(
        self,
        offsets: Mapping[SystemStreamPartition, str],
        *,
        wait: bool,
    ) -> CommitOutcome:
        """Commit the current state and ``offsets`` (last processed per SSP), Samza's steps in
        order: gate, snapshot, upload, checkpoint. The clean-up of a checkpoint runs after the
        driver wrote it (:meth:`clean_up`, at the next batch)."""
        outcome = CommitOutcome()
        base = self._gate(wait, outcome)  # skip, or wait for an upload still running
        if outcome.skipped:
            return outcome
        with self._local_disk():
            record, markers = self._snapshot(offsets, base)  # 1. snapshot (synchronous)
        outcome.started = record.checkpoint_id
        uploads = self._upload(record, markers)  # 2. upload (asynchronous)
        # 3. checkpoint: once every upload finished, :meth:`_checkpoint` writes the local
        # checkpoint files and marks the record done, for the driver to write. Uploads that
        # finished at once (a changelog's) need no "uploading" record: nobody could see it
        if all(f.done() for f in uploads.values()):
            with self._local_disk():
                self._finish(record, uploads)
        else:
            with self._local_disk():
                self._write(record)
            commit_pool(self.settings.pool_size).submit(self._finish, record, uploads)
            if wait:
                outcome.waited_seconds += self._wait_for(record.checkpoint_id)
        if wait:
            self._check()
        return outcome

    def _gate(self, wait: bool, outcome: CommitOutcome) -> str | None:
        """Before a commit: raise (or tolerate) an earlier failure; skip (``outcome.skipped``)
        while an upload runs within ``task.commit.max.delay.ms`` or a finished commit awaits
        the driver, else wait for it. Returns the checkpoint the new commit builds on."""
        running = self._check_tolerating()
        if running is not None:
            age = time.time() * 1000 - running.started_ms
            if age < self.settings.max_delay_ms and not wait:
                log.info(
                    "task %s: commit skipped, upload of %s still running (%.0f ms)",
                    self.task,
                    running.checkpoint_id,
                    age,
                )
                outcome.skipped = True
                return None
            try:
                outcome.waited_seconds += self._wait_for(running.checkpoint_id)
            except CommitError as exc:
                self._tolerate("timeouts", self.skip.max_timeouts, exc)
                outcome.skipped = True
                return None
            self._check_tolerating()
        pending = self._finished_unwritten()
        if pending is None:
            return self.committed
        if not wait and running is None:
            # the previous commit finished but the driver has not written it yet (it will
            # right after this batch): commit next time, on top of it
            outcome.skipped = True
            return None
        # asked to commit now, or blocked until the previous upload finished (past
        # task.commit.max.delay.ms): build on it; the driver writes it first
        self._base_commit = CheckpointV2.from_json(pending.checkpoint)
        for manager in self.backups.values():
            manager.init(self._base_commit)
        return pending.checkpoint_id

    @contextmanager
    def _local_disk(self) -> Iterator[None]:
        """A commit's writes of local state: a failure of the disk (full, say) is one
        :class:`CommitError` naming the task and where it was writing."""
        try:
            yield
        except OSError as exc:
            raise CommitError(
                f"task {self.task}: commit failed writing local state under {self.local.dir}: "
                f"{exc.strerror or exc} (a full disk? free space there and restart: the task "
                f"restores its last checkpoint, nothing is lost)"
            ) from exc

    def _upload(
        self, record: CommitRecord, markers: Mapping[str, dict[str, str]]
    ) -> dict[str, Future[dict[str, str]]]:
        """Start each backend's upload of the snapshot; the futures of their final markers."""
        cid = CheckpointId.parse(record.checkpoint_id)
        _active.add((self.task.name, record.checkpoint_id))
        return {name: _start_upload(m, cid, markers[name]) for name, m in self.backups.items()}

    def _snapshot(
        self, offsets: Mapping[SystemStreamPartition, str], base: str | None
    ) -> tuple[CommitRecord, dict[str, dict[str, str]]]:
        """Step 1, while processing waits: flush, a new checkpoint id, a local checkpoint of each
        persistent store (hard links), each backend's snapshot markers, and the commit record
        ``uploading`` naming its base (written by :meth:`commit` unless every upload finished
        at once). Returns the record and each backend's markers."""
        for engine in self.engines.values():
            engine.flush()
        cid = CheckpointId.create(after=None if base is None else CheckpointId.parse(base))
        for store, engine in self.engines.items():
            if engine.persistent:
                engine.checkpoint(self.local.checkpoint_dir(store, str(cid)))
        snapshot: dict[str, dict[str, str]] = {}
        for name, manager in self.backups.items():
            snapshot[name] = manager.snapshot(cid)
        if self.outputs is not None:
            staged = self.outputs.markers(cid, self._base_commit)
            if staged:
                snapshot[OUTPUTS] = staged
        maybe_crash(self.config, "after-snapshot")
        record = CommitRecord(
            self.run_id,
            str(cid),
            UPLOADING,
            socket.gethostname(),
            os.getpid(),
            int(time.time() * 1000),
            CheckpointV2(cid, offsets, snapshot).to_json(),
            base=base,
        )
        return record, snapshot

    def _finish(self, record: CommitRecord, futures: Mapping[str, Future[dict[str, str]]]) -> None:
        try:
            self._checkpoint(record, futures)
        finally:
            _active.discard((self.task.name, record.checkpoint_id))

    def _checkpoint(
        self, record: CommitRecord, futures: Mapping[str, Future[dict[str, str]]]
    ) -> None:
        """Step 3, on the commit pool once the uploads finish: the checkpoint with every
        backend's final markers goes into each local checkpoint directory and the record
        becomes ``done`` (or ``failed``, naming the backend and stores)."""
        markers: dict[str, dict[str, str]] = {}
        try:
            for name, future in futures.items():
                try:
                    markers[name] = future.result()
                except Exception as exc:
                    stores = ", ".join(s for s, b in self.store_backends.items() if name in b)
                    raise CommitError(
                        f"backend {name} upload for store(s) {stores} failed: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
            maybe_crash(self.config, "after-upload")
            snapshot = CheckpointV2.from_json(record.checkpoint)
            if OUTPUTS in snapshot.state_checkpoint_markers:  # final at the snapshot
                markers[OUTPUTS] = dict(snapshot.state_checkpoint_markers[OUTPUTS])
            checkpoint = CheckpointV2(
                CheckpointId.parse(record.checkpoint_id), snapshot.input_offsets, markers
            )
            text = checkpoint.dumps()
            for store, engine in self.engines.items():
                if engine.persistent:
                    self.local.write_checkpoint_file(store, record.checkpoint_id, text)
            maybe_crash(self.config, "after-local-checkpoint-write")
            record.checkpoint = checkpoint.to_json()
            record.metrics = {"upload-ms": int(time.time() * 1000) - record.started_ms}
            for manager in self.backups.values():
                for key, value in manager.stats().items():
                    record.metrics[key] = record.metrics.get(key, 0) + value
            record.state = DONE
            self._failures_file.unlink(missing_ok=True)  # a finished upload resets the counts
        except InjectedCrash:
            raise  # a simulated dying worker records nothing: the upload is lost
        except BaseException as exc:
            record.state = FAILED
            record.error = (
                str(exc) if isinstance(exc, CommitError) else f"{type(exc).__name__}: {exc}"
            )
            self._write(record)
            if not isinstance(exc, Exception):
                raise
            log.error(
                "task %s: commit %s failed: %s", self.task, record.checkpoint_id, record.error
            )
            return
        self._write(record)

    def _wait_for(self, checkpoint_id: str) -> float:
        start = time.monotonic()
        deadline = start + self.settings.timeout_ms / 1000
        path = self.dir / checkpoint_id
        delay = 0.005
        while True:
            try:
                record = CommitRecord.load(path)
            except FileNotFoundError:
                return time.monotonic() - start
            if record.state != UPLOADING or not _alive(record, self.task):
                return time.monotonic() - start
            if time.monotonic() >= deadline:
                raise CommitError(
                    f"task {self.task}: commit {checkpoint_id} still uploading after "
                    f"task.commit.timeout.ms={self.settings.timeout_ms}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def wait_all(self) -> None:
        """Wait for every upload of this run still running (the final commit of a run)."""
        for record in self.records():
            if record.state == UPLOADING:
                self._wait_for(record.checkpoint_id)
        self._check()

    # -- 0. clean-up after the driver wrote a checkpoint (the commit's steps: docs/architecture.md)
    def clean_up(self, committed: Checkpoint | None) -> None:
        """Delete what the committed checkpoint no longer needs. Idempotent.

        Local checkpoints other than the committed one and those still uploading go at every
        batch; the backends' clean-up runs once per committed checkpoint (and again after a
        restart, since it is idempotent).
        """
        # keep what the driver may still write: uploads running or finished but not yet written
        keep = {r.checkpoint_id for r in self.records() if r.state in (UPLOADING, DONE)}
        if committed is not None:
            keep.add(str(committed.checkpoint_id))
        for store, engine in self.engines.items():
            if engine.persistent:
                self.local.clean_checkpoints(store, keep)
        if committed is None:
            return
        floor = committed.checkpoint_id
        done_marker = self.local.cleaned_file()
        done = f"{self.run_id}:{floor}".encode()
        if done_marker.exists() and done_marker.read_bytes() == done:
            return
        maybe_crash(self.config, "during-cleanup")
        if self.publish is not None:
            self.publish(committed)  # the output it covers becomes visible (idempotent)
        for name, manager in self.backups.items():
            manager.clean_up(floor, committed.state_checkpoint_markers.get(name, {}))
        for r in self.records():
            if CheckpointId.parse(r.checkpoint_id) <= floor and r.state != UPLOADING:
                (self.dir / r.checkpoint_id).unlink(missing_ok=True)
        # not fsynced: the clean-up is idempotent, and a marker lost to a power cut only
        # makes the next batch run it again
        with self._local_disk():  # a full disk here is the same one-line error
            atomic_write(done_marker, done, durable=False)
