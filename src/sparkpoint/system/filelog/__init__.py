"""sparkpoint's embedded durable log: partitioned streams in local files, no server needed.

Written for sparkpoint because nothing on PyPI offers what the runtime needs from an embedded
log: fsync'd appends from several processes, checksummed records with torn-tail recovery,
O(log n) offset and timestamp lookup, and key compaction.
"""

from __future__ import annotations

from sparkpoint.system.filelog.system import (
    FileLogAdmin,
    FileLogConsumer,
    FileLogProducer,
    FileLogSystemFactory,
)

__all__ = ["FileLogAdmin", "FileLogConsumer", "FileLogProducer", "FileLogSystemFactory"]
