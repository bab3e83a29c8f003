"""``sparkpoint state reshard``: after an input grows, every key's state moves to the task its new
partition maps it to, through the stores' backends, all or nothing.

Proven on the filelog with the changelog and the blob-store backends: a 4 -> 8 -> 12 growth with
a reshard between runs keeps every user's count exact (an independent count of the generated
views), with the local state deleted after each reshard; a crash (``os._exit``, as ``kill -9``)
at each step of the reshard leaves the job runnable and exact after the command runs again (or,
past its commit point, after the job's own start finishes it); the refusals change nothing.
"""

from __future__ import annotations

import json
import shutil
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config, load_config
from sparkpoint.errors import UserError
from sparkpoint.failpoints import RESHARD_POINTS
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import LIVENESS, DriverConflict, PartitionCountChanged
from sparkpoint.storage.reshard import pending
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.reshard import reshard
from sparkpoint.tools.state import committed_entries
from sparkpoint.tools.streams import add_partitions
from tests.e2e.cli import sp
from tests.helpers import changelog_job as make
from tests.helpers import committed_counts, generate
from tests.helpers import run_job as run

BACKENDS = {
    "changelog": {},
    "blobstore": {
        "stores.user-counts.changelog": "",
        "stores.user-counts.backup.factories": "blobstore",
    },
}


def grow(config: Config, partitions: int) -> None:
    systems = Systems(config)
    try:
        add_partitions(config, systems, config.inputs[0], partitions)
    finally:
        systems.close()


def assert_placed(config: Config, partitions: int) -> None:
    """Every user's count is in the task its key maps to under ``partitions`` (crc32), once."""
    seen: Counter[str] = Counter()
    for task, key, _value in committed_entries(config, "user-counts"):
        assert task == f"Partition {zlib.crc32(key.encode()) % partitions}", (task, key)
        seen[key] += 1
    assert set(seen.values()) == {1}


def checkpoints_of(config: Config) -> dict[str, str]:
    return {t.name: c.dumps() for t, c in CheckpointManager(config).read_all().items()}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_growth_4_8_12_keeps_every_key_exact(tmp_path: Path, backend: str) -> None:
    config = make(tmp_path, **BACKENDS[backend])
    expected = generate(config, tmp_path / "a.yaml", 1200, seed=1)
    run(config, until_caught_up=True)
    for step, partitions in enumerate((8, 12)):
        grow(config, partitions)
        expected += generate(config, tmp_path / "a.yaml", 400, seed=10 + step)
        with pytest.raises(PartitionCountChanged, match="sparkpoint state reshard JOB"):
            run(config, until_caught_up=True)
        result = reshard(config)
        assert result.streams == {"filelog.pageviews": (4 + 4 * step, partitions)}
        moved = result.moved["user-counts"]
        assert 0 < moved.keys < moved.entries == 50  # 50 users, some move, not all
        assert_placed(config, partitions)
        shutil.rmtree(config.store_base_dir)  # the state comes from the backend alone
        run(config, until_caught_up=True)
        assert committed_counts(config) == dict(expected)
        assert_placed(config, partitions)
    again = reshard(config)
    assert "partition count it last ran with" in again.nothing


@pytest.mark.parametrize("point", RESHARD_POINTS)
def test_a_kill_at_each_step_leaves_the_job_runnable_and_exact(tmp_path: Path, point: str) -> None:
    config = make(tmp_path)
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(config.to_dict()))
    expected = generate(config, tmp_path / "a.yaml", 800, seed=3)
    run(config, until_caught_up=True)
    grow(config, 8)
    expected += generate(config, tmp_path / "a.yaml", 300, seed=4)
    before = checkpoints_of(config)
    flag = tmp_path / "crash.flag"
    flag.write_text("0")
    crash = ["--set", f"testing.crash.at={point}", "--set", f"testing.crash.flag={flag}"]
    crash += ["--set", "testing.crash.mode=exit"]
    killed = sp("state", "reshard", str(job_file), *crash, check=False)
    assert killed.returncode != 0 and not flag.exists(), killed.stderr
    metadata = CoordinatorStreamStore(config, source="test")
    record = pending(metadata)
    metadata.close()
    if point == "reshard-after-state":  # before the commit point: nothing adopted
        assert record is None
        assert checkpoints_of(config) == before
        with pytest.raises(PartitionCountChanged):
            run(config, until_caught_up=True)
        rerun = sp("state", "reshard", str(job_file))
        assert "store user-counts: moved" in rerun.stdout
    else:  # past it: the job's own start finishes the reshard
        assert record is not None
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_placed(config, 8)


def test_a_store_whose_keys_are_not_the_input_key_is_refused(tmp_path: Path) -> None:
    from generate import write

    config = make(tmp_path)
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(config.to_dict()))
    write(str(gen), 600, 5, 50, key_field="page")  # keyed by page, counted by user
    run(config, until_caught_up=True)
    grow(config, 8)
    before = checkpoints_of(config)
    for dry_run in (True, False):
        with pytest.raises(UserError, match=r"store user-counts task Partition \d: key .* "):
            reshard(config, dry_run=dry_run)
    assert checkpoints_of(config) == before
    with pytest.raises(UserError, match="stores.user-counts.reshard.key"):
        reshard(config)


def test_refused_while_the_job_runs_and_dry_run_changes_nothing(tmp_path: Path) -> None:
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 600, seed=6)
    run(config, until_caught_up=True)
    grow(config, 8)
    metadata = CoordinatorStreamStore(config, source="test")
    beat = {"host": "elsewhere", "pid": 1, "run-id": "r", "heartbeat": int(time.time() * 1000)}
    metadata.put(LIVENESS, "driver", json.dumps(beat))
    with pytest.raises(DriverConflict, match="is running already"):
        reshard(config)
    metadata.delete(LIVENESS, "driver")
    metadata.close()
    before = checkpoints_of(config)
    dry = reshard(config, dry_run=True)
    assert dry.dry_run and dry.moved["user-counts"].keys > 0
    assert checkpoints_of(config) == before
    reshard(config)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)


def test_a_job_that_never_ran_has_nothing_to_move_and_is_left_as_it_is(tmp_path: Path) -> None:
    """Opening the job's metadata creates its coordinator stream: a reshard (a dry run too) of
    a job that never ran did, and left it behind."""
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 50, seed=9)
    admin = Systems(config).admin(config.coordinator_system)
    before = sorted(admin.list_streams())
    for dry_run in (True, False):
        result = reshard(config, dry_run=dry_run)
        assert result.nothing is not None and "never ran" in result.nothing
        assert not result.moved
        assert sorted(admin.list_streams()) == before


def test_unread_input_keyed_by_the_old_count_is_refused(tmp_path: Path) -> None:
    config = make(tmp_path)
    generate(config, tmp_path / "a.yaml", 400, seed=7)
    run(config, until_caught_up=True)
    generate(config, tmp_path / "a.yaml", 100, seed=8)  # not read yet
    systems = Systems(config)
    try:
        with pytest.raises(UserError, match="has not read all of filelog.pageviews"):
            add_partitions(config, systems, config.inputs[0], 8)
        assert systems.admin("filelog").partition_count("pageviews") == 4
        add_partitions(config, systems, config.inputs[0], 8, force=True)
    finally:
        systems.close()
    before = checkpoints_of(config)
    with pytest.raises(UserError, match="written before the stream grew"):
        reshard(config)
    assert checkpoints_of(config) == before


def test_the_command_prints_what_moved(tmp_path: Path) -> None:
    config = make(tmp_path)
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(config.to_dict()))
    generate(config, tmp_path / "a.yaml", 500, seed=9)
    run(config, until_caught_up=True)
    grown = sp("stream", "add-partitions", str(job_file), "pageviews", "--partitions", "8")
    assert f"sparkpoint state reshard {job_file}" in grown.stdout
    dry = sp("state", "reshard", str(job_file), "--dry-run")
    assert "filelog.pageviews: 4 -> 8 partitions" in dry.stdout
    assert "store user-counts: would move" in dry.stdout
    done = sp("state", "reshard", str(job_file))
    assert "store user-counts: moved" in done.stdout and "of 50 entries" in done.stdout
    assert "re-sharded and adopted in" in done.stdout
    nothing = sp("state", "reshard", str(job_file))
    assert nothing.stdout.startswith("nothing to do: ")


def test_a_second_growth_before_the_reshard_and_non_transactional_state_are_refused(
    tmp_path: Path,
) -> None:
    config = make(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 400, seed=11)
    run(config, until_caught_up=True)
    grow(config, 8)
    with pytest.raises(UserError, match="grew already since job pageviews last ran"):
        grow(config, 12)
    loose = load_config(
        None, {**config.to_dict(), "task.transactional.state.checkpoint.enabled": "false"}
    )
    before = checkpoints_of(config)
    with pytest.raises(UserError, match="task.transactional.state.checkpoint.enabled=false"):
        reshard(loose)
    assert checkpoints_of(config) == before
    reshard(config)
    grow(config, 12)  # after the reshard, it may grow again
    reshard(config)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_placed(config, 12)


def test_a_dataframe_job_s_state_is_resharded(tmp_path: Path, spark: Any) -> None:
    from pageviews_pipeline import job as pipeline

    from sparkpoint.runtime.dataframe.runner import DataFrameRunner
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from tests.helpers import run_until_caught_up

    config = make(tmp_path, **{"task.batch.max.messages": "400"})
    expected = generate(config, tmp_path / "a.yaml", 900, seed=12)
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, pipeline, config)))
    grow(config, 8)
    expected += generate(config, tmp_path / "a.yaml", 300, seed=13)
    assert reshard(config).moved["user-counts"].keys > 0
    run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, pipeline, config)))
    assert committed_counts(config) == dict(expected)
    assert_placed(config, 8)


@pytest.mark.kafka
def test_on_kafka_keys_move_to_their_murmur2_partition(tmp_path: Path) -> None:
    """Tansu deviation (docs/kafka.md): it cannot add partitions, so the topic has 8 from the
    start, the first views are placed as a 4-partition topic would place them (murmur2 % 4),
    and the job's stored count is set to 4 as if it had last run on 4 partitions."""
    from sparkpoint.system.kafka.partitioner import kafka_partition
    from sparkpoint.testing.services import TansuKafka
    from tests.conftest import pageviews_config

    with TansuKafka(tmp_path / "tansu") as broker:
        values = pageviews_config(
            tmp_path,
            broker.config("log"),
            **{
                "stores.user-counts.changelog": "log.user-counts-changelog",
                "task.batch.max.messages": "200",
                "task.commit.ms": "0",
            },
        )
        config = load_config(None, values)
        first, second = _grown_on_tansu(config, config.inputs[0], "user", (14, 15), 50)
        result = reshard(config, unread_after_growth=True)  # the second views: keyed by 8
        assert result.moved["user-counts"].keys > 0
        run(config, until_caught_up=True)
        expected = Counter(str(e["user"]) for e in first + second)
        assert committed_counts(config) == dict(expected)
        for task, key, _value in committed_entries(config, "user-counts"):
            assert task == f"Partition {kafka_partition(key.encode(), 8)}", (task, key)


@pytest.mark.kafka
def test_on_kafka_a_re_keying_job_s_input_grows_and_its_counts_stay_with_their_users(
    tmp_path: Path,
) -> None:
    """The re-key example with every stream on Kafka, its input grown 4 -> 8. Tansu deviation
    (docs/kafka.md): it cannot add partitions, so the input topic has 8 from the start, the
    first views are placed as a 4-partition topic would place them (murmur2 % 4), and the
    job's stored count is set to 4. The counts follow the intermediate stream (4 partitions,
    murmur2 of the user): no key moves, the job runs on with 8 tasks and exact counts. The
    intermediate stream's own growth needs CreatePartitions: it is tested on the filelog
    (test_a_re_keyed_job_s_state_follows_its_intermediate_stream_through_both_growths)."""
    from sparkpoint.model import SystemStream
    from sparkpoint.system.kafka.partitioner import kafka_partition
    from sparkpoint.testing.services import TansuKafka
    from tests.conftest import REKEY_DIR, pageviews_config

    with TansuKafka(tmp_path / "tansu") as broker:
        values = pageviews_config(
            tmp_path,
            broker.config("log"),
            job=REKEY_DIR / "job.yaml",
            **{"task.batch.max.messages": "200", "task.commit.ms": "0"},
        )
        values["task.inputs"] = "log.pageviews-by-page, log.pageviews-by-user"
        config = load_config(None, values)
        by_page = SystemStream("log", "pageviews-by-page")
        first, second = _grown_on_tansu(config, by_page, "page", (96, 97), 24)
        result = reshard(config, unread_after_growth=True)  # the second views: placed by 8
        assert result.streams == {"log.pageviews-by-page": (4, 8)}
        assert result.moved["user-counts"].keys == 0
        run(config, until_caught_up=True)
        expected = Counter(str(e["user"]) for e in first + second)
        assert committed_counts(config) == dict(expected)
        for task, key, _value in committed_entries(config, "user-counts"):
            assert task == f"Partition {kafka_partition(key.encode(), 4)}", (task, key)


def _grown_on_tansu(
    config: Config, stream: Any, key: str, seeds: tuple[int, int], users: int
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``stream`` (a Kafka topic) grown 4 -> 8 as far as the job can tell, on a broker that
    cannot add partitions: 8 from the start, 500 views keyed by ``key`` placed as 4 would place
    them (murmur2 % 4), a run, the job's stored count set to 4, then 300 views placed by 8.
    Returns both lists of views."""
    from generate import events

    from sparkpoint.metadata.job_state import INPUT_PARTITIONS
    from sparkpoint.system.kafka.partitioner import kafka_partition
    from sparkpoint.tools.streams import Message, send_messages

    systems = Systems(config)
    systems.admin(stream.system).create_stream(StreamSpec(stream.stream, 8))
    first = list(events(500, seeds[0], users))
    placed = [Message(e, e[key], kafka_partition(str(e[key]).encode(), 4)) for e in first]
    send_messages(config, systems, stream, placed)
    run(config, until_caught_up=True)
    metadata = CoordinatorStreamStore(config, systems, source="test")
    metadata.put(INPUT_PARTITIONS, str(stream), "4")
    metadata.close()
    second = list(events(300, seeds[1], users))
    send_messages(config, systems, stream, [Message(e, e[key]) for e in second])
    systems.close()
    return first, second


def test_inputs_that_did_not_all_grow_and_state_only_on_an_executor_are_refused(
    tmp_path: Path,
) -> None:
    two = make(tmp_path / "two", **{"task.inputs": "filelog.pageviews,filelog.clicks"})
    Systems(two).admin("filelog").create_stream(StreamSpec("clicks", 4))
    generate(two, tmp_path / "a.yaml", 200, seed=16)
    run(two, until_caught_up=True)
    grow(two, 8)
    before = checkpoints_of(two)
    with pytest.raises(UserError, match=r"filelog.clicks \(4\) of job pageviews did not grow to 8"):
        reshard(two)
    assert checkpoints_of(two) == before

    local = make(tmp_path / "local", **{"stores.user-counts.changelog": ""})
    generate(local, tmp_path / "b.yaml", 200, seed=17)
    run(local, until_caught_up=True)
    shutil.rmtree(local.store_base_dir)  # the state was on an executor's disk only
    grow(local, 8)
    before = checkpoints_of(local)
    with pytest.raises(UserError, match=r"store user-counts: the store has no backup backend"):
        reshard(local)
    assert checkpoints_of(local) == before


def changelog_partitions(config: Config) -> int:
    systems = Systems(config)
    try:
        return systems.admin("filelog").partition_count("user-counts-changelog")
    finally:
        systems.close()


def test_a_refusal_after_the_restore_leaves_the_changelogs_as_they_were(tmp_path: Path) -> None:
    """The key check runs on the restored state; the changelogs grow only after it (a grown
    changelog cannot be taken back): a store keyed by page, counted by user, is refused with
    its changelog still at the old count (it grew to 8 first: found by a reviewer)."""
    from generate import write

    config = make(tmp_path)
    gen = tmp_path / "gen.json"
    gen.write_text(json.dumps(config.to_dict()))
    write(str(gen), 600, 5, 50, key_field="page")
    run(config, until_caught_up=True)
    grow(config, 8)
    before = checkpoints_of(config)
    with pytest.raises(UserError, match=r"store user-counts task Partition \d: key .*nothing"):
        reshard(config)
    assert changelog_partitions(config) == 4
    assert checkpoints_of(config) == before


def test_inputs_of_different_counts_name_the_stream_their_store_follows(tmp_path: Path) -> None:
    """Inputs that had different counts (4 and 2) never placed a key in one task: the reshard
    asks which one the store follows (it told the user to grow the other "from 4", and then
    refused forever, found by a reviewer), moves the state by that one's counts, and the job
    runs on with the other input as it was."""
    two = make(tmp_path, **{"task.inputs": "filelog.pageviews,filelog.clicks"})
    Systems(two).admin("filelog").create_stream(StreamSpec("clicks", 2))
    expected = generate(two, tmp_path / "a.yaml", 400, seed=18)
    run(two, until_caught_up=True)
    grow(two, 8)
    before = checkpoints_of(two)
    refused = r"filelog.clicks 2, filelog.pageviews 4.*stores.user-counts.reshard.stream"
    with pytest.raises(UserError, match=refused):
        reshard(two)
    assert checkpoints_of(two) == before and changelog_partitions(two) == 4
    follows = load_config(None, {**two.to_dict(), "stores.user-counts.reshard.stream": "pageviews"})
    result = reshard(follows)
    assert result.streams == {"filelog.pageviews": (4, 8)} and result.moved["user-counts"].keys
    expected += generate(two, tmp_path / "a.yaml", 200, seed=19)
    run(two, until_caught_up=True)
    assert committed_counts(two) == dict(expected)
    assert_placed(two, 8)


def test_an_in_memory_store_without_a_backup_has_nothing_to_move(tmp_path: Path) -> None:
    """Such a store keeps nothing past a run (each start makes it empty): the reshard moves
    the job's other state and does not refuse for it (it said to run it on an executor)."""
    config = make(
        tmp_path,
        **{
            "stores.scratch.factory": "in-memory",
            "stores.scratch.key.serde": "string",
            "stores.scratch.msg.serde": "integer",
        },
    )
    expected = generate(config, tmp_path / "a.yaml", 400, seed=20)
    run(config, until_caught_up=True)
    grow(config, 8)
    result = reshard(config)
    assert result.moved["user-counts"].keys > 0 and result.moved["scratch"].entries == 0
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_placed(config, 8)


@pytest.mark.parametrize("api", ["task", "dataframe"])
def test_a_re_keyed_job_s_state_follows_its_intermediate_stream_through_both_growths(
    tmp_path: Path, api: str, request: pytest.FixtureRequest
) -> None:
    """The re-key example's counts are keyed by user, the key of its intermediate stream: the
    input growing (by page) moves nothing and only adds tasks; the intermediate stream growing
    moves each count to its user's new partition. Exact after each, with a run in between,
    in both APIs (``rekey_task``, ``rekey_pipeline``)."""
    from sparkpoint.model import SystemStream
    from tests.runtime.driver.test_intermediate import BY_USER, per_user, rekey_job, views

    config = rekey_job(tmp_path, **{"task.batch.max.messages": "300"})
    if api == "dataframe":
        from rekey_pipeline import job as pipeline

        from sparkpoint.runtime.dataframe.runner import DataFrameRunner
        from sparkpoint.runtime.driver.coordinator import JobCoordinator
        from tests.helpers import run_until_caught_up

        spark = request.getfixturevalue("spark")

        def run(config: Config, until_caught_up: bool) -> None:
            assert until_caught_up
            run_until_caught_up(JobCoordinator(config, DataFrameRunner(spark, pipeline, config)))
    else:
        from tests.helpers import run_job as run

    by_page = SystemStream("filelog", "pageviews-by-page")
    written = views(config, tmp_path, 900, seed=91)
    run(config, until_caught_up=True)
    systems = Systems(config)
    add_partitions(config, systems, by_page, 8)
    with pytest.raises(PartitionCountChanged, match="pageviews-by-page had 4 partitions"):
        run(config, until_caught_up=True)
    result = reshard(config)
    assert result.streams == {"filelog.pageviews-by-page": (4, 8)}
    assert result.moved["user-counts"].keys == 0 and result.moved["user-counts"].entries > 0
    written += views(config, tmp_path, 400, seed=92)  # keyed by page among 8 partitions
    run(config, until_caught_up=True)
    assert committed_counts(config) == per_user(written)
    assert_placed(config, 4)  # users still in the tasks of their 4 intermediate partitions

    add_partitions(config, systems, BY_USER, 8)
    systems.close()
    with pytest.raises(PartitionCountChanged, match="pageviews-by-user had 4 partitions"):
        run(config, until_caught_up=True)
    result = reshard(config)
    assert result.streams == {"filelog.pageviews-by-user": (4, 8)}
    assert result.moved["user-counts"].keys > 0
    written += views(config, tmp_path, 400, seed=93)
    run(config, until_caught_up=True)
    assert committed_counts(config) == per_user(written)
    assert_placed(config, 8)


def test_a_re_keying_job_s_store_must_name_the_stream_it_follows(tmp_path: Path) -> None:
    """Its inputs and its intermediate stream usually have the same count, so the key check
    could not tell a store of one stage from the other's: unset, the reshard is refused; set
    to a stream the job does not read, too. Nothing changes either way."""
    from sparkpoint.model import SystemStream
    from tests.runtime.driver.test_intermediate import rekey_job, views

    config = rekey_job(tmp_path)
    views(config, tmp_path, 300, seed=94)
    run(config, until_caught_up=True)
    systems = Systems(config)
    add_partitions(config, systems, SystemStream("filelog", "pageviews-by-page"), 8)
    systems.close()
    before = checkpoints_of(config)
    for setting, refused in [
        ("", r"re-keys through intermediate streams, so .* set stores.user-counts.reshard."),
        ("filelog.nowhere", r"stores.user-counts.reshard.stream='filelog.nowhere' is not an"),
    ]:
        values = {**config.to_dict(), "stores.user-counts.reshard.stream": setting}
        with pytest.raises(UserError, match=refused):
            reshard(load_config(None, values))
    assert checkpoints_of(config) == before


def test_task_entries_stay_with_their_task_while_keys_move(tmp_path: Path) -> None:
    """A TTL store's format entry belongs to each task (and to none of the keys): a move of
    the keys beside it leaves it in every old task, copies it to the new ones, and does not
    count it as moved; the counts stay exact after the next run."""
    from sparkpoint.model import TaskName
    from sparkpoint.storage.kv.rocksdb import RocksDBEngine
    from sparkpoint.storage.kv.ttl import FORMAT_KEY
    from sparkpoint.storage.local import LocalTaskState

    config = make(tmp_path, **{"stores.user-counts.rocksdb.ttl.ms": str(10 * 365 * 86_400_000)})
    expected = generate(config, tmp_path / "a.yaml", 800, seed=17)
    run(config, until_caught_up=True)
    grow(config, 8)
    users = len(expected)
    moved = reshard(config).moved["user-counts"]
    assert 0 < moved.keys < users and moved.entries == users + 4  # 4 format entries
    for p in range(8):  # the stores as the reshard committed them
        path = LocalTaskState(config.store_base_dir, TaskName(f"Partition {p}"))
        store = RocksDBEngine("user-counts", path.store_dir("user-counts"), read_only=True)
        assert store.get(FORMAT_KEY) is not None, p
        store.close()
    expected += generate(config, tmp_path / "a.yaml", 300, seed=18)
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_placed(config, 8)


def test_a_windowed_job_is_resharded_and_its_windows_close_in_their_new_tasks(
    tmp_path: Path,
) -> None:
    """The windows example, its input grown 4 -> 8: the window stores follow the key inside
    each window (``reshard.key: window``), and their timers go with them (a timer of a window
    store is keyed by the store's name and the window; before, the key check refused them).
    After more views, every minute that went out counts its user's views in it, once."""
    from tests.runtime.executor.test_windows import MINUTE, emitted, job, send, views

    config = job(
        tmp_path,
        **{"stores.minute-counts.reshard.key": "window", "stores.sessions.reshard.key": "window"},
    )
    sent = views(400, seed=70, start_ms=0)
    send(config, sent)
    run(config, until_caught_up=True)
    before = sum(emitted(config, "user-minute-counts", MINUTE).values())
    grow(config, 8)
    result = reshard(config)
    assert result.streams == {"filelog.pageviews": (4, 8)}
    assert all(result.moved[s].keys > 0 for s in ("minute-counts", "sessions", "timers"))
    more = views(400, seed=71, start_ms=sent[-1][1])
    send(config, more)
    sent += more
    run(config, until_caught_up=True)
    got = emitted(config, "user-minute-counts", MINUTE)
    assert sum(got.values()) > before
    per_minute = Counter((user, at - at % 60_000) for user, at in sent)
    assert {(w[0], w[1], w[3]) for w in got} <= {(u, m, n) for (u, m), n in per_minute.items()}
    assert set(got.values()) == {1}


def test_a_new_task_takes_the_watermark_of_the_task_its_keys_come_from(tmp_path: Path) -> None:
    """Task 0 is far ahead in event time, task 1 behind: a key that moves from task 0 to the
    new task 4 keeps task 0's watermark there, so a record of a minute task 0 closed is late,
    not counted into the minute again (every new task took the smallest watermark of all, and
    the minute went out a second time with a count of 1: a reviewer's script); a new task whose
    source task had none has none (its first records were late)."""
    from sparkpoint.storage.timers import TIME
    from sparkpoint.tools.state import committed_raw_entries
    from tests.runtime.executor.test_windows import MINUTE, emitted, job, send

    def p(user: str, n: int) -> int:
        return zlib.crc32(user.encode()) % n

    users = [f"user-{i:02d}" for i in range(60)]
    mover = next(u for u in users if p(u, 4) == 0 and p(u, 8) == 4)  # task 0 -> task 4
    slow = next(u for u in users if p(u, 4) == 1)  # task 1: behind in event time
    third = next(u for u in users if p(u, 4) == 2)
    late_comer = next(u for u in users if p(u, 4) == 3 and p(u, 8) == 7)  # task 3 had none
    config = job(
        tmp_path,
        **{"stores.minute-counts.reshard.key": "window", "stores.sessions.reshard.key": "window"},
    )
    first = [(mover, t) for t in range(1_000, 200_001, 3_000)]
    first += [(slow, 1_000), (slow, 15_000), (third, 20_000)]
    send(config, first)
    run(config, until_caught_up=True)
    grow(config, 8)
    reshard(config)
    marks = {
        task: TIME.unpack(value)[0]
        for task, key, value in committed_raw_entries(config, "timers")
        if key == b"M"
    }
    assert marks["Partition 4"] == marks["Partition 0"] > marks["Partition 5"]
    assert "Partition 7" not in marks  # its source, task 3, had no watermark
    send(config, [(mover, 30_000), (mover, 400_000), (late_comer, 50_000), (late_comer, 300_000)])
    run(config, until_caught_up=True)
    send(config, [(mover, 500_000), (late_comer, 500_000)])
    run(config, until_caught_up=True)
    got = emitted(config, "user-minute-counts", MINUTE)
    assert [(w[3], n) for w, n in got.items() if w[0] == mover and w[1] == 0] == [(20, 1)]
    assert [(w[3], n) for w, n in got.items() if w[0] == late_comer and w[1] == 0] == [(1, 1)]
    assert sorted(k[0] for k in emitted(config, "late-views", ("key",))) == [mover]


def test_source_tasks_are_those_a_modulo_partitioner_can_move_keys_from() -> None:
    from sparkpoint.storage.reshard import source_tasks

    assert [source_tasks(p, 4, 8) for p in range(4, 8)] == [[0], [1], [2], [3]]
    assert source_tasks(5, 4, 6) == [1, 3] and source_tasks(4, 4, 6) == [0, 2]
    assert source_tasks(5, 4, 12) == [1]
    for old, new in ((4, 6), (4, 8), (3, 5), (8, 12)):
        for h in range(500):  # every key's old task is among its new task's sources
            assert h % old in source_tasks(h % new, old, new)


def test_an_exactly_once_job_s_moved_entries_are_read_committed_once_it_starts_again(
    tmp_path: Path,
) -> None:
    from sparkpoint.model import SystemStream
    from sparkpoint.tools.streams import read_json_lines

    config = make(tmp_path, **{"job.processing.guarantee": "exactly-once"})
    expected = generate(config, tmp_path / "a.yaml", 800, seed=3)
    run(config, until_caught_up=True)
    grow(config, 8)
    changelog = SystemStream("filelog", "user-counts-changelog")
    systems = Systems(config)
    admin = systems.admin("filelog")
    # an earlier attempt grew the changelog, wrote a moved entry and died before holding it
    admin.add_partitions(changelog.stream, 8)
    producer = systems.producer("filelog")
    producer.send_fields(changelog.stream, 5, ("", b"user-x", (1).to_bytes(8, "big"), 0))
    producer.flush()
    reshard(config)

    def new_partitions(uncommitted: bool = False) -> list[tuple[int, str]]:
        rows = read_json_lines(config, systems, changelog, uncommitted=uncommitted)
        return [(r["partition"], r["offset"]) for r in rows if r["partition"] >= 4]

    assert new_partitions(uncommitted=True) != []  # the entries the reshard moved there
    assert new_partitions() == []  # ... wait for the job's start
    run(config, until_caught_up=True)
    assert new_partitions() == new_partitions(uncommitted=True) != []
    assert committed_counts(config) == dict(expected)
    assert_placed(config, 8)
