"""The difference between a local directory and the previous snapshot's ``DirIndex``.

Files compare equal by name, size, permission bits and CRC32 (timestamps are ignored). With
``skip_sst_checksum`` an ``.sst`` file (immutable in RocksDB) compares by name, size, permissions
and modification time only (restores set it from the index), which avoids reading unchanged
gigabytes at every commit. Files are compared at
all only while the directory holds the same RocksDB database as the previous snapshot (same
``IDENTITY`` file); a database rebuilt from scratch reuses SST names, so it is uploaded in full.
``CHECKPOINT`` and ``OFFSET`` files are never part of a snapshot.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkpoint.storage.blobstore.index import (
    DirIndex,
    FileBlob,
    FileIndex,
    FileMetadata,
    format_permissions,
)
from sparkpoint.storage.kv.rocksdb import IDENTITY

IGNORED = frozenset({"CHECKPOINT", "OFFSET"})
CHUNK = 1 << 20


def crc32_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _name(lookup: Callable[[int], Any], ident: int) -> str:
    try:
        return str(lookup(ident)[0])
    except (KeyError, OverflowError):
        return str(ident)  # no name for this id on this host


def metadata_of(path: Path) -> FileMetadata:
    """A file's metadata as Samza records it: owner and group names, ``rw-r--r--``."""
    st = path.stat()
    return FileMetadata(
        int(st.st_ctime * 1000),
        int(st.st_mtime * 1000),
        st.st_size,
        _name(pwd.getpwuid, st.st_uid),
        _name(grp.getgrgid, st.st_gid),
        format_permissions(stat.S_IMODE(st.st_mode)),
    )


def same_file(path: Path, meta: FileMetadata, old: FileIndex, skip_sst_checksum: bool) -> bool:
    if old.metadata.size != meta.size or old.metadata.mode != meta.mode:
        return False
    if skip_sst_checksum and path.name.endswith(".sst"):
        # an immutable SST is known by name, size and modification time: two executors that
        # continued one database can each write an SST of the same name and size
        return old.metadata.last_modified_time_millis == meta.last_modified_time_millis
    return crc32_of(path) == old.checksum


def _same_database(local: Path, previous: DirIndex | None) -> bool:
    old = (
        next((f for f in previous.files_present if f.file_name == IDENTITY), None)
        if previous
        else None
    )
    path = local / IDENTITY
    return old is not None and path.is_file() and crc32_of(path) == old.checksum


@dataclass
class DirDiff:
    """What changed in one directory; ``added`` files need uploading."""

    name: str
    added: list[tuple[Path, FileMetadata]] = field(default_factory=list)
    retained: list[FileIndex] = field(default_factory=list)
    removed: list[FileIndex] = field(default_factory=list)
    sub_dirs: list[DirDiff] = field(default_factory=list)
    sub_dirs_removed: list[DirIndex] = field(default_factory=list)

    def files_to_upload(self) -> list[Path]:
        out = [p for p, _ in self.added]
        for sub in self.sub_dirs:
            out.extend(sub.files_to_upload())
        return out

    def bytes_to_upload(self) -> int:
        return sum(m.size for _, m in self.added) + sum(s.bytes_to_upload() for s in self.sub_dirs)

    def retained_bytes(self) -> int:
        return sum(f.metadata.size for f in self.retained) + sum(
            s.retained_bytes() for s in self.sub_dirs
        )

    def to_index(self, blob_ids: dict[Path, str], checksums: dict[Path, int]) -> DirIndex:
        """The new ``DirIndex``, given the blob id and checksum of every uploaded file."""
        added = tuple(
            FileIndex(p.name, (FileBlob(blob_ids[p], 0),), meta, checksums[p])
            for p, meta in self.added
        )
        return DirIndex(
            self.name,
            tuple(sorted(added + tuple(self.retained), key=lambda f: f.file_name)),
            tuple(self.removed),
            tuple(s.to_index(blob_ids, checksums) for s in self.sub_dirs),
            tuple(self.sub_dirs_removed),
        )


def diff_dir(
    local: Path, previous: DirIndex | None, *, skip_sst_checksum: bool = True, name: str = ""
) -> DirDiff:
    """Compare ``local`` with ``previous`` (``None``: everything is new).

    A directory that holds another database than ``previous`` describes (rebuilt from a
    changelog: another ``IDENTITY``) is uploaded in full and every previous file is removed, so a
    new snapshot never reuses a blob of a snapshot whose files it did not come from.
    """
    if previous is not None and not name and not _same_database(local, previous):
        fresh = diff_dir(local, None, skip_sst_checksum=skip_sst_checksum)
        fresh.removed.extend(previous.files_present)
        fresh.sub_dirs_removed.extend(previous.sub_dirs_present)
        return fresh
    old_files = {f.file_name: f for f in previous.files_present} if previous else {}
    old_dirs = {d.dir_name: d for d in previous.sub_dirs_present} if previous else {}
    result = DirDiff(name)
    seen_files, seen_dirs = set(), set()
    for entry in sorted(os.scandir(local), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            seen_dirs.add(entry.name)
            result.sub_dirs.append(
                diff_dir(
                    path,
                    old_dirs.get(entry.name),
                    skip_sst_checksum=skip_sst_checksum,
                    name=entry.name,
                )
            )
        elif entry.is_file(follow_symlinks=False) and entry.name not in IGNORED:
            seen_files.add(entry.name)
            meta = metadata_of(path)
            old = old_files.get(entry.name)
            if old is not None and same_file(path, meta, old, skip_sst_checksum):
                result.retained.append(old)
            else:
                result.added.append((path, meta))
                if old is not None:
                    result.removed.append(old)  # its old blobs are no longer needed
    result.removed.extend(f for n, f in old_files.items() if n not in seen_files)
    result.sub_dirs_removed.extend(d for n, d in old_dirs.items() if n not in seen_dirs)
    return result
