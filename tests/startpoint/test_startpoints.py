"""SEP-18's test plan: startpoints of every type, broadcast or not, on 1, 3 and 8 partitions."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.startpoint import (
    Startpoint,
    StartpointOldest,
    StartpointSpecific,
    StartpointTimestamp,
    StartpointUpcoming,
)
from sparkpoint.startpoint.manager import StartpointManager
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.startpoints import list_startpoints, parse_timestamp, set_startpoints
from sparkpoint.tools.streams import read_json_lines

N = 20  # records per partition; record i has timestamp 1000 + 10 * i


FILELOG = {"systems.log.factory": "filelog"}
TANSU_TIMESTAMPS = pytest.mark.xfail(
    strict=True,
    reason="Tansu deviation (tests/system/kafka/test_kafka.py): ListOffsets by timestamp answers "
    "the partition's first offset",
)


def make(
    tmp_path: Path, partitions: int, broadcast: bool, system: dict[str, str] = FILELOG
) -> Config:
    values = {
        **system,
        "job.name": "sp",
        "job.data.dir": str(tmp_path),
        "task.class": "recorder_task:Recorder",
        "task.commit.ms": "0",
        "task.batch.max.messages": "1000",
    }
    if broadcast:
        values.update({"task.inputs": "log.main", "task.broadcast.inputs": "log.in"})
    else:
        values["task.inputs"] = "log.in"
    config = load_config(None, values)
    admin = Systems(config).admin("log")
    admin.create_stream(StreamSpec("in", partitions))
    admin.create_stream(StreamSpec("main", partitions))
    append(config, partitions, N)
    return config


def append(config: Config, partitions: int, n: int) -> None:
    systems = Systems(config)
    admin = systems.admin("log")
    producer = systems.producer("log")
    for p in range(partitions):
        ssp = SystemStreamPartition("log", "in", p)
        start = int(admin.get_metadata([ssp])[ssp].upcoming)
        for i in range(start, start + n):
            producer.send("in", p, Record("", b"k", json.dumps({"i": i}).encode(), 1000 + 10 * i))
    producer.flush()


def consumed_since(config: Config, mark: int) -> dict[tuple[str, str], int]:
    """First offset consumed per (task, SSP) in records of ``consumed`` after position ``mark``."""
    first: dict[tuple[str, str], int] = {}
    rows = read_json_lines(config, Systems(config), SystemStream("log", "consumed"))
    for row in rows:
        if int(row["offset"]) >= mark:
            v = row["value"]
            first.setdefault((v["task"], v["ssp"]), int(v["offset"]))
    return first


def consumed_mark(config: Config) -> int:
    admin = Systems(config).admin("log")
    if "consumed" not in admin.list_streams():
        return 0
    ssp = SystemStreamPartition("log", "consumed", 0)
    return int(admin.get_metadata([ssp])[ssp].upcoming)


def one_batch_without_commit(
    config: Config, after_start: Callable[[], None] = lambda: None
) -> None:
    """Start, run one batch, and stop as a crash would: no commit."""
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    after_start()
    end = coordinator.upcoming()
    coordinator.run_batch(end, commit=False)
    coordinator.close()


def run_to_end(config: Config, after_start: Callable[[], None] = lambda: None) -> None:
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    after_start()
    coordinator.run(until_caught_up=True)
    coordinator.close()


STARTPOINTS = {
    "specific": (lambda: StartpointSpecific("5"), 5),
    "timestamp": (lambda: StartpointTimestamp(1075), 8),  # between offsets 7 (1070) and 8 (1080)
    "oldest": (StartpointOldest, 0),
    "upcoming": (StartpointUpcoming, N),
}


def first_offset_cases() -> list[object]:
    """Every kind, broadcast or not, on 1, 3 and 8 partitions of filelog; on Kafka, every kind
    on 3 partitions read by their tasks. Kafka resolves a broadcast input's startpoints with
    the same per-partition calls, and the fan-out to the tasks sharing a broadcast input does
    not involve the system, so the filelog cases cover it (each Kafka case takes about 5 s)."""
    cases = []
    for system, partition_counts in (("filelog", (1, 3, 8)), ("kafka", (3,))):
        for partitions in partition_counts:
            for broadcast in (False, True) if system == "filelog" else (False,):
                for kind in STARTPOINTS:
                    marks = [pytest.mark.kafka] if system == "kafka" else []
                    if system == "kafka" and kind == "timestamp":
                        marks.append(TANSU_TIMESTAMPS)
                    shape = "broadcast" if broadcast else "partitioned"
                    case_id = f"{system}-{partitions}-{shape}-{kind}"
                    params = (system, partitions, broadcast, kind)
                    cases.append(pytest.param(*params, marks=marks, id=case_id))
    return cases


@pytest.mark.parametrize(
    ("log_system", "partitions", "broadcast", "kind"), first_offset_cases(), indirect=["log_system"]
)
def test_first_offsets_follow_startpoints(
    tmp_path: Path, log_system: dict[str, str], partitions: int, broadcast: bool, kind: str
) -> None:
    config = make(tmp_path, partitions, broadcast, log_system)
    run_to_end(config)  # every task has committed offset 19 for every SSP it reads
    make_sp, resolved = STARTPOINTS[kind]
    set_startpoints(config, "in", make_sp())
    tasks = [f"Partition {p}" for p in range(partitions)]
    ssps = [f"log.in.{p}" for p in range(partitions)]
    pairs = (
        [(t, s) for t in tasks for s in ssps] if broadcast else list(zip(tasks, ssps, strict=True))
    )

    def new_records() -> None:  # arrive after the job started, so "upcoming" has them to read
        append(config, partitions, 5)

    # first start, then a restart before any commit: applied both times, at the offset it
    # resolved to at the first (an upcoming resolved again would skip the records that arrived
    # after it: test_a_startpoint_a_restart_applies_again_resumes_where_it_first_resolved)
    for start in range(3):
        expected = resolved
        mark = consumed_mark(config)
        if start < 2:
            one_batch_without_commit(config, new_records)
        else:  # a start that commits: applied, and then the fan-out is gone
            run_to_end(config, new_records)
        assert consumed_since(config, mark) == dict.fromkeys(pairs, expected), start
    assert list_startpoints(config) == {"waiting": {}, "fanned-out": {}}
    append(config, partitions, 3)
    mark = consumed_mark(config)
    run_to_end(config)
    assert consumed_since(config, mark) == dict.fromkeys(pairs, N + 15)  # not applied again


def test_newest_of_ssp_and_ssp_task_startpoints_wins_per_task(tmp_path: Path) -> None:
    config = make(tmp_path, 2, broadcast=True)
    run_to_end(config)
    manager = StartpointManager(CoordinatorStreamStore(config))
    ssp = SystemStreamPartition("log", "in", 0)
    now = int(time.time() * 1000)
    manager.write_startpoint(ssp, StartpointSpecific("3", creation_timestamp=now - 1000))
    manager.write_startpoint(
        ssp, StartpointSpecific("7", creation_timestamp=now), TaskName("Partition 1")
    )
    manager.write_startpoint(
        ssp, StartpointSpecific("9", creation_timestamp=now - 5000), TaskName("Partition 0")
    )
    mark = consumed_mark(config)
    one_batch_without_commit(config)
    first = consumed_since(config, mark)
    assert first[("Partition 0", "log.in.0")] == 3  # the SSP-wide one is newer than its own
    assert first[("Partition 1", "log.in.0")] == 7  # its own is newer
    assert ("Partition 0", "log.in.1") not in first  # no startpoint, nothing new to read


def test_stale_startpoint_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, log_system: dict[str, str]
) -> None:
    config = make(tmp_path, 1, broadcast=False, system=log_system)
    run_to_end(config)
    manager = StartpointManager(CoordinatorStreamStore(config))
    old = int(time.time() * 1000) - 13 * 3600 * 1000
    manager.write_startpoint(
        SystemStreamPartition("log", "in", 0), StartpointOldest(creation_timestamp=old)
    )
    append(config, 1, 2)
    mark = consumed_mark(config)
    with caplog.at_level(logging.WARNING):
        run_to_end(config)
    assert "ignoring stale startpoint oldest" in caplog.text
    assert consumed_since(config, mark) == {("Partition 0", "log.in.0"): N}


def test_set_refuses_what_the_job_does_not_read(tmp_path: Path, log_system: dict[str, str]) -> None:
    config = make(tmp_path, 3, broadcast=False, system=log_system)
    with pytest.raises(UserError, match=r"does not read log.nope; its inputs are log.in"):
        set_startpoints(config, "nope", StartpointOldest())
    with pytest.raises(
        UserError, match=r"log.in has no partition 5 read by the job; partitions: 0, 1, 2"
    ):
        set_startpoints(config, "in", StartpointOldest(), partitions=[5])
    with pytest.raises(
        UserError, match=r"offset 99 does not exist; valid offsets are 0 \(oldest\) to 20"
    ):
        set_startpoints(config, "in", StartpointSpecific("99"), partitions=[1])
    with pytest.raises(UserError, match="no task 'Partition 7'"):
        set_startpoints(config, "in", StartpointOldest(), task="Partition 7")
    # issue 11: a negative offset and a timestamp far in the future
    with pytest.raises(UserError, match=r"offset -5 does not exist; valid offsets are 0"):
        set_startpoints(config, "in", StartpointSpecific("-5"), partitions=[1])
    with pytest.raises(UserError, match=r"--timestamp 4070908800000 is in the future"):
        set_startpoints(config, "in", StartpointTimestamp(parse_timestamp("2099-01-01T00:00Z")))
    with pytest.raises(UserError, match=r"is not an offset"):
        set_startpoints(config, "in", StartpointSpecific("abc"), partitions=[1])
    assert list_startpoints(config) == {"waiting": {}, "fanned-out": {}}


def test_timestamps_resolve_and_parse() -> None:
    assert parse_timestamp("1700000000000") == 1_700_000_000_000
    assert parse_timestamp("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_timestamp("2023-11-14T22:13:20") == 1_700_000_000_000
    with pytest.raises(UserError, match="epoch milliseconds or ISO-8601"):
        parse_timestamp("yesterday")


def timestamp_cases() -> list[object]:
    cases = []
    for system in ("filelog", "kafka"):
        for ts, offset in ((0, 0), (1075, 8), (1080, 8), (99_999, N)):
            marks = [pytest.mark.kafka] if system == "kafka" else []
            if system == "kafka" and ts > 0:  # Tansu answers offset 0 for every timestamp
                marks.append(TANSU_TIMESTAMPS)
            cases.append(pytest.param(system, ts, offset, marks=marks, id=f"{system}-{ts}"))
    return cases


@pytest.mark.parametrize(("log_system", "ts", "offset"), timestamp_cases(), indirect=["log_system"])
def test_timestamp_startpoint_resolution(
    tmp_path: Path, log_system: dict[str, str], ts: int, offset: int
) -> None:
    config = make(tmp_path, 1, broadcast=False, system=log_system)
    planned = set_startpoints(config, "in", StartpointTimestamp(ts))
    assert planned[0].resolves_to == str(offset)


def test_serde_round_trip() -> None:
    for sp in (
        StartpointSpecific("4"),
        StartpointTimestamp(5),
        StartpointOldest(),
        StartpointUpcoming(),
    ):
        assert Startpoint.loads(sp.dumps()) == sp
    with pytest.raises(UserError, match="unknown startpoint type"):
        Startpoint.loads('{"type": "sideways", "creationTimestamp": 1}')


def test_apply_now_on_a_running_job(tmp_path: Path, log_system: dict[str, str]) -> None:
    config = make(tmp_path, 2, broadcast=False, system=log_system)
    config = load_config(None, {**config.to_dict(), "task.poll.interval.ms": "20"})
    coordinator = JobCoordinator(config, InlineRunner())
    thread = threading.Thread(target=coordinator.run, daemon=True)
    thread.start()
    manager = CheckpointManager(config)

    def committed() -> dict[str, str]:
        return {str(s): o for c in manager.read_all().values() for s, o in c.input_offsets.items()}

    deadline = time.monotonic() + 30
    while committed() != {"log.in.0": "19", "log.in.1": "19"}:
        assert time.monotonic() < deadline, committed()
        time.sleep(0.05)
    mark = consumed_mark(config)
    set_startpoints(config, "in", StartpointSpecific("10"), partitions=[1], apply_now=True)
    while consumed_since(config, mark) != {("Partition 1", "log.in.1"): 10}:
        assert time.monotonic() < deadline and thread.is_alive(), consumed_since(config, mark)
        time.sleep(0.05)
    coordinator.stop("test")
    thread.join(30)
    coordinator.close()
    # offsets 10..19 of partition 1 were read again without a restart, then committed
    rows = list(read_json_lines(config, Systems(config), SystemStream("log", "consumed")))
    again = [r["value"]["offset"] for r in rows[mark:] if r["value"]["ssp"] == "log.in.1"]
    assert again == list(range(10, 20))
    assert committed() == {"log.in.0": "19", "log.in.1": "19"}
    assert list_startpoints(config) == {"waiting": {}, "fanned-out": {}}


def test_ssp_task_startpoint_wins_over_ssp_startpoint_of_the_same_age(tmp_path: Path) -> None:
    """Samza's TestStartpointManager precedence rule: on equal creation times the SSP+task
    startpoint (the more specific) wins, whichever was written first."""
    config = make(tmp_path, 2, broadcast=True)
    ssp = SystemStreamPartition("log", "in", 0)
    task = TaskName("Partition 1")
    now = int(time.time() * 1000)
    for order in ((None, task), (task, None)):
        manager = StartpointManager(CoordinatorStreamStore(config))
        for who in order:
            offset = "7" if who is not None else "3"
            manager.write_startpoint(ssp, StartpointSpecific(offset, creation_timestamp=now), who)
        fanned = manager.fan_out({task: [ssp]})
        assert fanned[task][ssp] == StartpointSpecific("7", creation_timestamp=now)
        manager.remove_fan_out_for_task(task, {ssp})


def test_delete_all_removes_every_startpoint_and_fan_out(tmp_path: Path) -> None:
    """Samza's StartpointManager.deleteAllStartpoints and removeAllFanOuts, as a tool."""
    from sparkpoint.tools.startpoints import delete_all_startpoints

    config = make(tmp_path, 2, broadcast=True)
    manager = StartpointManager(CoordinatorStreamStore(config))
    ssp0, ssp1 = (
        SystemStreamPartition("log", "in", 0),
        SystemStreamPartition("log", "in", 1),
    )
    manager.write_startpoint(ssp0, StartpointOldest())
    manager.fan_out({TaskName("Partition 0"): [ssp0]})  # now fanned out
    manager.write_startpoint(ssp1, StartpointUpcoming(), TaskName("Partition 1"))  # waiting
    before = list_startpoints(config)
    assert sum(len(v) for v in before.values()) == 2
    assert delete_all_startpoints(config) == 2
    assert not any(list_startpoints(config).values())
    assert delete_all_startpoints(config) == 0  # idempotent


def test_a_new_fan_out_replaces_a_tasks_earlier_one(tmp_path: Path) -> None:
    """Samza's StartpointManager.fanOut writes each task's fan-out anew (issue 37: sparkpoint
    merged the earlier one into it); a task with no new startpoint keeps its earlier one."""
    config = make(tmp_path, 2, broadcast=True)
    manager = StartpointManager(CoordinatorStreamStore(config))
    ssp0, ssp1 = SystemStreamPartition("log", "in", 0), SystemStreamPartition("log", "in", 1)
    t0, t1 = TaskName("Partition 0"), TaskName("Partition 1")
    now = int(time.time() * 1000)
    oldest = StartpointOldest(creation_timestamp=now)
    upcoming = StartpointUpcoming(creation_timestamp=now)
    manager.write_startpoint(ssp0, oldest, t0)
    manager.write_startpoint(ssp0, oldest, t1)
    first = manager.fan_out({t0: [ssp0, ssp1], t1: [ssp0, ssp1]})
    assert first == {t0: {ssp0: oldest}, t1: {ssp0: oldest}}
    manager.write_startpoint(ssp1, upcoming, t0)  # only task 0 gets a new one
    second = manager.fan_out({t0: [ssp0, ssp1], t1: [ssp0, ssp1]})
    assert second[t0] == {ssp1: upcoming}  # ssp0's earlier entry is replaced
    assert second[t1] == {ssp0: oldest}  # kept: nothing new for task 1
    again = StartpointManager(CoordinatorStreamStore(config))
    assert again.get_fan_out_for_task(t0) == {ssp1: upcoming}
    assert list_startpoints(config)["waiting"] == {}  # the sources were deleted


def test_a_startpoint_a_restart_applies_again_resumes_where_it_first_resolved(
    tmp_path: Path, log_system: dict[str, str]
) -> None:
    """A fan-out stays until a checkpoint covers its SSP, so a start before that applies it
    again. An ``upcoming`` startpoint resolved again then skipped what was written while the
    job was stopped (5 records, silently). The fan-out keeps the offset it resolved to."""
    config = make(tmp_path, 1, broadcast=False, system=log_system)
    run_to_end(config)  # reads 0..19
    set_startpoints(config, "in", StartpointUpcoming())
    run_to_end(config)  # resolves to 20, reads nothing: no checkpoint names the SSP since
    [(where, kept)] = list_startpoints(config)["fanned-out"].items()
    assert where == "log.in.0.Partition 0"
    assert isinstance(kept, StartpointSpecific) and kept.offset == "20"
    mark = consumed_mark(config)
    append(config, 1, 5)  # 20..24, written after the startpoint
    run_to_end(config)
    rows = list(read_json_lines(config, Systems(config), SystemStream("log", "consumed")))
    assert [r["value"]["offset"] for r in rows[mark:]] == [20, 21, 22, 23, 24]
    assert list_startpoints(config) == {"waiting": {}, "fanned-out": {}}  # covered now


def test_a_timestamp_compares_event_time_where_the_stream_has_it(tmp_path: Path) -> None:
    """Issue 72: ``--timestamp`` on a stream with ``event.time.field`` resolved by the records'
    write time. Events here are written 3 to 25 ms after they happen (within the job's
    lateness) and out of order: by event time the first at or after 1100 is offset 11, by
    record time offset 10; the job then starts where the event time says."""
    config = make(tmp_path, 1, False)
    config = load_config(
        None,
        {
            **config.to_dict(),
            "streams.events.event.time.field": "at",
            "task.inputs": "log.events",
            "task.watermark.lateness.ms": "30",
        },
    )
    systems = Systems(config)
    systems.admin("log").create_stream(StreamSpec("events", 1))
    producer = systems.producer("log")
    for i in range(N):
        written = 1000 + 10 * i
        at = written - (25 if i % 2 == 0 else 3)
        producer.send(
            "events", 0, Record("", b"k", json.dumps({"i": i, "at": at}).encode(), written)
        )
    producer.flush()
    ssp = SystemStreamPartition("log", "events", 0)
    (by_event,) = set_startpoints(config, "events", StartpointTimestamp(1100))
    assert (by_event.resolves_to, by_event.found_by) == (
        "11",
        "by event time (field 'at'), kept as that offset",
    )
    (by_record,) = set_startpoints(config, "events", StartpointTimestamp(1100), by="record-time")
    assert (by_record.resolves_to, by_record.found_by) == ("10", "by record time")
    (after_all,) = set_startpoints(config, "events", StartpointTimestamp(5000), by="event-time")
    assert after_all.resolves_to == str(N)  # none at or after it: the partition's end
    set_startpoints(config, "events", StartpointTimestamp(1100))  # the one that applies
    mark = consumed_mark(config)
    run_to_end(config)
    assert consumed_since(config, mark) == {("Partition 0", str(ssp)): 11}
    with pytest.raises(UserError, match=r"--by event-time: log.in has no event time; set "):
        set_startpoints(config, "in", StartpointTimestamp(1100), by="event-time")
    with pytest.raises(UserError, match=r"--by applies to --timestamp only"):
        set_startpoints(config, "events", StartpointOldest(), by="record-time")
