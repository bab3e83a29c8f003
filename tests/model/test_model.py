from __future__ import annotations

from sparkpoint.model import (
    JobModel,
    SystemStream,
    SystemStreamPartition,
    TaskName,
    group_by_partition,
)


def test_ssp_parse_round_trip_with_dotted_stream() -> None:
    ssp = SystemStreamPartition("kafka", "a.b.c", 12)
    assert SystemStreamPartition.parse(str(ssp)) == ssp
    assert SystemStream.parse("kafka.a.b") == SystemStream("kafka", "a.b")


def test_group_by_partition_and_json_round_trip() -> None:
    ssps = [SystemStreamPartition("fl", "a", p) for p in range(3)] + [
        SystemStreamPartition("fl", "b", p) for p in range(2)
    ]
    model = group_by_partition("job", "1", ssps)
    assert sorted(t.name for t in model.tasks) == ["Partition 0", "Partition 1", "Partition 2"]
    assert model.task("Partition 1").ssps == {
        SystemStreamPartition("fl", "a", 1),
        SystemStreamPartition("fl", "b", 1),
    }
    assert model.task(TaskName("Partition 2")).ssps == {SystemStreamPartition("fl", "a", 2)}
    assert model.task("Partition 2").changelog_partition == 2
    again = JobModel.loads(model.dumps())
    assert again == model
