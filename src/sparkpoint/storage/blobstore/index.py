"""The blob store's snapshot index: which blobs make up a store's checkpoint directory.

Immutable values with Samza's JSON form (``SnapshotIndexSerde``): dash-case fields, no version
field (an index with ``"schema-version": 1``, as earlier sparkpoint versions wrote, is read too),
permissions as ``rw-r--r--``, owner and group as names. A ``SnapshotIndex`` records
when and for which job, task, store and checkpoint it was made, the ``DirIndex`` of the
checkpoint directory, and the blob id of the previous snapshot index. A ``DirIndex`` lists the
files and sub-directories present (and those removed since the previous snapshot, whose blobs
the clean-up deletes). A ``FileIndex`` has the file's name, its blobs with their offsets within
the file, its metadata and its CRC32 checksum.

Everything read from a blob store is untrusted: names must be plain names (no ``/``, no ``..``,
not empty, no NUL), and a malformed index is an :class:`InvalidSnapshotIndex` naming what is
wrong, never a partial result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.errors import SparkpointError

SCHEMA_VERSION = 1


class InvalidSnapshotIndex(SparkpointError, ValueError):
    """A snapshot index (or part of one) that is malformed or unsafe."""


def check_name(name: Any, what: str) -> str:
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
    ):
        raise InvalidSnapshotIndex(f"unsafe {what} name {name!r} in snapshot index")
    return name


def _get(data: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise InvalidSnapshotIndex(f"{where}: missing field {key!r}")
    value = data[key]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise InvalidSnapshotIndex(f"{where}: field {key!r} must be {kind.__name__}")
    return value


@dataclass(frozen=True)
class FileMetadata:
    creation_time_millis: int
    last_modified_time_millis: int
    size: int
    owner: str
    group: str
    permissions: str  # octal ("644") as sparkpoint writes it, or Samza's "rw-r--r--"

    @property
    def mode(self) -> int:
        """The permission bits, from either form."""
        return parse_permissions(self.permissions)

    def to_json(self) -> dict[str, Any]:
        return {
            "creation-time-millis": self.creation_time_millis,
            "last-modified-time-millis": self.last_modified_time_millis,
            "size": self.size,
            "owner": self.owner,
            "group": self.group,
            "permissions": self.permissions,
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> FileMetadata:
        size = _get(d, "size", int, where)
        if size < 0:
            raise InvalidSnapshotIndex(f"{where}: negative size")
        permissions = _get(d, "permissions", str, where)
        try:
            parse_permissions(permissions)
        except ValueError as exc:
            raise InvalidSnapshotIndex(f"{where}: {exc}") from None
        return cls(
            _get(d, "creation-time-millis", int, where),
            _get(d, "last-modified-time-millis", int, where),
            size,
            _get(d, "owner", str, where),
            _get(d, "group", str, where),
            permissions,
        )


_RWX = re.compile(r"[r-][w-][x-][r-][w-][x-][r-][w-][x-]")


def format_permissions(mode: int) -> str:
    """Mode bits as ``rw-r--r--`` (Samza's PosixFilePermissions form)."""
    return "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))


def parse_permissions(text: str) -> int:
    """``"644"`` (octal) or ``"rw-r--r--"`` (POSIX, as Samza writes them) to mode bits."""
    if re.fullmatch(r"[0-7]{1,4}", text):
        return int(text, 8)
    if _RWX.fullmatch(text):
        return sum(1 << (8 - i) for i, c in enumerate(text) if c != "-")
    raise ValueError(f"permissions {text!r} are neither octal (644) nor rwx (rw-r--r--)")


@dataclass(frozen=True)
class FileBlob:
    blob_id: str
    offset: int

    def to_json(self) -> dict[str, Any]:
        return {"blob-id": self.blob_id, "offset": self.offset}


@dataclass(frozen=True)
class FileIndex:
    file_name: str
    blobs: tuple[FileBlob, ...]
    metadata: FileMetadata
    checksum: int

    def to_json(self) -> dict[str, Any]:
        return {
            "file-name": self.file_name,
            "blobs": [b.to_json() for b in self.blobs],
            "file-metadata": self.metadata.to_json(),
            "checksum": self.checksum,
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> FileIndex:
        name = check_name(_get(d, "file-name", str, where), "file")
        here = f"{where}/{name}"
        blobs = tuple(
            FileBlob(
                check_name(_get(b, "blob-id", str, here), "blob"), _get(b, "offset", int, here)
            )
            for b in _get(d, "blobs", list, here)
        )
        return cls(
            name,
            blobs,
            FileMetadata.from_json(_get(d, "file-metadata", dict, here), here),
            _get(d, "checksum", int, here),
        )


@dataclass(frozen=True)
class DirIndex:
    dir_name: str
    files_present: tuple[FileIndex, ...] = ()
    files_removed: tuple[FileIndex, ...] = ()
    sub_dirs_present: tuple[DirIndex, ...] = ()
    sub_dirs_removed: tuple[DirIndex, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "dir-name": self.dir_name,
            "files-present": [f.to_json() for f in self.files_present],
            "files-removed": [f.to_json() for f in self.files_removed],
            "sub-dirs-present": [d.to_json() for d in self.sub_dirs_present],
            "sub-dirs-removed": [d.to_json() for d in self.sub_dirs_removed],
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "", root: bool = True) -> DirIndex:
        name = _get(d, "dir-name", str, where or "dir-index")
        if not root:
            check_name(name, "directory")
        here = f"{where}/{name}" if where else name or "."

        def files(key: str) -> tuple[FileIndex, ...]:
            return tuple(FileIndex.from_json(f, here) for f in _get(d, key, list, here))

        def dirs(key: str) -> tuple[DirIndex, ...]:
            return tuple(DirIndex.from_json(s, here, root=False) for s in _get(d, key, list, here))

        present = files("files-present")
        names = [f.file_name for f in present]
        if len(set(names)) != len(names):
            raise InvalidSnapshotIndex(f"{here}: duplicate file names")
        return cls(
            name,
            present,
            files("files-removed"),
            dirs("sub-dirs-present"),
            dirs("sub-dirs-removed"),
        )

    def all_files(self, prefix: str = "") -> Iterator[tuple[str, FileIndex]]:
        """(relative path, file) of every file present, recursively."""
        for f in self.files_present:
            yield prefix + f.file_name, f
        for sub in self.sub_dirs_present:
            yield from sub.all_files(f"{prefix}{sub.dir_name}/")

    def all_removed(self) -> Iterator[FileIndex]:
        """Every file removed since the previous snapshot, including whole removed sub-dirs."""
        yield from self.files_removed
        for sub in self.sub_dirs_removed:
            yield from (f for _, f in sub.all_files())
            yield from sub.all_removed()
        for sub in self.sub_dirs_present:
            yield from sub.all_removed()


@dataclass(frozen=True)
class SnapshotMetadata:
    checkpoint_id: str
    job_name: str
    job_id: str
    task_name: str
    store_name: str

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint-id": self.checkpoint_id,
            "job-name": self.job_name,
            "job-id": self.job_id,
            "task-name": self.task_name,
            "store-name": self.store_name,
        }


@dataclass(frozen=True)
class SnapshotIndex:
    creation_time_millis: int
    metadata: SnapshotMetadata
    dir_index: DirIndex
    prev_snapshot_index_blob_id: str | None = None
    version: int = field(default=SCHEMA_VERSION)

    def to_json(self) -> dict[str, Any]:
        return {
            "creation-time-millis": self.creation_time_millis,
            "snapshot-metadata": self.metadata.to_json(),
            "dir-index": self.dir_index.to_json(),
            "prev-snapshot-index-blob-id": self.prev_snapshot_index_blob_id,
        }

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def loads(cls, data: bytes, where: str = "snapshot index") -> SnapshotIndex:
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidSnapshotIndex(f"{where} is not valid JSON: {exc}") from exc
        version = d.get("schema-version", SCHEMA_VERSION) if isinstance(d, dict) else None
        if version != SCHEMA_VERSION:
            raise InvalidSnapshotIndex(f"{where}: unsupported schema version {version}")
        m = _get(d, "snapshot-metadata", dict, where)
        meta = SnapshotMetadata(
            *(
                _get(m, k, str, where)
                for k in ("checkpoint-id", "job-name", "job-id", "task-name", "store-name")
            )
        )
        prev = d.get("prev-snapshot-index-blob-id")
        if prev is not None:
            check_name(prev, "blob")
        index = cls(
            _get(d, "creation-time-millis", int, where),
            meta,
            DirIndex.from_json(_get(d, "dir-index", dict, where)),
            prev,
            version,
        )
        index.validate(where)
        return index

    def blobs_used(self) -> list[str]:
        """Blob ids of every file present: what this snapshot needs."""
        return [b.blob_id for _, f in self.dir_index.all_files() for b in f.blobs]

    def blobs_removed(self) -> list[str]:
        """Blob ids of the files removed since the previous snapshot: what its clean-up deletes."""
        return [b.blob_id for f in self.dir_index.all_removed() for b in f.blobs]

    def validate(self, where: str = "snapshot index") -> None:
        """Reject an index whose clean-up would delete a blob it still uses: no blob may be
        both in a file present and in a file removed."""
        shared = sorted(set(self.blobs_used()) & set(self.blobs_removed()))
        if shared:
            raise InvalidSnapshotIndex(
                f"{where}: blob(s) {', '.join(shared[:3])} are listed both as present and as "
                f"removed (deleting them would break this snapshot)"
            )
