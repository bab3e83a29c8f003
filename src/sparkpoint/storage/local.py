"""A task's directory on an executor's local disk: the one owner of every file a task keeps
there (:class:`LocalTaskState`). Nothing else names, creates, reads or deletes them.

Layout under ``job.logged.store.base.dir``::

    <task>/STATE                       JSON {"state-id": ...}; absent while the state is changing
    <task>/FRAME-*                     the DataFrame batch phases (runtime/dataframe/phases.py)
    <task>/<store>/                    the live store
    <task>/<store>.restoring/          the store while a restore rebuilds it (then renamed)
    <task>/<store>.checkpoints/<id>/   a local checkpoint of the store (RocksDB hard links)
                                       with a CHECKPOINT file holding the checkpoint JSON
    <task>/commits/<checkpoint id>     a commit's record (storage/commit.py)
    <task>/COMMIT-FAILURES             successive failed or timed-out commits, while skipped
    <task>/COMMITS-ABANDONED           ``<run> <ms>``: commits made before the last restore
    <task>/CLEANED                     the checkpoint whose clean-up finished (``<run>:<id>``)
    .standby/<executor>/<task>/        a standby copy of the task's stores kept on this executor
                                       (:class:`StandbyCopy`): ``<store>/`` and ``POSITION``
    .standby/<executor>/<task>.lock    held by whoever changes or takes that copy

The marker is removed before a batch changes any store and written back, atomically, only after
every store is flushed and closed; so after a crash at any point the marker is either absent or
exactly right, and a missing marker means "restore from the last checkpoint".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from sparkpoint.errors import RestoreError
from sparkpoint.fsutil import atomic_write, fsync_dir
from sparkpoint.model import TaskName
from sparkpoint.storage.state_id import StateId

log = logging.getLogger(__name__)

MARKER = "STATE"
STANDBY_DIR = ".standby"
POSITION = "POSITION"
LOCK_SUFFIX = ".lock"  # a standby copy's lock, beside its directory
LOCK_OPEN_TRIES = 20  # makes of a lock file whose directory another process keeps removing
CHECKPOINT_FILE = "CHECKPOINT"
COMMITS = "commits"
COMMIT_FAILURES = "COMMIT-FAILURES"
ABANDONED_COMMITS = "COMMITS-ABANDONED"
CLEANED = "CLEANED"
#: the DataFrame phases' notes (runtime/dataframe/task.py) all start so
PHASE_NOTE_PREFIX = "FRAME-"


def task_dir_name(task: TaskName) -> str:
    return task_dir_name_of(task.name)


def task_dir_name_of(name: str) -> str:
    """``name`` as a directory name (anything but letters, digits, ``_.-`` becomes ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _link_or_copy(src: str, dst: str) -> None:
    # SST files are immutable: hard-link them; everything else (MANIFEST, WAL, OPTIONS) is copied
    if src.endswith(".sst"):
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


class LocalTaskState:
    """Paths and marker of one task's local state. Not thread-safe; one user per task."""

    def __init__(self, base_dir: Path, task: TaskName) -> None:
        self.task = task
        self.dir = base_dir / task_dir_name(task)

    def store_dir(self, store: str) -> Path:
        return self.dir / store

    def staging_dir(self, store: str) -> Path:
        """Where a store is rebuilt before it is renamed into place (removed on failure)."""
        return self.dir / f"{store}.restoring"

    def checkpoints_dir(self, store: str) -> Path:
        return self.dir / f"{store}.checkpoints"

    def checkpoint_dir(self, store: str, checkpoint_id: str) -> Path:
        return self.checkpoints_dir(store) / checkpoint_id

    def read_marker(self) -> StateId | None:
        """The state the live stores hold, as the marker says; None when there is no marker
        (or it cannot be read: the state is then unknown and the task restores)."""
        try:
            data = json.loads((self.dir / MARKER).read_bytes())
            return StateId.parse(str(data["state-id"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            log.warning("task %s: unreadable state marker in %s; restoring", self.task, self.dir)
            return None

    def clear_marker(self) -> None:
        """Declare the live state unknown (done before any store changes)."""
        try:
            (self.dir / MARKER).unlink()
            fsync_dir(self.dir)
        except FileNotFoundError:
            pass

    def write_marker(self, state_id: StateId) -> None:
        """Say the live stores hold ``state_id`` (after they were closed, their files synced).
        Not fsynced: a marker lost to a power cut (absent, empty or torn: unreadable) only
        makes the task restore, while :meth:`clear_marker`, before the stores change, is."""
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(
            self.dir / MARKER, json.dumps({"state-id": state_id.text}).encode(), durable=False
        )

    def read_note(self, name: str) -> dict[str, Any] | None:
        """A small JSON note kept beside the state (:mod:`sparkpoint.runtime.dataframe.phases`)."""
        try:
            data = json.loads((self.dir / name).read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            log.warning("task %s: unreadable note %s in %s; ignoring it", self.task, name, self.dir)
            return None
        return data if isinstance(data, dict) else None

    def write_note(self, name: str, data: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / name, json.dumps(data).encode())

    def delete_note(self, name: str) -> None:
        (self.dir / name).unlink(missing_ok=True)

    # -- the commit's files (storage/commit.py)
    def commits_dir(self) -> Path:
        """Where each commit's record lives, named by its checkpoint id."""
        return self.dir / COMMITS

    def commit_failures_file(self) -> Path:
        return self.dir / COMMIT_FAILURES

    def abandoned_commits_file(self) -> Path:
        """``<run id> <ms>``: the run's commits started by then belong to a lineage the task
        left when it restored (written by :class:`~sparkpoint.storage.task_storage.
        TaskStorage`, read by :class:`~sparkpoint.storage.commit.TaskCommitManager`)."""
        return self.dir / ABANDONED_COMMITS

    def cleaned_file(self) -> Path:
        return self.dir / CLEANED

    def store_present(self, store: str) -> bool:
        """Whether a persistent store's database is on disk (RocksDB's ``CURRENT`` file)."""
        return (self.store_dir(store) / "CURRENT").exists()

    def contents(self) -> dict[str, Any]:
        """What the directory holds, by kind: the marker's state, live stores, local
        checkpoints per store, commit records, phase notes, and anything this module does not
        name (``unknown``), for the tools and tests."""
        out: dict[str, Any] = {
            "state": None,
            "stores": [],
            "restoring": [],
            "checkpoints": {},
            "commit-records": [],
            "commit-failures": False,
            "commits-abandoned": None,
            "cleaned": None,
            "notes": [],
            "unknown": [],
        }
        if not self.dir.is_dir():
            return out
        marker = self.read_marker()
        out["state"] = None if marker is None else marker.text
        for path in sorted(self.dir.iterdir()):
            name = path.name
            if name == MARKER:
                continue
            if name == COMMITS:
                out["commit-records"] = sorted(p.name for p in path.iterdir())
            elif name == COMMIT_FAILURES:
                out["commit-failures"] = True
            elif name == ABANDONED_COMMITS:
                out["commits-abandoned"] = path.read_text()
            elif name == CLEANED:
                out["cleaned"] = path.read_text()
            elif name.startswith(PHASE_NOTE_PREFIX):
                out["notes"].append(name)
            elif name.endswith(".checkpoints") and path.is_dir():
                out["checkpoints"][name[: -len(".checkpoints")]] = sorted(
                    p.name for p in path.iterdir()
                )
            elif name.endswith(".restoring"):
                out["restoring"].append(name[: -len(".restoring")])
            elif path.is_dir():
                out["stores"].append(name)
            else:
                out["unknown"].append(name)
        return out

    def store_bytes(self, store: str) -> int:
        """Bytes the live store takes on disk (0 if it has no directory)."""
        root = self.store_dir(store)
        if not root.is_dir():
            return 0
        return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())

    def clear_store(self, store: str) -> None:
        """Remove the live store and any half-built restore of it (its local checkpoints stay).
        A store directory that is a symbolic link is refused, not followed: deleting or
        rebuilding through it would reach files outside the task's directory."""
        for stale in (self.store_dir(store), self.staging_dir(store)):
            if stale.is_symlink():
                raise RestoreError(
                    f"task {self.task} store {store}: {stale} is a symbolic link (to "
                    f"{os.readlink(stale)}); sparkpoint deletes and rebuilds a store only inside "
                    f"its task's directory. Remove the link (the store restores from its "
                    f"checkpoint), or move every store with job.logged.store.base.dir"
                )
            if stale.exists():
                shutil.rmtree(stale)

    def restore_from_checkpoint(self, store: str, checkpoint_id: str | None) -> bool:
        """Replace the live store with its local checkpoint; ``False`` (and empty) if none.

        Writes only inside this task's directory.
        """
        self.clear_store(store)
        if checkpoint_id is None:
            return False
        if not self.has_checkpoint(store, checkpoint_id):
            return False
        source = self.checkpoint_dir(store, checkpoint_id)
        staging = self.staging_dir(store)
        shutil.copytree(source, staging, copy_function=_link_or_copy)
        (staging / CHECKPOINT_FILE).unlink()
        os.replace(staging, self.store_dir(store))
        return True

    def has_checkpoint(self, store: str, checkpoint_id: str) -> bool:
        """Whether a complete local checkpoint (with its CHECKPOINT file) exists."""
        return (self.checkpoint_dir(store, checkpoint_id) / CHECKPOINT_FILE).exists()

    def write_checkpoint_file(self, store: str, checkpoint_id: str, checkpoint_json: str) -> None:
        atomic_write(
            self.checkpoint_dir(store, checkpoint_id) / CHECKPOINT_FILE, checkpoint_json.encode()
        )

    def clean_checkpoints(self, store: str, keep: set[str]) -> None:
        """Delete every local checkpoint of ``store`` except those in ``keep``. Idempotent."""
        parent = self.checkpoints_dir(store)
        if not parent.is_dir():
            return
        for child in parent.iterdir():
            if child.name not in keep:
                shutil.rmtree(child, ignore_errors=True)


class StandbyCopy(LocalTaskState):
    """A standby copy of a task's stores (:mod:`sparkpoint.storage.standby`), kept by one
    executor under ``.standby/<executor id>/<task>``: per executor, so that executors sharing
    one base directory never share a copy. ``POSITION`` names the checkpoint the copy is at and
    each store's changelog offset then (``None``: nothing of the store in its changelog)."""

    def __init__(self, base_dir: Path, executor: str, task: TaskName) -> None:
        super().__init__(base_dir / STANDBY_DIR / task_dir_name_of(executor), task)
        self.executor = executor

    def position(self) -> tuple[str, dict[str, str | None]] | None:
        """``(checkpoint id, {store: changelog offset})`` of the copy; None when there is none
        (or it is unreadable: the copy is then seeded again)."""
        data = self.read_note(POSITION)
        if data is None:
            return None
        offsets = data.get("offsets")
        if not isinstance(data.get("checkpoint"), str) or not isinstance(offsets, dict):
            return None
        return str(data["checkpoint"]), {str(k): v for k, v in offsets.items()}

    def write_position(self, checkpoint_id: str, offsets: dict[str, str | None]) -> None:
        """Record the copy's position; written after every store of it is flushed and closed."""
        self.write_note(POSITION, {"checkpoint": checkpoint_id, "offsets": offsets})

    def forget_store(self, store: str) -> None:
        """The store left the copy (promoted into the task's live state): drop it from the
        position, and the whole copy once no store is left."""
        held = self.position()
        if held is None:
            return
        checkpoint_id, offsets = held
        offsets.pop(store, None)
        if offsets:
            self.write_position(checkpoint_id, offsets)
        else:
            self.remove()

    def remove(self) -> None:
        self.remove_dir(self.dir)

    def lock(self, wait_s: float) -> contextlib.AbstractContextManager[bool]:
        """Hold the copy's lock while the block runs (:func:`_locked`), waiting up to
        ``wait_s`` seconds for it; whether it was got. A catch-up and a promotion of one
        copy take it, so that a catch-up which outlived its failed job never changes or
        deletes a copy while a task is taking it."""
        return _locked(self.dir, wait_s)

    @staticmethod
    def remove_dir(path: Path) -> None:
        """Delete one standby copy's directory (a copy this executor no longer keeps)."""
        shutil.rmtree(path, ignore_errors=True)


def _lock_path(copy_dir: Path) -> Path:
    return copy_dir.with_name(copy_dir.name + LOCK_SUFFIX)


@contextlib.contextmanager
def _locked(copy_dir: Path, wait_s: float) -> Iterator[bool]:
    """An ``flock`` on the file beside ``copy_dir`` (released when the process dies). A lock
    got on a file its holder unlinked meanwhile (:func:`remove_standby_copies`) is no lock:
    the file at the path is opened and locked again."""
    path = _lock_path(copy_dir)
    deadline = time.monotonic() + wait_s
    while True:
        with _open_lock_file(path) as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)
                continue
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current != os.fstat(f.fileno()).st_ino:
                continue  # unlinked while we waited: the lock is the new file's
            try:
                yield True
                return
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _open_lock_file(path: Path) -> BinaryIO:
    """The lock file at ``path``, made with its directory if need be. Another process may
    remove that directory between the two (a gone executor's copies cleaned up by several
    workers at once): made again then."""
    for _ in range(LOCK_OPEN_TRIES - 1):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return open(path, "a+b")
        except (FileNotFoundError, FileExistsError):  # (made, then removed, as it checked)
            continue
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a+b")


def standby_executors(base_dir: Path) -> list[str]:
    """The executor directories of every standby copy kept under ``base_dir``."""
    root = base_dir / STANDBY_DIR
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def standby_tasks(base_dir: Path, executor: str) -> list[Path]:
    """The directories of the standby copies kept under ``base_dir`` for ``executor``."""
    root = base_dir / STANDBY_DIR / task_dir_name_of(executor)
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def remove_standby_copies(base_dir: Path, task: TaskName) -> None:
    """Delete every standby copy of ``task`` under ``base_dir`` (standbys are off: a
    copy an earlier run kept would only take disk)."""
    root = base_dir / STANDBY_DIR
    if not root.is_dir():
        return
    for executor in root.iterdir():
        remove_standby_copy(executor / task_dir_name(task))


def remove_standby_copy(copy_dir: Path) -> bool:
    """Delete one standby copy and its lock file, under its lock; whether it was deleted. A
    copy whose lock another process holds (a task taking it, a catch-up that outlived its
    failed job) is left as it is: deleting it there could take files from under a promotion."""
    with _locked(copy_dir, 0) as mine:
        if mine:
            StandbyCopy.remove_dir(copy_dir)
            _lock_path(copy_dir).unlink(missing_ok=True)
        return mine


def _remove_stray(entry: Path) -> None:
    """A gone executor's entry that is no copy and no lock (a plain file, a link): unlinked
    (a link's target is left alone)."""
    if entry.is_symlink() or not entry.is_dir():
        entry.unlink(missing_ok=True)


def remove_standby_executor(base_dir: Path, executor_dir: str) -> None:
    """Delete the standby copies of one executor directory (an executor that is gone), each
    as :func:`remove_standby_copy` does (lock files left by copies already deleted too), then
    the directory once nothing is left in it."""
    root = base_dir / STANDBY_DIR / executor_dir
    try:
        entries = sorted(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):  # (another worker removed it first)
        return
    for entry in entries:
        copy = entry.name.removesuffix(LOCK_SUFFIX)
        if copy and not entry.is_symlink() and (entry.is_dir() or copy != entry.name):
            remove_standby_copy(entry.with_name(copy))
        else:
            _remove_stray(entry)
    with contextlib.suppress(OSError):  # not empty: a copy in use stays, with its lock
        root.rmdir()
