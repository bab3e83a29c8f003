"""Exactly-once output of the task API on filelog (issue 34), on the inline runner: output is
staged, named by the commit that covers its input, and published once that checkpoint is
written; a crash at every failpoint of the commit and of the publish leaves the output stream
with each user's counts 1..N exactly once (the same runs at-least-once do repeat some)."""

from __future__ import annotations

import logging
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, SparkpointError
from sparkpoint.failpoints import POINTS, PUBLISH_POINTS, InjectedCrash
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.runtime.driver.metrics import JobMetrics
from sparkpoint.runtime.driver.reports import Transactions
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.storage.outputs import OUTPUTS, committed_parts
from sparkpoint.system.filelog import FileLogSystemFactory
from sparkpoint.system.filelog.system import FileLogAdmin
from sparkpoint.system.registry import Systems
from sparkpoint.tools.jobs import job_overview, overview_lines
from sparkpoint.tools.streams import read_json_lines, read_staged_json_lines
from tests.helpers import assert_exactly_once, committed_counts, emitted_counts, generate
from tests.helpers import changelog_job as make
from tests.helpers import crash_runs as shared_crash_runs
from tests.helpers import run_job as run

OUT = SystemStream("filelog", "user-counts")


def job(tmp_path: Path, guarantee: str = "exactly-once", **overrides: str) -> Config:
    return make(tmp_path, **{"job.processing.guarantee": guarantee, **overrides})


def visible(config: Config) -> int:
    """How many output records a reader of the output stream sees."""
    return sum(len(v) for v in emitted_counts(config).values()) if _exists(config) else 0


def _exists(config: Config) -> bool:
    return OUT.stream in Systems(config).admin("filelog").list_streams()


def started(config: Config) -> tuple[JobCoordinator, dict[SystemStreamPartition, str]]:
    """A started driver on the inline runner, and the end of its input now."""
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.start()
    ssps = [s for t in coordinator.tasks.values() for s in t.model.ssps]
    return coordinator, {s: m.upcoming for s, m in coordinator.partition_metadata(ssps).items()}


def total(metrics: JobMetrics, name: str) -> float:
    """A metric summed over its groups (the job's and each task's)."""
    return sum(group.get(name, 0) for group in metrics.snapshot().values())


def staged_parts(config: Config) -> int:
    staging = Systems(config).admin("filelog").output_staging()
    assert staging is not None
    return len(staging.staged(OUT.stream)) if _exists(config) else 0


def test_output_is_visible_only_once_the_checkpoint_covering_it_is_written(
    tmp_path: Path,
) -> None:
    config = job(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 1000, seed=61, users=20)
    coordinator, end = started(config)
    metrics = JobMetrics("j")
    metrics.record(coordinator.run_batch(end, commit=False)[0])
    assert visible(config) == 0 and staged_parts(config) > 0  # staged, not published
    assert all(ts.pending_outputs for ts in coordinator.tasks.values())
    assert total(metrics, "task_output_parts_staged_total") == staged_parts(config)
    assert total(metrics, "task_output_parts_open") == staged_parts(config)
    tasks = len(coordinator.tasks)  # one open transaction each: its output since its commit
    assert total(metrics, "transactions_open") == tasks
    assert total(metrics, "transactions_committed_total") == 0
    metrics.record(coordinator.run_batch(end, commit=True, wait=True)[0])  # written ...
    checkpoint = next(iter(coordinator.tasks.values())).last_checkpoint
    assert checkpoint is not None and OUTPUTS in checkpoint.state_checkpoint_markers
    assert all(not ts.pending_outputs for ts in coordinator.tasks.values())
    assert total(metrics, "task_output_parts_open") == 0
    assert total(metrics, "transactions_committed_total") == tasks
    assert total(metrics, "transactions_open") == 0
    assert visible(config) == 0  # ... and its clean-up, at the next batch, publishes
    metrics.record(coordinator.run_batch(end, commit=False)[0])
    holding = sum(1 for ts in coordinator.tasks.values() if ts.pending_outputs)
    assert total(metrics, "transactions_open") == holding > 0  # the next ones of tasks with input
    coordinator.close()
    assert total(metrics, "task_output_records_published_total") == visible(config) > 0
    # what went out is exactly what the written checkpoint covers; the last batch's output
    # waits (staged) for a checkpoint that never came
    assert_exactly_once(config, committed_counts(config))
    assert 0 < sum(committed_counts(config).values()) < sum(expected.values())
    assert staged_parts(config) > 0
    staged = list(read_staged_json_lines(config, Systems(config), OUT))
    assert staged and {r["state"] for r in staged} == {"staged"}
    assert {r["owner"].split(".")[0] for r in staged} == {config.job_label}
    assert job_overview(config)["processing-guarantee"] == "exactly-once"
    assert "exactly-once output" in overview_lines(job_overview(config))[0]
    left = staged_parts(config)
    restart = JobCoordinator(config, InlineRunner())
    restart.start()  # discards it (the input is read again)
    assert staged_parts(config) == 0
    metrics.record(restart.run_batch(end, commit=False)[0])  # reports it
    restart.close()
    assert total(metrics, "output_parts_discarded_total") == left
    # not counted as aborted: a start cannot tell a crash's open transactions from those a
    # restore dropped (and counted) in the run before
    assert total(metrics, "transactions_aborted_total") == 0
    assert total(metrics, "transactions_committed_total") == tasks
    run(config, until_caught_up=True)
    assert_exactly_once(config, expected)
    assert staged_parts(config) == 0


def test_a_run_ends_with_its_output_published(tmp_path: Path) -> None:
    config = job(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 1500, seed=62, users=30)
    run(config, until_caught_up=True)
    assert_exactly_once(config, expected)
    more = generate(config, tmp_path / "b.yaml", 500, seed=63, users=30)
    run(config, until_caught_up=True)
    assert_exactly_once(config, expected + more)
    assert committed_counts(config) == dict(expected + more)
    assert staged_parts(config) == 0


def crash_runs(config: Config, tmp_path: Path, flag: Path) -> Counter[str]:
    """Views in rounds, the job crashing at its failpoint once on the way; the views' counts
    per user."""
    return shared_crash_runs(
        lambda: run(config, until_caught_up=True),
        lambda i: generate(config, tmp_path / f"r{i}.yaml", 300 if i else 800, 64 + i, 16),
        flag,
    )


@pytest.mark.parametrize(
    "point", [p for p in POINTS if p != "during-restore"] + list(PUBLISH_POINTS)
)
def test_a_crash_at_every_failpoint_publishes_each_output_once(tmp_path: Path, point: str) -> None:
    flag = tmp_path / "crash.flag"
    config = job(tmp_path, **{"testing.crash.at": point, "testing.crash.flag": str(flag)})
    expected = crash_runs(config, tmp_path, flag)
    assert committed_counts(config) == dict(expected)
    assert_exactly_once(config, expected)
    assert staged_parts(config) == 0  # published, or discarded at the restart
    # a reader of the changelog saw each count once its checkpoint was written, never one a
    # restore took back, and ends with the committed state
    seen = counts_seen(changelog_rows(config))
    assert [k for k, values in seen.items() if values != sorted(values)] == []
    assert {k: v[-1] for k, v in seen.items()} == committed_counts(config)


def test_the_same_crash_at_least_once_repeats_output(tmp_path: Path) -> None:
    """The control: the check above can fail. At-least-once, a crash after a checkpoint's
    batch sent its output but before the next checkpoint replays that output."""
    flag = tmp_path / "crash.flag"
    config = job(
        tmp_path,
        "at-least-once",
        **{"testing.crash.at": "after-snapshot", "testing.crash.flag": str(flag)},
    )
    expected = crash_runs(config, tmp_path, flag)
    assert committed_counts(config) == dict(expected)
    emitted = emitted_counts(config)
    assert any(len(c) > len(set(c)) for c in emitted.values())  # some output went out twice
    seen = counts_seen(changelog_rows(config))  # a changelog reader saw counts taken back
    assert [k for k, values in seen.items() if values != sorted(values)] != []


def test_a_switch_of_guarantee_at_a_restart_just_works_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    config = job(tmp_path, "at-least-once")
    expected = generate(config, tmp_path / "a.yaml", 600, seed=70, users=12)
    run(config, until_caught_up=True)
    assert "processing.guarantee" not in caplog.text  # a new job: no switch
    for guarantee, seed in (("exactly-once", 71), ("at-least-once", 72), ("exactly-once", 73)):
        config = job(tmp_path, guarantee)
        expected += generate(config, tmp_path / f"{seed}.yaml", 300, seed=seed, users=12)
        run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_exactly_once(config, expected)  # no crash: nothing repeated either way
    switches = [r.getMessage() for r in caplog.records if "the last run had" in r.getMessage()]
    assert len(switches) == 3, switches
    assert "the last run had at-least-once, this one has exactly-once" in switches[0]


def test_a_restart_publishes_a_written_checkpoints_output_and_discards_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A driver that dies right after writing a checkpoint (before any clean-up) and after
    staging a later batch: the next start publishes the first, discards the second."""
    flag = tmp_path / "crash.flag"
    config = job(
        tmp_path,
        **{"testing.crash.at": "after-checkpoint-write", "testing.crash.flag": str(flag)},
    )
    expected = generate(config, tmp_path / "a.yaml", 400, seed=74, users=8)
    flag.write_text("0")
    with pytest.raises(InjectedCrash):
        run(config, until_caught_up=True)
    assert visible(config) == 0
    written = JobCoordinator(config, InlineRunner()).checkpoints.read_all()
    assert any(committed_parts(c) for c in written.values())  # it names staged output
    caplog.set_level(logging.INFO)
    run(config, until_caught_up=True)
    assert "exactly-once output: published" in caplog.text
    assert_exactly_once(config, expected)
    assert staged_parts(config) == 0


def test_exactly_once_is_refused_where_it_cannot_hold(tmp_path: Path) -> None:
    v1 = job(tmp_path, **{"task.checkpoint.read.versions": "1,2"})
    with pytest.raises(ConfigError, match="needs V2 checkpoints"):
        JobCoordinator(v1, InlineRunner()).start()
    # a restore that kept a failed batch's changelog records would count that batch in state
    # and publish them with the next commit
    kept = job(tmp_path, **{"task.transactional.state.checkpoint.enabled": "false"})
    with pytest.raises(ConfigError, match="needs task.transactional.state.checkpoint.enabled"):
        JobCoordinator(kept, InlineRunner()).start()


class NoStaging(FileLogSystemFactory):
    """A filelog whose admin has no output staging: a system plugin without transactions."""

    def get_admin(self, system: str, config: Mapping[str, str]) -> FileLogAdmin:
        admin = super().get_admin(system, config)
        admin.output_staging = lambda: None  # type: ignore[method-assign,assignment,return-value]
        return admin


def test_output_to_a_system_that_cannot_stage_names_it(tmp_path: Path) -> None:
    config = make(
        tmp_path,
        {
            "systems.log.factory": "tests.runtime.driver.test_exactly_once:NoStaging",
            "systems.log.path": str(tmp_path / "log"),
        },
        **{"job.processing.guarantee": "exactly-once"},
    )
    generate(config, tmp_path / "a.yaml", 50, seed=75, users=4)
    with pytest.raises(SparkpointError, match=r"system 'log' cannot stage output"):
        run(config, until_caught_up=True)
    assert committed_counts(config) == {}  # nothing committed, nothing sent


@pytest.fixture
def slow_uploads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every commit's upload takes 0.5 s more, so batches finish before their commits do."""
    import sparkpoint.storage.commit as commit_module

    pool = ThreadPoolExecutor(4)
    start = commit_module._start_upload

    def slow(manager: Any, cid: Any, markers: Any) -> Future[dict[str, str]]:
        def later() -> dict[str, str]:
            time.sleep(0.5)
            return start(manager, cid, markers).result()

        return pool.submit(later)

    monkeypatch.setattr(commit_module, "_start_upload", slow)
    yield
    monkeypatch.setattr(commit_module, "_start_upload", start)
    pool.shutdown()


def test_a_commit_built_on_an_unwritten_one_publishes_both(
    tmp_path: Path, slow_uploads: None
) -> None:
    """Commit A finishes after its batch, unwritten; the next commit B must be made now (the
    final commit of a run), so it builds on A; the driver writes both, and the clean-up of B
    publishes A's output and then B's."""
    config = job(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 400, seed=76, users=8)
    coordinator, end = started(config)
    coordinator.run_batch(end, commit=True)  # A: still uploading when the batch returns
    assert all(ts.last_checkpoint is None for ts in coordinator.tasks.values())
    time.sleep(1.0)  # A finished, unwritten
    coordinator.run_batch(end, commit=True, wait=True)  # B, built on A: both written
    coordinator.run_batch(end, commit=False)  # the clean-up of B
    coordinator.close()
    assert_exactly_once(config, committed_counts(config))
    assert sum(committed_counts(config).values()) > 0
    run(config, until_caught_up=True)
    assert_exactly_once(config, expected)


def test_a_commit_of_a_lineage_the_task_left_is_never_written(
    tmp_path: Path, slow_uploads: None
) -> None:
    """Commit A finishes, unwritten; the task's next batch restores (its local state is not
    the one the driver expects: it ran elsewhere meanwhile) and stages that input's output
    again. A is abandoned, so the output goes out once."""
    config = job(tmp_path)
    expected = generate(config, tmp_path / "a.yaml", 400, seed=77, users=8)
    coordinator, end = started(config)
    first, _ = coordinator.run_batch(end, commit=True)  # A: uploading when the batch returns
    holding = sum(1 for ts in coordinator.tasks.values() if ts.pending_outputs)
    assert first.transactions == Transactions(open=holding) and holding > 0
    time.sleep(1.0)  # A finished, unwritten
    for ts in coordinator.tasks.values():  # "it ran elsewhere": this local state is stale
        LocalTaskState(config.store_base_dir, ts.model.name).clear_marker()
    again, _ = coordinator.run_batch(end, commit=False)  # restores, stages that output again
    assert all(ts.last_checkpoint is None for ts in coordinator.tasks.values())  # A: never
    assert again.transactions == Transactions(aborted=holding, open=holding)  # new ones
    coordinator.run_batch(end, commit=True, wait=True)
    coordinator.run_batch(end, commit=False)
    coordinator.close()
    run(config, until_caught_up=True)
    assert committed_counts(config) == dict(expected)
    assert_exactly_once(config, expected)


@pytest.fixture
def kafka_log(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Every stream of the example on Kafka (a Tansu broker started for this test)."""
    from sparkpoint.testing.services import TansuKafka

    with TansuKafka(tmp_path / "tansu") as broker:
        yield broker.config("log")


@pytest.mark.kafka
@pytest.mark.parametrize("point", ["after-checkpoint-write", "publish-after-intent"])
def test_on_kafka_a_crash_at_a_failpoint_publishes_each_output_once(
    tmp_path: Path, kafka_log: dict[str, str], point: str
) -> None:
    """The example's output on Kafka: staged in ``__sparkpoint-staged.user-counts``, published
    in a Kafka transaction once the checkpoint is written. (A crash after a publish appended but
    before it committed is left out: Tansu shows aborted records; see tests/system/
    test_staging.py.)"""
    flag = tmp_path / "crash.flag"
    crash = {"testing.crash.at": point, "testing.crash.flag": str(flag)}
    config = make(tmp_path, kafka_log, **{"job.processing.guarantee": "exactly-once", **crash})
    expected = crash_runs(config, tmp_path, flag)
    assert committed_counts(config) == dict(expected)
    assert_exactly_once(config, expected)
    staging = Systems(config).admin("log").output_staging()
    assert staging is not None and staging.staged("user-counts") == []
    assert "user-counts" in Systems(config).admin("log").list_streams()
    assert not any(
        s.startswith("__sparkpoint-staged") for s in Systems(config).admin("log").list_streams()
    )


CHANGELOG = SystemStream("filelog", "user-counts-changelog")


def changelog_rows(config: Config, uncommitted: bool = False) -> list[dict[str, Any]]:
    return list(read_json_lines(config, Systems(config), CHANGELOG, uncommitted=uncommitted))


def counts_seen(rows: list[dict[str, Any]]) -> dict[Any, list[Any]]:
    """Per key, the values a reader of the changelog saw, in order."""
    out: dict[Any, list[Any]] = {}
    for row in rows:
        out.setdefault(row["key"], []).append(row["value"])
    return out


def crash_before_a_commit(config: Config, tmp_path: Path) -> None:
    """A committed batch, a batch whose commit never comes (the driver dies), a restart."""
    generate(config, tmp_path / "a.yaml", 1200, seed=81, users=10)
    coordinator, end = started(config)
    coordinator.run_batch(end, commit=True, wait=True)
    coordinator.run_batch(end, commit=False)
    coordinator.close()


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_changelog_records_are_read_committed_only_once_their_checkpoint_is_written(
    tmp_path: Path, guarantee: str
) -> None:
    config = job(tmp_path, guarantee)
    crash_before_a_commit(config, tmp_path)
    states = Counter(r["state"] for r in changelog_rows(config, uncommitted=True))
    admin = Systems(config).admin("filelog")
    if guarantee == "exactly-once":
        # the second batch's writes are open: a reader of the changelog does not see them
        assert states["open"] > 0 and states["committed"] > 0
        assert len(changelog_rows(config)) == states["committed"]
    else:
        assert set(states) == {"committed"}
    run(config, until_caught_up=True)  # restores: the open writes are aborted and undone
    rows = changelog_rows(config)
    seen = counts_seen(rows)
    # what a reader of the changelog ends with is the job's committed state
    assert {k: v[-1] for k, v in seen.items()} == committed_counts(config)
    went_back = [k for k, values in seen.items() if values != sorted(values)]
    aborted = sum(
        int(b) - int(a)
        for p in range(admin.partition_count(CHANGELOG.stream))
        for a, b in admin.aborted_ranges(SystemStreamPartition("filelog", CHANGELOG.stream, p))
    )
    if guarantee == "exactly-once":
        # a reader never saw a count that a restore then took back
        assert went_back == [] and aborted > 0
        assert "aborted" in {r["state"] for r in changelog_rows(config, uncommitted=True)}
    else:
        assert went_back and aborted == 0  # it read the discarded counts, then the undo


def test_a_restore_that_would_take_back_committed_changelog_records_stops_naming_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = job(tmp_path)
    generate(config, tmp_path / "a.yaml", 400, seed=82, users=8)
    run(config, until_caught_up=True)
    # records past the task's checkpoint that the changelog says are committed: as if a newer
    # checkpoint had covered them and then was no longer the last one
    ssp = SystemStreamPartition("filelog", CHANGELOG.stream, 0)
    admin = Systems(config).admin("filelog")
    producer = Systems(config).producer("filelog")
    for i in range(3):
        producer.send_fields(CHANGELOG.stream, 0, ("", b"user-x", i.to_bytes(8, "big"), 0))
    producer.flush()
    upcoming = admin.get_metadata([ssp])[ssp].upcoming
    admin.commit_records(ssp, upcoming)
    shutil.rmtree(config.store_base_dir)  # the executor's disk is gone: the tasks restore
    with pytest.raises(
        SparkpointError,
        match=r"(?s)has committed its records before offset.*"
        r"job.processing.guarantee=at-least-once",
    ):
        run(config, until_caught_up=True)
    assert admin.aborted_ranges(ssp) == []  # nothing was taken back
    caplog.set_level(logging.INFO)
    run(job(tmp_path, "at-least-once"), until_caught_up=True)  # the fix the error names
    assert admin.committed_end(ssp) is None  # released
    assert "no longer holds records back" in caplog.text
    assert {r["value"] for r in changelog_rows(config) if r["key"] == "user-x"} == {0, 1, 2, None}
