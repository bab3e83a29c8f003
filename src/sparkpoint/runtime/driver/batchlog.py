"""The batch log: which input offsets each numbered micro-batch ends at, kept durably.

DataFrame pipelines write to sinks with the batch id, and a sink that skips batch ids it has
already committed (like :class:`~sparkpoint.runtime.dataframe.sinks.ParquetSink`) must see a
retried batch carry the same id *and* the same input. So before running batch ``n`` the driver
records its end offsets here, in the metadata store (namespace ``batch-log``), and after a restart
it replays the batches that the tasks' checkpoints do not cover yet, with the same ids and end
offsets, before planning new ones. Entries every task's checkpoint covers are deleted; the id of
the newest batch is kept so that ids keep growing across runs.

With exactly-once, an entry also holds what its batch staged (:class:`BatchOutputs`), recorded
after the batch ran and before any checkpoint covering it is written. That output is the
batch's, whoever runs it again: a replay recomputes state but its own output is discarded
(rows are no longer one task's after a shuffle, so a batch some tasks' checkpoints already
cover cannot be sent again in part). :meth:`BatchLog.prune` publishes an entry's output, in
batch order, before it deletes the entry.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping

from sparkpoint.metadata.base import MetadataStore
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.plan import BatchOutputs

log = logging.getLogger(__name__)

NAMESPACE = "batch-log"
LAST = "last"
EPOCH = "epoch"

Comparator = Callable[[SystemStreamPartition, str, str], int]
Publisher = Callable[[int, BatchOutputs], None]


def _key(batch: int) -> str:
    return f"{batch:012d}"


class BatchLog:
    """Numbered batches and their end offsets, in a :class:`MetadataStore`."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.entries: dict[int, dict[SystemStreamPartition, str]] = {}
        self.outputs: dict[int, BatchOutputs] = {}
        for key, value in store.all(NAMESPACE).items():
            if key not in (LAST, EPOCH):
                data = json.loads(value)
                ends = data["ends"].items()
                self.entries[int(key)] = {SystemStreamPartition.parse(s): o for s, o in ends}
                if data.get("outputs"):
                    self.outputs[int(key)] = BatchOutputs.from_json(data["outputs"])
        last = store.get(NAMESPACE, LAST)
        self.last_id = max([int(last or 0), *self.entries])
        epoch = store.get(NAMESPACE, EPOCH)
        if epoch is None:  # a new log (a new job, or one reset): later than any before it
            epoch = str(int(time.time() * 1000))
            store.put(NAMESPACE, EPOCH, epoch)
        #: when this log began (ms): with the batch id, the key a batch's output is published
        #: under, so that keys keep growing when a reset starts the ids again from 1
        self.epoch = int(epoch)

    def record(self, batch: int, ends: Mapping[SystemStreamPartition, str]) -> None:
        """Durably note batch ``batch``'s end offsets (before it runs)."""
        self.entries[batch] = dict(ends)
        self.last_id = max(self.last_id, batch)
        self.store.put_all(NAMESPACE, {_key(batch): self._value(batch), LAST: str(self.last_id)})

    def _value(self, batch: int) -> str:
        ends = self.entries[batch]
        data: dict[str, object] = {"ends": {str(s): o for s, o in sorted(ends.items())}}
        outputs = self.outputs.get(batch)
        if outputs:
            data["outputs"] = outputs.to_json()
        return json.dumps(data)

    def set_outputs(self, batch: int, outputs: BatchOutputs | None) -> None:
        """Durably note what logged batch ``batch`` staged (``None``: forget it)."""
        if outputs:
            self.outputs[batch] = outputs
        else:
            self.outputs.pop(batch, None)
        self.store.put(NAMESPACE, _key(batch), self._value(batch))

    def publish_key(self, batch: int) -> int:
        """The key batch ``batch``'s output is published under (grows with the batch)."""
        return self.epoch * 1_000_000_000 + batch

    def staged_parts(self) -> set[str]:
        """Every stream part the entries hold (kept when the job's start sweeps the rest)."""
        return {p for outputs in self.outputs.values() for p in outputs.parts()}

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

    def prune(
        self,
        checkpointed: Mapping[SystemStreamPartition, str],
        cmp: Comparator,
        publish: Publisher | None = None,
    ) -> int:
        """Delete entries every checkpoint covers, after publishing their staged output, oldest
        first, with ``publish`` (an error leaves every entry in place), but keep those with
        output after the oldest entry not covered yet; the number deleted."""
        keep = {b for b, _ in self.uncovered(checkpointed, cmp)}
        first_kept = min(keep, default=None)
        gone = sorted(
            b
            for b in self.entries
            if b not in keep
            # output goes out in batch order: none past a batch still waiting for checkpoints
            and (first_kept is None or b < first_kept or b not in self.outputs)
        )
        for b in gone:
            outputs = self.outputs.get(b)
            if outputs:
                if publish is None:
                    raise AssertionError(f"batch {b} holds staged output and nothing publishes it")
                publish(b, outputs)
        if gone:
            for b in gone:
                del self.entries[b]
                self.outputs.pop(b, None)
            self.store.put_all(NAMESPACE, {_key(b): None for b in gone})
        return len(gone)
