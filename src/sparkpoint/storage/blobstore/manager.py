"""Blob store managers: put, get, delete and adopt (remove the TTL of) immutable blobs.

One implementation over fsspec serves every store: a local directory (the embedded default,
``<job.data.dir>/blobs``), ``s3://``, ``abfs://``, ``gs://`` and more (``blob.store.url``; the
scheme's fsspec package must be installed, e.g. ``s3fs`` or ``adlfs``). Options for the
filesystem come from ``blob.store.options.<name>`` and the usual environment variables; they are
never logged.

TTL scheme (portable to every store): an uploaded blob gets a small *TTL marker* object
``<root>/ttl/<blob id>`` holding its expiry time (epoch ms). A commit that adopts the blob
removes the marker. :meth:`BlobStoreManager.sweep` deletes every blob whose marker has expired,
so uploads of a commit that never completed (a crash mid-upload) disappear without any
checkpoint ever naming them. Blob ids are random, so a blob is never overwritten.

Every operation is retried on errors other than a missing blob, up to ``blob.store.max.retries``
times or ``blob.store.retry.max.duration.ms``, with exponential backoff and full jitter starting
at ``blob.store.retry.backoff.ms``.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.refs import load_reference

log = logging.getLogger(__name__)
T = TypeVar("T")


class BlobNotFound(SparkpointError, FileNotFoundError):
    """A blob that does not exist (or no longer exists) in the blob store."""


class BlobStoreError(SparkpointError):
    """A blob store operation failed after its retries."""


#: options every fsspec filesystem takes through its base class
_FSSPEC_BASE_OPTIONS = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "asynchronous",
        "loop",
    }
)


def _options_of(cls: type) -> set[str]:
    """The keyword options a filesystem class's constructors name, over its whole hierarchy."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names |= {p.name for p in params if p.kind in kinds and p.name != "self"}
    return names | _FSSPEC_BASE_OPTIONS


def check_filesystem(url: str, options: Mapping[str, Any]) -> None:
    """Refuse a ``blob.store.url`` whose scheme no installed fsspec filesystem serves, and a
    ``blob.store.options.<name>`` its filesystem class does not take (a typo would otherwise
    be passed on and ignored), each with a :class:`ConfigError` naming the key and the fix."""
    import fsspec

    protocol, _path = fsspec.core.split_protocol(url)
    protocol = protocol or "file"
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ConfigError(
            f"blob.store.url={url!r}: no fsspec filesystem serves scheme {protocol!r} (known: "
            f"file, s3, abfs/az, gs, hdfs, memory, ...)"
        ) from None
    except ImportError as exc:
        raise ConfigError(
            f"blob.store.url={url!r}: scheme {protocol!r} needs a package that is not "
            f"installed: {exc}"
        ) from None
    known = _options_of(cls)
    for name in sorted(options):
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean blob.store.options.{close[0]}?" if close else ""
            raise ConfigError(
                f"blob.store.options.{name}: {cls.__name__} ({protocol}://) takes no option "
                f"{name!r}{hint} (it takes: {', '.join(sorted(known))})"
            )


class BlobStoreManager:
    """Blobs under one fsspec URL. Thread-safe (fsspec filesystems are)."""

    def __init__(
        self,
        url: str,
        *,
        options: Mapping[str, Any] | None = None,
        ttl_ms: int = 24 * 3600 * 1000,
        max_retries: int = 5,
        max_retry_ms: int = 60_000,
        backoff_ms: int = 100,
    ) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url, **dict(options or {}))
        self.root = str(root).rstrip("/")
        self.ttl_ms = ttl_ms
        self.max_retries = max_retries
        self.max_retry_ms = max_retry_ms
        self.backoff_ms = backoff_ms
        self.fs.makedirs(f"{self.root}/blobs", exist_ok=True)
        self.fs.makedirs(f"{self.root}/ttl", exist_ok=True)

    def _blob(self, blob_id: str) -> str:
        return f"{self.root}/blobs/{blob_id}"

    def _ttl(self, blob_id: str) -> str:
        return f"{self.root}/ttl/{blob_id}"

    def _retry(self, what: str, op: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.max_retry_ms / 1000
        attempt = 0
        while True:
            try:
                return op()
            except (FileNotFoundError, BlobNotFound):
                raise
            except Exception as exc:
                attempt += 1
                if attempt > self.max_retries or time.monotonic() >= deadline:
                    raise BlobStoreError(f"{what} failed after {attempt} attempts: {exc}") from exc
                delay = random.uniform(0, self.backoff_ms * 2 ** (attempt - 1)) / 1000
                log.warning("%s failed (%s); retry %d in %.2fs", what, exc, attempt, delay)
                time.sleep(delay)

    def put_file(self, path: Path) -> str:
        """Upload a local file as a new blob with a TTL; returns its blob id."""
        blob_id = uuid.uuid4().hex
        self._mark_ttl(blob_id)
        self._retry(
            f"put {path.name} as {blob_id}",
            lambda: self.fs.put_file(str(path), self._blob(blob_id)),
        )
        return blob_id

    def put_bytes(self, data: bytes) -> str:
        """Upload ``data`` as a new blob with a TTL; returns its blob id."""
        blob_id = uuid.uuid4().hex
        self._mark_ttl(blob_id)
        self._retry(f"put blob {blob_id}", lambda: self.fs.pipe_file(self._blob(blob_id), data))
        return blob_id

    def _mark_ttl(self, blob_id: str) -> None:
        expiry = str(int(time.time() * 1000) + self.ttl_ms).encode()
        self._retry(f"mark TTL of {blob_id}", lambda: self.fs.pipe_file(self._ttl(blob_id), expiry))

    def get_file(self, blob_id: str, destination: Path) -> None:
        """Download a blob to ``destination``; :class:`BlobNotFound` if it does not exist."""
        try:
            self._retry(
                f"get {blob_id}", lambda: self.fs.get_file(self._blob(blob_id), str(destination))
            )
        except FileNotFoundError as exc:
            raise BlobNotFound(f"blob {blob_id} not found in {self.url}") from exc

    def get_bytes(self, blob_id: str) -> bytes:
        try:
            data: bytes = self._retry(
                f"get {blob_id}", lambda: self.fs.cat_file(self._blob(blob_id))
            )
            return data
        except FileNotFoundError as exc:
            raise BlobNotFound(f"blob {blob_id} not found in {self.url}") from exc

    def exists(self, blob_id: str) -> bool:
        return bool(self._retry(f"stat {blob_id}", lambda: self.fs.exists(self._blob(blob_id))))

    def delete(self, blob_id: str) -> None:
        """Delete a blob and its TTL marker. Idempotent."""
        for path in (self._blob(blob_id), self._ttl(blob_id)):
            with contextlib.suppress(FileNotFoundError):
                self._retry(f"delete {path}", lambda p=path: self.fs.rm_file(p))  # type: ignore[misc]

    def remove_ttl(self, blob_id: str) -> None:
        """Adopt a blob: it no longer expires. Idempotent; :class:`BlobNotFound` if gone."""
        if not self.exists(blob_id):
            raise BlobNotFound(f"blob {blob_id} not found in {self.url}: cannot remove its TTL")
        with contextlib.suppress(FileNotFoundError):
            self._retry(f"remove TTL of {blob_id}", lambda: self.fs.rm_file(self._ttl(blob_id)))

    def has_ttl(self, blob_id: str) -> bool:
        return bool(
            self._retry(f"stat TTL of {blob_id}", lambda: self.fs.exists(self._ttl(blob_id)))
        )

    def sweep(self, now_ms: int | None = None) -> list[str]:
        """Delete every blob whose TTL has expired (uploads no commit adopted); returns them."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        expired: list[str] = []
        try:
            markers = self._retry(
                "list TTL markers", lambda: self.fs.ls(f"{self.root}/ttl", detail=False)
            )
        except FileNotFoundError:
            return expired  # object stores have no empty "directories": nothing to sweep
        for path in markers:
            blob_id = str(path).rstrip("/").rsplit("/", 1)[-1]
            try:
                expiry = int(self._retry(f"read {path}", lambda p=path: self.fs.cat_file(p)))  # type: ignore[misc]
            except (FileNotFoundError, ValueError):
                continue
            if expiry <= now_ms:
                self.delete(blob_id)
                expired.append(blob_id)
        return expired

    def close(self) -> None:
        """Nothing to release for fsspec filesystems; kept for the interface. Idempotent."""


def manager_from_config(config: Mapping[str, str], default_url: str) -> BlobStoreManager:
    """The job's blob store manager (``blob.store.*`` keys). ``blob.store.manager.factory`` is
    ``fsspec`` (the default) or ``module:function`` taking ``(config, default_url)``, such as
    the fault kit's :func:`sparkpoint.testing.faults.flaky_blob_store`."""
    factory = config.get("blob.store.manager.factory") or "fsspec"
    if factory != "fsspec":
        make = load_reference(factory, f"blob.store.manager.factory={factory!r}")
        manager: BlobStoreManager = make(config, default_url)
        return manager
    prefix = "blob.store.options."
    options = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}
    url = config.get("blob.store.url") or default_url
    check_filesystem(url, options)
    return BlobStoreManager(
        url,
        options=options,
        ttl_ms=int(config.get("blob.store.ttl.ms") or 24 * 3600 * 1000),
        max_retries=int(config.get("blob.store.max.retries") or 5),
        max_retry_ms=int(config.get("blob.store.retry.max.duration.ms") or 60_000),
        backoff_ms=int(config.get("blob.store.retry.backoff.ms") or 100),
    )
