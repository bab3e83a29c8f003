"""The batch log: numbered batches and their end offsets, durable in the metadata store."""

from __future__ import annotations

import time
from pathlib import Path

from sparkpoint.config import load_config
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.model import SystemStreamPartition
from sparkpoint.runtime.driver.batchlog import BatchLog
from sparkpoint.runtime.plan import BatchOutputs
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


def test_output_is_published_in_batch_order_and_never_past_a_batch_still_waiting(
    tmp_path: Path,
) -> None:
    """Exactly-once: a batch's staged output goes out when every checkpoint covers it, oldest
    first; a later batch covered before an earlier one waits for it."""
    config = load_config(None, pageviews_config(tmp_path))
    log = BatchLog(CoordinatorStreamStore(config))
    for batch, ends in ((1, {A: "10", B: "5"}), (2, {A: "20", B: "8"}), (3, {A: "30", B: "8"})):
        log.record(batch, ends)
        log.set_outputs(batch, BatchOutputs({f"{A}": [f"part-{batch}"]}))
    published: list[int] = []

    def publish(batch: int, outputs: BatchOutputs) -> None:
        assert outputs.streams == {f"{A}": [f"part-{batch}"]}
        published.append(batch)

    # batch 2 waits for B; batch 3 is covered (B did not move in it) but must wait for 2
    assert log.prune({A: "30", B: "5"}, _cmp, publish) == 1
    assert published == [1]
    again = BatchLog(CoordinatorStreamStore(config))  # the outputs are durable
    assert sorted(again.outputs) == [2, 3] and again.staged_parts() == {"part-2", "part-3"}
    assert again.prune({A: "30", B: "8"}, _cmp, publish) == 2
    assert published == [1, 2, 3]


def test_publish_keys_grow_across_a_reset_that_numbers_batches_from_1_again(
    tmp_path: Path,
) -> None:
    old = BatchLog(CoordinatorStreamStore(load_config(None, pageviews_config(tmp_path / "a"))))
    assert BatchLog(old.store).epoch == old.epoch  # kept
    old.record(500, {A: "10"})
    time.sleep(0.002)
    new = BatchLog(CoordinatorStreamStore(load_config(None, pageviews_config(tmp_path / "b"))))
    assert new.publish_key(1) > old.publish_key(500)
    assert new.publish_key(2) > new.publish_key(1)
