"""The batch log: numbered batches and their end offsets, durable in the metadata store."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.config import load_config
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.driver.batchlog import BatchLog
from tests.conftest import pageviews_config

A = SystemStreamPartition("filelog", "pageviews", 0)
B = SystemStreamPartition("filelog", "pageviews", 1)


def _cmp(_ssp: SystemStreamPartition, a: str, b: str) -> int:
    return (int(a) > int(b)) - (int(a) < int(b))


def test_uncovered_batches_survive_a_restart_and_ids_keep_growing(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path))
    log = BatchLog(CoordinatorStreamStore(config))
    assert log.last_id == 0 and log.entries == {}
    log.record(1, {A: "10", B: "5"})
    log.record(2, {A: "20", B: "5"})
    log.record(3, {A: "30", B: "9"})
    # A's checkpoint resumes at 20 (covers batches 1 and 2), B's at 5 (covers batches 1 and 2)
    checkpointed = {A: "20", B: "5"}
    assert [b for b, _ in log.uncovered(checkpointed, _cmp)] == [3]
    # B behind: batch 2 did not move B, but batch 1 is covered by both only when B is at 5
    assert [b for b, _ in log.uncovered({A: "10", B: "0"}, _cmp)] == [1, 2, 3]
    assert log.prune(checkpointed, _cmp) == 2

    again = BatchLog(CoordinatorStreamStore(config))
    assert again.entries == {3: {A: "30", B: "9"}}
    assert again.last_id == 3
    assert again.prune({A: "30", B: "9"}, _cmp) == 1
    assert BatchLog(CoordinatorStreamStore(config)).last_id == 3  # ids never go back
