"""A state backend for tests: copies a store's local checkpoint into a directory.

Use it in ``stores.<s>.backup.factories`` as
``sparkpoint.testing.backends:CopyStateBackendFactory``.
Its upload really runs asynchronously on the commit pool, and can be slowed or made to fail:

* ``testing.copy.dir``: where copies go (``<dir>/<task>/<store>/<checkpoint id>/``);
* ``testing.copy.delay.ms``: how long each upload sleeps before copying;
* ``testing.copy.fail.flag``: while this file exists, the next upload deletes it and fails;
* ``testing.copy.fail.sync.flag``: the same, but ``upload()`` itself raises (before any future).

Its marker is the checkpoint id of the copy; restore copies it back into the store directory.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import ConfigKey
from sparkpoint.storage.backend import (
    BackendContext,
    RestoreStats,
    StateBackendFactory,
    TaskBackupManager,
    TaskRestoreManager,
)
from sparkpoint.storage.commit import commit_pool
from sparkpoint.storage.local import CHECKPOINT_FILE, task_dir_name

NAME = "sparkpoint.testing.backends:CopyStateBackendFactory"


def _remote(context: BackendContext, store: str) -> Path:
    return (
        Path(context.config.require("testing.copy.dir")) / task_dir_name(context.task.name) / store
    )


class CopyBackup(TaskBackupManager):
    def __init__(self, context: BackendContext) -> None:
        self.ctx = context
        self.delay = context.config.get_int("testing.copy.delay.ms") / 1000
        self.fail_flag = context.config.get_str("testing.copy.fail.flag", "") or ""
        self.sync_fail_flag = context.config.get_str("testing.copy.fail.sync.flag", "") or ""

    def init(self, checkpoint: Checkpoint | None) -> None:
        pass

    def snapshot(self, checkpoint_id: CheckpointId) -> dict[str, str]:
        return {}

    def upload(
        self, checkpoint_id: CheckpointId, snapshot_markers: Mapping[str, str]
    ) -> Future[dict[str, str]]:
        if self.sync_fail_flag and os.path.exists(self.sync_fail_flag):
            os.unlink(self.sync_fail_flag)
            raise OSError("injected synchronous upload failure")
        return commit_pool(len(self.ctx.stores)).submit(self._upload, str(checkpoint_id))

    def _upload(self, cid: str) -> dict[str, str]:
        time.sleep(self.delay)
        if self.fail_flag and os.path.exists(self.fail_flag):
            os.unlink(self.fail_flag)
            raise OSError("injected upload failure")
        for store in self.ctx.stores:
            target = _remote(self.ctx, store) / cid
            staging = target.with_name(cid + ".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(self.ctx.local.checkpoint_dir(store, cid), staging)
            os.replace(staging, target)
        return {store: cid for store in self.ctx.stores}

    def clean_up(self, checkpoint_id: CheckpointId, markers: Mapping[str, str]) -> None:
        for store in self.ctx.stores:
            keep = markers.get(store)
            remote = _remote(self.ctx, store)
            if remote.is_dir() and keep:
                for child in remote.iterdir():
                    if child.name != keep:
                        shutil.rmtree(child, ignore_errors=True)


class CopyRestore(TaskRestoreManager):
    def __init__(self, context: BackendContext) -> None:
        self.ctx = context
        self.markers: Mapping[str, str] = {}

    def init(self, checkpoint: Checkpoint | None) -> None:
        self.markers = (
            {} if checkpoint is None else checkpoint.state_checkpoint_markers.get(NAME, {})
        )

    def restore(self) -> list[RestoreStats]:
        out = []
        for store in self.ctx.stores:
            start = time.monotonic()
            marker = self.markers.get(store)
            files = size = 0
            if marker:
                target = self.ctx.local.store_dir(store)
                shutil.copytree(_remote(self.ctx, store) / marker, target, dirs_exist_ok=True)
                (target / CHECKPOINT_FILE).unlink(missing_ok=True)
                for f in target.iterdir():
                    files += 1
                    size += f.stat().st_size
            elapsed = time.monotonic() - start
            out.append(RestoreStats(store, NAME, files, size, elapsed, unit="files"))
        return out


class CopyStateBackendFactory(StateBackendFactory):
    name = NAME
    config_keys = (
        ConfigKey("testing.copy.dir", None, "a directory path", "where the copies go"),
        ConfigKey("testing.copy.delay.ms", "0", "milliseconds >= 0", "each upload sleeps this"),
        ConfigKey(
            "testing.copy.fail.flag", None, "a file path", "while it exists, an upload fails"
        ),
        ConfigKey(
            "testing.copy.fail.sync.flag",
            None,
            "a file path",
            "while it exists, upload() itself raises",
        ),
    )
    backup_class = CopyBackup
    restore_class = CopyRestore
