"""The batch log: which input offsets each numbered micro-batch ends at, kept durably.

DataFrame pipelines write to sinks with the batch id, and a sink that skips batch ids it has
already committed (like :class:`~sparkpoint.runtime.dataframe.pipeline.ParquetSink`) must see a
retried batch carry the same id *and* the same input. So before running batch ``n`` the driver
records its end offsets here, in the metadata store (namespace ``batch-log``), and after a restart
it replays the batches that the tasks' checkpoints do not cover yet, with the same ids and end
offsets, before planning new ones. Entries every task's checkpoint covers are deleted; the id of
the newest batch is kept so that ids keep growing across runs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

from sparkpoint.metadata.base import MetadataStore
from sparkpoint.model import SystemStreamPartition

log = logging.getLogger(__name__)

NAMESPACE = "batch-log"
LAST = "last"

Comparator = Callable[[SystemStreamPartition, str, str], int]


def _key(batch: int) -> str:
    return f"{batch:012d}"


class BatchLog:
    """Numbered batches and their end offsets, in a :class:`MetadataStore`."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.entries: dict[int, dict[SystemStreamPartition, str]] = {}
        for key, value in store.all(NAMESPACE).items():
            if key != LAST:
                ends = json.loads(value)["ends"].items()
                self.entries[int(key)] = {SystemStreamPartition.parse(s): o for s, o in ends}
        last = store.get(NAMESPACE, LAST)
        self.last_id = max([int(last or 0), *self.entries])

    def record(self, batch: int, ends: Mapping[SystemStreamPartition, str]) -> None:
        """Durably note batch ``batch``'s end offsets (before it runs)."""
        self.entries[batch] = dict(ends)
        self.last_id = max(self.last_id, batch)
        value = json.dumps({"ends": {str(s): o for s, o in sorted(ends.items())}})
        self.store.put_all(NAMESPACE, {_key(batch): value, LAST: str(self.last_id)})

    def uncovered(
        self, checkpointed: Mapping[SystemStreamPartition, str], cmp: Comparator
    ) -> list[tuple[int, dict[SystemStreamPartition, str]]]:
        """Logged batches, oldest first, that read past ``checkpointed`` (the next offset each
        SSP's checkpoint resumes at) on some SSP."""
        out = []
        for batch in sorted(self.entries):
            ends = self.entries[batch]
            if any(s in checkpointed and cmp(s, checkpointed[s], e) < 0 for s, e in ends.items()):
                out.append((batch, ends))
        return out

    def prune(self, checkpointed: Mapping[SystemStreamPartition, str], cmp: Comparator) -> int:
        """Delete entries every checkpoint covers; the number deleted."""
        keep = {b for b, _ in self.uncovered(checkpointed, cmp)}
        gone = [b for b in self.entries if b not in keep]
        if gone:
            for b in gone:
                del self.entries[b]
            self.store.put_all(NAMESPACE, {_key(b): None for b in gone})
        return len(gone)
