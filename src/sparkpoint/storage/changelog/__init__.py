"""The changelog state backend (see :mod:`sparkpoint.storage.changelog.backend`)."""

from __future__ import annotations

from sparkpoint.storage.changelog.backend import ChangelogStateBackendFactory
from sparkpoint.storage.changelog.marker import ChangelogMarker

__all__ = ["ChangelogMarker", "ChangelogStateBackendFactory"]
