"""A test state backend that declares config keys of its own (a per-store and a global one)."""

from __future__ import annotations

from sparkpoint.config import ConfigKey
from sparkpoint.testing.backends import CopyStateBackendFactory


class KeyedCopyFactory(CopyStateBackendFactory):
    config_keys = (
        ConfigKey(
            "stores.<s>.copy.compression",
            "none",
            "none | zstd",
            "how the copy backend compresses a store's files",
            lambda v: v in ("none", "zstd"),
        ),
        ConfigKey("job.copy.region", "local", "a region name", "where copies go"),
    )
