"""The metadata store interface: namespaced string keys to string values.

Writes are visible to ``get``/``all`` of the same instance at once and durable after
``flush`` (or a method documented as flushing). Another instance sees them after it
re-bootstraps (``refresh``). Not thread-safe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping


class MetadataStore(ABC):
    @abstractmethod
    def get(self, namespace: str, key: str) -> str | None: ...

    @abstractmethod
    def put(self, namespace: str, key: str, value: str) -> None: ...

    @abstractmethod
    def put_all(self, namespace: str, entries: Mapping[str, str | None]) -> None:
        """Write many entries (``None`` deletes) as one durable append."""

    @abstractmethod
    def delete(self, namespace: str, key: str) -> None: ...

    @abstractmethod
    def all(self, namespace: str) -> dict[str, str]: ...

    @abstractmethod
    def namespaces(self) -> list[str]: ...

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def refresh(self) -> None:
        """Read what other writers appended since the last read."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release. Idempotent."""
