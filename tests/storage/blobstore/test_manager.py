"""The blob store manager contract, run against every store the tests can start."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.storage.blobstore.manager import (
    BlobNotFound,
    BlobStoreError,
    BlobStoreManager,
    manager_from_config,
)
from sparkpoint.testing.services import AzuriteBlob, MotoS3


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    with MotoS3(tmp_path_factory.mktemp("moto")) as service:
        yield service


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteBlob]:
    with AzuriteBlob(tmp_path_factory.mktemp("azurite")) as service:
        yield service


@pytest.fixture(params=["local", "s3", "azure"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStoreManager]:
    retry = {"blob.store.retry.backoff.ms": "1", "blob.store.max.retries": "3"}
    name = f"t{uuid.uuid4().hex[:12]}"
    if request.param == "local":
        config = {"blob.store.url": f"file://{tmp_path / 'blobs'}"}
    elif request.param == "s3":
        config = request.getfixturevalue("s3").config(name)
    else:
        config = request.getfixturevalue("azurite").config(name)
    manager = manager_from_config({**config, **retry}, "")
    yield manager
    manager.close()


class TestBlobStoreContract:
    def test_put_get_round_trip(self, blobs: BlobStoreManager, tmp_path: Path) -> None:
        src = tmp_path / "f"
        src.write_bytes(b"x" * 10_000)
        a = blobs.put_file(src)
        b = blobs.put_bytes(b"hello")
        assert a != b
        dest = tmp_path / "out"
        blobs.get_file(a, dest)
        assert dest.read_bytes() == b"x" * 10_000
        assert blobs.get_bytes(b) == b"hello"

    def test_missing_blob(self, blobs: BlobStoreManager, tmp_path: Path) -> None:
        with pytest.raises(BlobNotFound, match="blob nope not found"):
            blobs.get_bytes("nope")
        with pytest.raises(BlobNotFound):
            blobs.get_file("nope", tmp_path / "x")
        with pytest.raises(BlobNotFound, match="cannot remove its TTL"):
            blobs.remove_ttl("nope")
        blobs.delete("nope")  # idempotent

    def test_delete(self, blobs: BlobStoreManager) -> None:
        a = blobs.put_bytes(b"1")
        blobs.delete(a)
        assert not blobs.exists(a)
        blobs.delete(a)

    def test_unadopted_uploads_expire_and_adopted_ones_stay(self, blobs: BlobStoreManager) -> None:
        assert blobs.sweep() == []  # an empty store has nothing to sweep
        kept, orphan = blobs.put_bytes(b"kept"), blobs.put_bytes(b"orphan")
        assert blobs.has_ttl(kept) and blobs.has_ttl(orphan)
        blobs.remove_ttl(kept)
        blobs.remove_ttl(kept)  # idempotent
        assert blobs.sweep() == []  # nothing expired yet
        later = 10**15
        assert blobs.sweep(now_ms=later) == [orphan]
        assert blobs.exists(kept) and not blobs.exists(orphan)

    def test_transient_errors_are_retried(
        self, blobs: BlobStoreManager, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real = blobs.fs.pipe_file
        calls = {"n": 0}

        def flaky(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] <= 2:
                raise ConnectionError("transient")
            return real(*args, **kwargs)

        monkeypatch.setattr(blobs.fs, "pipe_file", flaky)
        blob = blobs.put_bytes(b"data")
        assert blobs.get_bytes(blob) == b"data" and calls["n"] >= 3

    def test_persistent_errors_give_up_with_a_clear_error(
        self, blobs: BlobStoreManager, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("down")

        monkeypatch.setattr(blobs.fs, "pipe_file", broken)
        with pytest.raises(BlobStoreError, match=r"failed after 4 attempts: down"):
            blobs.put_bytes(b"data")


def test_a_blob_url_no_installed_filesystem_serves_is_a_config_error() -> None:
    """Issue 37: an unknown scheme or a missing fsspec driver was a traceback."""
    from sparkpoint.errors import ConfigError
    from sparkpoint.storage.blobstore.manager import check_filesystem

    with pytest.raises(ConfigError, match=r"blob.store.url='nosuch://b/x': no fsspec filesystem"):
        check_filesystem("nosuch://b/x", {})
    with pytest.raises(ConfigError, match=r"scheme 'gcs' needs a package that is not installed"):
        check_filesystem("gcs://bucket/x", {})  # gcsfs is not a dependency


def test_a_filesystem_option_its_class_does_not_take_is_refused() -> None:
    from sparkpoint.errors import ConfigError
    from sparkpoint.storage.blobstore.manager import check_filesystem

    check_filesystem("s3://bucket/x", {"endpoint_url": "http://127.0.0.1:1", "key": "k"})
    check_filesystem("file:///tmp/x", {"auto_mkdir": "true"})
    with pytest.raises(ConfigError, match=r"options.endpoint_ur: .*did you mean .*endpoint_url"):
        check_filesystem("s3://bucket/x", {"endpoint_ur": "http://127.0.0.1:1"})
    with pytest.raises(ConfigError, match=r"LocalFileSystem \(file://\) takes no option 'urll'"):
        check_filesystem("/tmp/x", {"urll": "x"})
