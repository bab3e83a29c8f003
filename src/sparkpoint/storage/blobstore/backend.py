"""The blob store state backend: incremental snapshots of a store's files.

Backup: the upload (asynchronous, on the commit pool) diffs the store's new local checkpoint
directory against the previous snapshot (from the last committed checkpoint), uploads only the
added or changed files in parallel, then the new ``SnapshotIndex`` (which names the previous
one); the marker is the index's blob id. Every upload carries a TTL until a commit adopts it.

Clean-up (after the checkpoint is written; idempotent, re-run after a restart): remove the TTL
of the new index and of every blob it uses, delete the blobs of files it marks removed, and
delete the previous index. Stores that no longer use the blob store lose their remote snapshot
the same way. Expired uploads (a crash mid-upload) are swept when the job starts.

Restore: download the index, then every file the executor does not already have identical in
another local checkpoint of the store (those are hard-linked), in parallel, verifying size and
checksum, into a staging directory that is renamed into place. Names in the index are untrusted:
nothing is written outside the store's directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.errors import RestoreError
from sparkpoint.model import JobModel, TaskName
from sparkpoint.storage.backend import (
    BackendContext,
    RestoreStats,
    StateBackendAdmin,
    StateBackendFactory,
    TaskBackupManager,
    TaskRestoreManager,
    store_backends,
)
from sparkpoint.storage.blobstore.diff import crc32_of, diff_dir, metadata_of, same_file
from sparkpoint.storage.blobstore.index import (
    FileIndex,
    InvalidSnapshotIndex,
    SnapshotIndex,
    SnapshotMetadata,
)
from sparkpoint.storage.blobstore.manager import (
    BlobNotFound,
    BlobStoreManager,
    manager_from_config,
)
from sparkpoint.storage.commit import commit_pool
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)

NAME = "blobstore"
FILE_THREADS = 8


def blob_manager(config: Config) -> BlobStoreManager:
    return manager_from_config(config, f"file://{config.data_dir / 'blobs'}")


def load_index(blobs: BlobStoreManager, blob_id: str, where: str) -> SnapshotIndex:
    try:
        return SnapshotIndex.loads(blobs.get_bytes(blob_id), f"{where}: snapshot index {blob_id}")
    except InvalidSnapshotIndex as exc:
        raise RestoreError(str(exc)) from exc


class BlobStoreBackupManager(TaskBackupManager):
    def __init__(self, context: BackendContext) -> None:
        self.ctx = context
        self.blobs = blob_manager(context.config)
        self.skip_sst = context.config.get_bool("blob.store.sst.checksum.skip")
        self.previous: dict[str, tuple[str, SnapshotIndex]] = {}
        self._stats: dict[str, int] = {}

    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    def _where(self, store: str) -> str:
        return f"task {self.ctx.task.name} store {store}"

    def init(self, checkpoint: Checkpoint | None) -> None:
        markers = {} if checkpoint is None else checkpoint.state_checkpoint_markers.get(NAME, {})
        for store in self.ctx.stores:
            if store not in markers:
                continue
            try:
                index = load_index(self.blobs, markers[store], self._where(store))
            except BlobNotFound:
                log.warning(
                    "%s: the previous snapshot index %s is missing; the next snapshot uploads "
                    "every file",
                    self._where(store),
                    markers[store],
                )
                continue
            self.previous[store] = (markers[store], index)

    def snapshot(self, checkpoint_id: CheckpointId) -> dict[str, str]:
        return {}  # the local checkpoint directory is the snapshot; the upload reads it

    def upload(
        self, checkpoint_id: CheckpointId, snapshot_markers: Mapping[str, str]
    ) -> Future[dict[str, str]]:
        return commit_pool(len(self.ctx.stores)).submit(self._upload, checkpoint_id)

    def _upload(self, checkpoint_id: CheckpointId) -> dict[str, str]:
        markers = {}
        self._stats = {}
        for store in self.ctx.stores:
            started = time.monotonic()
            local = self.ctx.local.checkpoint_dir(store, str(checkpoint_id))
            prev_id, prev = self.previous.get(store, (None, None))
            diff = diff_dir(
                local, prev.dir_index if prev else None, skip_sst_checksum=self.skip_sst
            )
            files = diff.files_to_upload()
            with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="sparkpoint-upload") as pool:
                ids = dict(zip(files, pool.map(self.blobs.put_file, files), strict=True))
                sums = dict(zip(files, pool.map(crc32_of, files), strict=True))
            meta = SnapshotMetadata(
                str(checkpoint_id),
                self.ctx.config.job_name,
                self.ctx.config.job_id,
                self.ctx.task.name.name,
                store,
            )
            index = SnapshotIndex(int(time.time() * 1000), meta, diff.to_index(ids, sums), prev_id)
            index.validate(self._where(store))
            markers[store] = self.blobs.put_bytes(index.dumps())
            for key, value in (
                ("files-uploaded", len(files)),
                ("bytes-uploaded", diff.bytes_to_upload()),
                ("bytes-retained", diff.retained_bytes()),
            ):
                self._stats[key] = self._stats.get(key, 0) + value
            log.info(
                "%s: uploaded %d files (%d bytes), kept %d bytes, in %.2fs",
                self._where(store),
                len(files),
                diff.bytes_to_upload(),
                diff.retained_bytes(),
                time.monotonic() - started,
            )
        return markers

    def clean_up(self, checkpoint_id: CheckpointId, markers: Mapping[str, str]) -> None:
        for store, index_id in markers.items():
            if store not in self.ctx.stores:
                continue  # no longer backed up here: the admin deletes it at job start
            index = load_index(self.blobs, index_id, self._where(store))
            missing = []
            for blob_id in index.blobs_used():
                try:
                    self.blobs.remove_ttl(blob_id)
                except BlobNotFound:
                    missing.append(blob_id)
            self.blobs.remove_ttl(index_id)  # last: an index without a TTL is fully adopted
            if missing:  # nothing left to protect; restore from this snapshot will fail
                log.warning(
                    "%s: snapshot %s of checkpoint %s misses %d blob(s) (%s); a restore from it "
                    "falls back to the next restore backend",
                    self._where(store),
                    index_id,
                    checkpoint_id,
                    len(missing),
                    ", ".join(missing[:3]),
                )
            for blob_id in index.blobs_removed():
                self.blobs.delete(blob_id)
            self._delete_previous(index, self._where(store))

    def _delete_previous(self, index: SnapshotIndex, where: str) -> None:
        """Delete the snapshot indexes this one replaces. Normally that is just the previous
        one; when a commit was built on one that was written in the same step (whose own
        clean-up never ran), that one's removed files and its previous index go too."""
        prev = index.prev_snapshot_index_blob_id
        while prev and self.blobs.exists(prev):
            older = load_index(self.blobs, prev, where)
            before = older.prev_snapshot_index_blob_id
            if before and self.blobs.exists(before):  # ``older`` was never cleaned up
                for blob_id in older.blobs_removed():
                    self.blobs.delete(blob_id)
            self.blobs.delete(prev)
            prev = before


def delete_snapshot(blobs: BlobStoreManager, index_id: str, where: str) -> None:
    """Delete a snapshot index and every blob it uses (a store no longer backed up here)."""
    for blob_id in load_index(blobs, index_id, where).blobs_used():
        blobs.delete(blob_id)
    blobs.delete(index_id)


def fetch_file(blobs: BlobStoreManager, f: FileIndex, dest: Path, where: str) -> None:
    """Download the file ``f`` of a snapshot to ``dest`` and verify its size and checksum:
    :class:`RestoreError` naming ``where`` if it is corrupt, :class:`BlobNotFound` if its blob
    is gone. A Samza index lists an empty file without blobs, and may split a file over
    several blobs: they are joined in the order of their offsets (Samza's restore does the
    same), and the whole file is verified."""
    if not f.blobs and f.metadata.size == 0:
        dest.touch()
        return
    parts = sorted(f.blobs, key=lambda b: b.offset)
    if len(parts) == 1:
        blobs.get_file(parts[0].blob_id, dest)
    else:
        with open(dest, "wb") as out:
            for i, blob in enumerate(parts):
                part = dest.with_name(f"{dest.name}.part{i}")  # in the staging directory
                blobs.get_file(blob.blob_id, part)
                with open(part, "rb") as data:
                    shutil.copyfileobj(data, out)
                part.unlink()
    size = dest.stat().st_size if dest.exists() else 0
    if size != f.metadata.size or crc32_of(dest) != f.checksum:
        ids = ", ".join(b.blob_id for b in parts) or "none"
        raise RestoreError(
            f"{where}: file {f.file_name} from blob(s) {ids} is corrupt "
            f"(size {size}, expected {f.metadata.size}, or checksum mismatch)"
        )


class BlobStoreRestoreManager(TaskRestoreManager):
    def __init__(self, context: BackendContext) -> None:
        self.ctx = context
        self.blobs = blob_manager(context.config)
        self.markers: Mapping[str, str] = {}

    def init(self, checkpoint: Checkpoint | None) -> None:
        self.markers = (
            {} if checkpoint is None else checkpoint.state_checkpoint_markers.get(NAME, {})
        )

    def restore(self) -> list[RestoreStats]:
        return [self._restore(store) for store in self.ctx.stores]

    def local_checkpoint_mismatch(self, store: str, directory: Path) -> str | None:
        """Compare the local checkpoint with the snapshot its checkpoint names: same files,
        sizes and permissions, same checksums (SST files: same database and sizes)."""
        marker = self.markers.get(store)
        if marker is None:
            return None
        where = f"task {self.ctx.task.name} store {store}"
        index = load_index(self.blobs, marker, where)
        diff = diff_dir(directory, index.dir_index)
        changed = [p.name for p in diff.files_to_upload()] + [f.file_name for f in diff.removed]
        changed += [d.dir_name for d in diff.sub_dirs_removed]
        if changed:
            return f"differs from snapshot {marker} in {', '.join(sorted(changed)[:5])}"
        return None

    def _local_copies(self, store: str) -> dict[str, list[Path]]:
        """Files of this store's other local checkpoints, by relative path (reusable if equal)."""
        out: dict[str, list[Path]] = {}
        parent = self.ctx.local.checkpoints_dir(store)
        if parent.is_dir():
            for ckpt in parent.iterdir():
                for path in ckpt.rglob("*"):
                    if path.is_file():
                        out.setdefault(str(path.relative_to(ckpt)), []).append(path)
        return out

    def _restore(self, store: str) -> RestoreStats:
        started = time.monotonic()
        where = f"task {self.ctx.task.name} store {store}"
        marker = self.markers.get(store)
        target = self.ctx.local.store_dir(store)
        if marker is None:
            return RestoreStats(store, NAME)
        index = load_index(self.blobs, marker, where)
        if index.metadata.store_name != store:
            raise RestoreError(
                f"{where}: snapshot {marker} belongs to store {index.metadata.store_name}"
            )
        staging = self.ctx.local.staging_dir(store)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        root = staging.resolve()
        copies = self._local_copies(store)
        downloads: list[tuple[Path, FileIndex]] = []
        reused = 0
        for rel, f in index.dir_index.all_files():
            dest = (staging / rel).resolve()
            if not dest.is_relative_to(root) or dest == root:
                raise RestoreError(
                    f"{where}: snapshot {marker} names a file outside the store: {rel!r}"
                )
            dest.parent.mkdir(parents=True, exist_ok=True)
            local = next(
                (p for p in copies.get(rel, []) if same_file(p, metadata_of(p), f, False)), None
            )
            if local is not None:
                os.link(local, dest)
                reused += 1
            else:
                downloads.append((dest, f))
        with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="sparkpoint-restore") as pool:
            list(pool.map(lambda item: self._download(where, *item), downloads))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        size = sum(f.metadata.size for _, f in downloads)
        log.info(
            "%s: restored %d files (%d bytes) from the blob store, reused %d local files",
            where,
            len(downloads),
            size,
            reused,
        )
        elapsed = time.monotonic() - started
        return RestoreStats(store, NAME, len(downloads), size, elapsed, unit="files")

    def _download(self, where: str, dest: Path, f: FileIndex) -> None:
        fetch_file(self.blobs, f, dest, where)
        os.chmod(dest, f.metadata.mode)
        mtime_ns = f.metadata.last_modified_time_millis * 1_000_000
        os.utime(dest, ns=(mtime_ns, mtime_ns))  # the next diff knows the file by it


class BlobStoreAdmin(StateBackendAdmin):
    def __init__(self, config: Config, model: JobModel, systems: Systems) -> None:
        self.config = config

    def delete_unused(self, checkpoints: Mapping[TaskName, Checkpoint]) -> None:
        """Delete the snapshots of stores that are gone from the job or no longer back up to
        the blob store (moved to another backend), as named by the tasks' last checkpoints."""
        blobs: BlobStoreManager | None = None
        for task, checkpoint in sorted(checkpoints.items()):
            for store, index_id in checkpoint.state_checkpoint_markers.get(NAME, {}).items():
                if store in self.config.stores and NAME in store_backends(
                    self.config, store, "backup"
                ):
                    continue
                blobs = blobs or blob_manager(self.config)
                where = f"task {task.name} store {store}"
                with contextlib.suppress(BlobNotFound):
                    delete_snapshot(blobs, index_id, where)
                    log.info("%s: deleted the snapshot of a store no longer backed up here", where)

    def create_resources(self) -> None:
        pass  # a blob store needs nothing created; validate_resources checks it is reachable

    def compact(
        self, checkpoints: Mapping[TaskName, Checkpoint], *, during_run: bool = False
    ) -> None:
        """At job start, sweep expired uploads (a crash mid-upload), after adopting everything
        the tasks' last checkpoints use: a checkpoint whose clean-up never ran (the driver died
        right after writing it) still has TTLs on its new blobs, which must not be swept. A
        snapshot whose index has no TTL left was adopted whole by its clean-up and is not read
        again. Nothing during a run (its tasks' clean-ups delete what they replace)."""
        if during_run:
            return
        blobs = blob_manager(self.config)
        for task, checkpoint in sorted(checkpoints.items()):
            for store, index_id in checkpoint.state_checkpoint_markers.get(NAME, {}).items():
                where = f"task {task.name} store {store}"
                if blobs.exists(index_id) and not blobs.has_ttl(index_id):
                    continue  # its clean-up adopted it (the index is adopted last)
                try:
                    used = load_index(blobs, index_id, where).blobs_used()
                    for blob_id in [index_id, *used]:
                        blobs.remove_ttl(blob_id)
                except (BlobNotFound, RestoreError) as exc:
                    log.warning(
                        "%s: cannot adopt snapshot %s before the sweep: %s", where, index_id, exc
                    )
        swept = blobs.sweep()
        if swept:
            log.info("blob store: deleted %d expired uploads that no commit adopted", len(swept))

    def validate_resources(self) -> None:
        blob_manager(self.config)  # the URL is reachable and usable


class BlobStoreStateBackendFactory(StateBackendFactory):
    name = NAME
    # a restore's downloads (on a pool of threads already) and zlib.crc32 release the GIL
    restores_off_the_gil = True

    backup_class = BlobStoreBackupManager
    restore_class = BlobStoreRestoreManager
    admin_class = BlobStoreAdmin
