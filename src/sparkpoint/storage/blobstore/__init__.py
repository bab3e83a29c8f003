"""The blob store state backend (see :mod:`sparkpoint.storage.blobstore.backend`)."""

from __future__ import annotations

from sparkpoint.storage.blobstore.backend import BlobStoreStateBackendFactory

__all__ = ["BlobStoreStateBackendFactory"]
