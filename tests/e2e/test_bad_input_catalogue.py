"""The bad-input catalogue (issues 11 and 37), as a user meets it on the command line: each row
is one clear `error:` line naming what is wrong and where, no traceback, exit code 2, and nothing
written outside the job's directories. Rows whose library-level behaviour is tested elsewhere
say where.

Issue 37's rows tested in this module: a damaged indexed tail (refused, then repaired without
reusing its offset), a second `run` of a running job, damaged filelog files (a deleted partition
directory, a corrupt stream.json or CURRENT), decode errors (exit 2), a typo under blob.store.,
a task module with a syntax error, a store directory that is a symlink, a corrupt heartbeat
record, a checkpointed offset that is not an offset. Elsewhere:

- input skipped or state lost: a recreated input stream, one recreated under a running job, a
  second driver, a driver taken over, a checkpoint id from a clock a day ahead
  (tests/runtime/driver/test_driver_safety.py); offsets before or beyond the partition
  (tests/checkpoint/test_offsets.py); a deleted changelog (tests/storage/test_restore.py); a
  damaged indexed record, repair, index entries the OS never wrote, a full disk
  (tests/system/filelog/test_filelog.py);
- transient faults: the driver's metadata reads and writes (tests/system/test_retry.py), a
  restore process that dies (tests/runtime/driver/test_launch.py);
- advice that fits: a failed send, a changed store serde, a failure's file and line
  (tests/runtime/executor/test_bad_messages.py);
- an unwritable directory (tests/e2e/test_cli_errors.py); a blob URL no filesystem serves and a
  filesystem option its class does not take (tests/storage/blobstore/test_manager.py); a binary
  `checkpoint set` file (tests/tools/test_checkpoint_tool.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkpoint.config import load_config, parse_overrides
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from tests.e2e.cli import JOB, sp
from tests.e2e.test_cli_errors import assert_one_line_error
from tests.helpers import generate


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The example job with a changelog, run once to the end (checkpoints, changelog, state)."""
    tmp = tmp_path_factory.mktemp("catalogue")
    sets = [f"job.data.dir={tmp / 'data'}", "task.commit.ms=0"]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    generate(config, tmp / "job.yaml", 300, seed=17, users=10)
    sp("run", str(JOB), "--until-caught-up", *set_args)
    return tmp, set_args


def job_file(tmp_path: Path, text: str | bytes, name: str = "job.yaml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


BASE = "job:\n  name: j\nsystems:\n  filelog:\n    factory: filelog\ntask:\n  inputs: filelog.in\n"

CONFIG_ROWS: list[tuple[str, str | bytes, tuple[str, ...]]] = [
    ("unknown key", BASE + "  comit.ms: 5\n", ("unknown config key task.comit.ms",)),
    ("wrong type", BASE + "  commit.ms: soon\n", ("task.commit.ms='soon' is invalid",)),
    ("negative interval", BASE + "  commit.ms: -5\n", ("task.commit.ms='-5' is invalid",)),
    (
        "missing factory",
        BASE + "stores:\n  s:\n    key.serde: string\n",
        ("stores.s.key.serde names store s", "no stores.s.factory"),
    ),
    (
        "unknown system",
        BASE.replace("filelog.in", "kafka.in"),
        ("system 'kafka' of 'kafka.in' is not configured",),
    ),
    ("not YAML", "job: [unclosed\n", ("not valid YAML",)),
    ("binary file", b"job:\n  name: \xff\xfe", ("not a text job file",)),
    (
        "key twice",
        BASE + "task:\n  class: x:Y\n",
        ("key 'task' is given twice",),
    ),
]


@pytest.mark.parametrize(("row", "text", "needles"), CONFIG_ROWS, ids=[r[0] for r in CONFIG_ROWS])
def test_bad_config(tmp_path: Path, row: str, text: str | bytes, needles: tuple[str, ...]) -> None:
    proc = sp("config", "show", job_file(tmp_path, text), check=False)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, *needles)


def test_unreadable_job_file(tmp_path: Path) -> None:
    proc = sp("config", "show", str(tmp_path / "missing.yaml"), check=False)
    assert proc.returncode == 2
    assert_one_line_error(proc.stderr, "cannot read job file", "missing.yaml")


STARTPOINT_ROWS = [
    ("unknown stream", ["--stream", "nope", "--oldest"], ("does not read filelog.nope",)),
    ("unknown partition", ["--stream", "pageviews", "-p", "9", "--oldest"], ("no partition 9",)),
    ("negative offset", ["--stream", "pageviews", "-p", "1", "--offset", "-5"], ("offset -5",)),
    ("not an offset", ["--stream", "pageviews", "-p", "1", "--offset", "x"], ("is not an offset",)),
    (
        "future timestamp",
        ["--stream", "pageviews", "--timestamp", "2099-01-01T00:00Z"],
        ("is in the future",),
    ),
    ("malformed timestamp", ["--stream", "pageviews", "--timestamp", "soon"], ("--timestamp",)),
    ("two kinds", ["--stream", "pageviews", "--oldest", "--upcoming"], ("exactly one of",)),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("row", "args", "needles"), STARTPOINT_ROWS, ids=[r[0] for r in STARTPOINT_ROWS]
)
def test_bad_startpoint(
    job: tuple[Path, list[str]], row: str, args: list[str], needles: tuple[str, ...]
) -> None:
    _, set_args = job
    proc = sp("startpoint", "set", str(JOB), *args, *set_args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, *needles)


def _corrupt_checkpoint(data: Path) -> None:
    config = load_config(JOB, {"job.data.dir": str(data)})
    from sparkpoint.checkpoint.manager import GROUPER_FACTORY, checkpoint_stream_name

    key = {
        "systemstreampartition-grouper-factory": GROUPER_FACTORY,
        "taskName": "Partition 1",
        "type": "checkpoint-v2",
    }
    producer = Systems(config).producer("filelog")
    producer.send(checkpoint_stream_name(config), 0, Record("", json.dumps(key).encode(), b"{", 0))
    producer.flush()


def _corrupt_coordinator(data: Path) -> None:
    config = load_config(JOB, {"job.data.dir": str(data)})
    from sparkpoint.metadata.coordinator_stream import coordinator_stream_name

    producer = Systems(config).producer("filelog")
    stream = coordinator_stream_name(config.job_name, config.job_id)
    producer.send(stream, 0, Record("", b'[1,"set-config","task.commit.ms"]', b"{", 0))
    producer.flush()


METADATA_ROWS: list[tuple[str, Callable[[Path], None], str, tuple[str, ...]]] = [
    (
        "corrupt checkpoint",
        _corrupt_checkpoint,
        "checkpoint",
        ("offset", "task Partition 1", "checkpoint is not JSON"),
    ),
    (
        "corrupt coordinator message",
        _corrupt_coordinator,
        "config",
        ("corrupt coordinator stream message", "offset"),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("row", "damage", "tool", "needles"), METADATA_ROWS, ids=[r[0] for r in METADATA_ROWS]
)
def test_corrupt_metadata(
    job: tuple[Path, list[str]],
    tmp_path: Path,
    row: str,
    damage: Callable[[Path], None],
    tool: str,
    needles: tuple[str, ...],
) -> None:
    source, _ = job
    data = tmp_path / "data"
    shutil.copytree(source / "data", data)  # damage a copy; the module's job stays whole
    damage(data)
    proc = sp(tool, "show", str(JOB), "--set", f"job.data.dir={data}", check=False)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, *needles)


@pytest.mark.slow
def test_a_restore_that_cannot_reach_committed_state_is_one_line(tmp_path: Path) -> None:
    """A blob-store store whose snapshot lost its blobs, with the local state gone: the run
    stops with one line naming task, store and checkpoint (it was a 150-line Spark traceback)."""
    sets = [
        f"job.data.dir={tmp_path / 'data'}",
        "task.commit.ms=0",
        "stores.user-counts.backup.factories=blobstore",
    ]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    generate(config, tmp_path / "job.yaml", 200, seed=18, users=8)
    sp("run", str(JOB), "--until-caught-up", *set_args)
    for blob in (tmp_path / "data" / "blobs" / "blobs").iterdir():
        if not blob.read_bytes().startswith(b'{"creation-time-millis"'):
            blob.unlink()  # every file blob; the snapshot indexes stay
    shutil.rmtree(tmp_path / "data" / "state")
    proc = sp("run", str(JOB), "--until-caught-up", *set_args, check=False, timeout=400)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert_one_line_error(proc.stderr, "store user-counts", "cannot restore checkpoint")
    assert not list((tmp_path / "data" / "state").rglob("*.restoring"))


def test_a_damaged_tail_is_refused_then_repaired_without_reusing_its_offset(
    tmp_path: Path,
) -> None:
    """Issue 37: `stream write` cut a damaged last record as a "torn tail" and gave its offset
    to the next record, which a reader whose checkpoint had passed it then skipped."""
    set_args = ["--set", f"job.data.dir={tmp_path / 'data'}"]
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "1", *set_args)
    lines = "".join(
        json.dumps({"key": f"u{i}", "value": {"user": f"u{i}"}}) + "\n" for i in range(5)
    )
    sp("stream", "write", str(JOB), "pageviews", *set_args, stdin=lines)
    log = tmp_path / "data" / "streams" / "filelog" / "pageviews" / "0" / "0.log"
    log.write_bytes(log.read_bytes()[:-3])
    new = json.dumps({"key": "new", "value": {"user": "new"}}) + "\n"
    proc = sp("stream", "write", str(JOB), "pageviews", *set_args, stdin=new, check=False)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "filelog.pageviews partition 0 at offset 4", "stream repair")
    repaired = sp("stream", "repair", str(JOB), "pageviews", *set_args)
    assert (
        "filelog.pageviews.0: removed damaged records 4..4 (offsets not reused)" in repaired.stdout
    )
    sp("stream", "write", str(JOB), "pageviews", *set_args, stdin=new)
    read = sp("stream", "read", str(JOB), "pageviews", *set_args)
    rows = [json.loads(line) for line in read.stdout.splitlines()]
    assert [r["offset"] for r in rows] == ["0", "1", "2", "3", "5"]
    assert rows[-1]["key"] == "new"
    assert "records 4..4 were damaged and removed" in read.stderr


def test_a_second_run_of_a_running_job_is_refused(tmp_path: Path) -> None:
    """Issue 37: a second `sparkpoint run` of a job whose driver was running started too, and
    both failed on RocksDB files the other had changed."""
    import socket
    import subprocess
    import sys
    import time

    from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
    from sparkpoint.metadata.job_state import LIVENESS

    sets = [f"job.data.dir={tmp_path / 'data'}"]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "2", *set_args)
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        store = CoordinatorStreamStore(config, source="heartbeat")
        beat = {
            "host": socket.gethostname(),
            "pid": driver.pid,
            "run-id": "first",
            "heartbeat": int(time.time() * 1000),
        }
        store.put(LIVENESS, "driver", json.dumps(beat))
        store.close()
        proc = sp("run", str(JOB), "--until-caught-up", *set_args, check=False)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert_one_line_error(proc.stderr, "is running already", f"pid {driver.pid}", "--force")
        assert not (tmp_path / "data" / "state").exists()  # it touched no task state
    finally:
        driver.kill()
        driver.wait()


def _stream_job(tmp_path: Path) -> list[str]:
    """A pageviews stream of 2 partitions with 4 messages, for the stream rows below."""
    set_args = ["--set", f"job.data.dir={tmp_path / 'data'}"]
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "2", *set_args)
    lines = "".join(
        json.dumps({"key": f"u{i}", "value": {"user": f"u{i}"}}) + "\n" for i in range(4)
    )
    sp("stream", "write", str(JOB), "pageviews", *set_args, stdin=lines)
    return set_args


def _pageviews_dir(tmp_path: Path) -> Path:
    return tmp_path / "data" / "streams" / "filelog" / "pageviews"


STREAM_ROWS: list[tuple[str, Callable[[Path], None], list[str], tuple[str, ...]]] = [
    (
        "deleted partition directory",
        lambda d: shutil.rmtree(d / "1"),
        ["stream", "list"],
        ("filelog.pageviews partition 1", "is missing", "stream.json lists this partition"),
    ),
    (
        "deleted partition directory, write",
        lambda d: shutil.rmtree(d / "1"),
        ["stream", "write", "pageviews", "--partition", "1"],
        ("filelog.pageviews partition 1", "is missing"),
    ),
    (
        "deleted partition directory, read",
        lambda d: shutil.rmtree(d / "1"),
        ["stream", "read", "pageviews", "--partition", "1"],
        ("filelog.pageviews partition 1", "is missing"),
    ),
    (
        "corrupt stream.json",
        lambda d: (d / "stream.json").write_text("{not json"),
        ["stream", "read", "pageviews"],
        ("stream filelog.pageviews:", "stream.json is not", "JSONDecodeError"),
    ),
    (
        "corrupt CURRENT",
        lambda d: (d / "0" / "CURRENT").write_bytes(b"\xff\xfe"),
        ["stream", "read", "pageviews", "--partition", "0"],
        ("filelog.pageviews partition 0", "CURRENT is not"),
    ),
]


@pytest.mark.parametrize(
    ("row", "damage", "args", "needles"), STREAM_ROWS, ids=[r[0] for r in STREAM_ROWS]
)
def test_damaged_filelog_files(
    tmp_path: Path,
    row: str,
    damage: Callable[[Path], None],
    args: list[str],
    needles: tuple[str, ...],
) -> None:
    """Issue 37: each was a traceback (FileNotFoundError, JSONDecodeError, ValueError)."""
    set_args = _stream_job(tmp_path)
    damage(_pageviews_dir(tmp_path))
    stdin = '{"key": "u", "value": {"user": "u"}}\n' if args[1] == "write" else None
    proc = sp(args[0], args[1], str(JOB), *args[2:], *set_args, check=False, stdin=stdin)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, *needles)


def test_a_message_the_serde_cannot_decode_is_a_user_error(tmp_path: Path) -> None:
    """Issue 37: decode errors exited 1 with a traceback (struct.error, JSONDecodeError)."""
    set_args = _stream_job(tmp_path)
    integer = ["--set", "streams.pageviews.samza.msg.serde=integer"]
    proc = sp("stream", "read", str(JOB), "pageviews", *set_args, *integer, check=False)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "filelog.pageviews.0 offset 0: cannot decode it")
    text = json.dumps({"key": "u", "value": "not a number"}) + "\n"
    proc = sp(
        "stream", "write", str(JOB), "pageviews", *set_args, *integer, stdin=text, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "message 1 for filelog.pageviews: cannot encode it")


def test_a_typo_under_blob_store_is_refused(tmp_path: Path) -> None:
    """Issue 37: blob.store.urll was taken as a filesystem option, so blobs went to the
    default place."""
    typo = ["--set", "blob.store.urll=file:///tmp/x"]
    proc = sp("config", "show", str(JOB), "--set", f"job.data.dir={tmp_path}", *typo, check=False)
    assert proc.returncode == 2, proc.stderr
    assert_one_line_error(proc.stderr, "unknown config key blob.store.urll", "blob.store.url?")


def test_a_task_module_with_a_syntax_error_fails_before_spark_starts(tmp_path: Path) -> None:
    """Issue 37: a 148-line Java traceback from the first batch."""
    (tmp_path / "badtask.py").write_text(
        "from sparkpoint import StreamTask\nclass Bad(StreamTask)\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        "job: {name: bad}\nsystems: {filelog: {factory: filelog}}\n"
        "task: {inputs: filelog.in, class: 'badtask:Bad'}\n"
    )
    proc = sp("run", str(job), "--until-caught-up", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert_one_line_error(proc.stderr, "task.class='badtask:Bad'", "badtask.py:2", "syntax error")
    assert "starting Spark" not in proc.stderr


def _ran_in_process(tmp_path: Path) -> tuple[list[str], Path]:
    """The example job run to its end in this process (no Spark); its --set args."""
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner

    set_args = _stream_job(tmp_path)
    config = load_config(JOB, {"job.data.dir": str(tmp_path / "data"), "task.commit.ms": "0"})
    coordinator = JobCoordinator(config, InlineRunner())
    coordinator.run(until_caught_up=True)
    coordinator.close()
    return set_args, tmp_path / "data"


def test_a_store_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    """Issue 37: a traceback (rmtree on a symbolic link); following the link would delete or
    write files outside the task's directory."""
    import os

    from sparkpoint.errors import RestoreError
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner

    _, data = _ran_in_process(tmp_path)
    task_dir = next(p for p in (data / "state").iterdir() if (p / "user-counts").is_dir())
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(task_dir / "user-counts", elsewhere)
    shutil.rmtree(task_dir / "user-counts")
    os.symlink(elsewhere, task_dir / "user-counts")
    (task_dir / "STATE").unlink()  # the task restores: it must clear its store directory
    config = load_config(JOB, {"job.data.dir": str(data)})
    coordinator = JobCoordinator(config, InlineRunner())
    with pytest.raises(RestoreError, match=r"user-counts is a symbolic link \(to .*elsewhere\)"):
        coordinator.run(until_caught_up=True)
    coordinator.close()
    assert sorted(p.name for p in elsewhere.iterdir())  # nothing behind the link was deleted


def test_a_corrupt_heartbeat_record_is_ignored_by_job_show_and_checkpoint_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37: `job show` and `checkpoint set` gave tracebacks on a corrupt heartbeat; the
    next beat of a live driver overwrites it, so it is taken as no driver, with a WARNING."""
    from sparkpoint.cli import main
    from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
    from sparkpoint.metadata.job_state import LIVENESS

    set_args, data = _ran_in_process(tmp_path)
    config = load_config(JOB, {"job.data.dir": str(data)})
    store = CoordinatorStreamStore(config)
    store.put(LIVENESS, "driver", '{"host": "h", "heartbeat": "soon"')
    store.close()
    assert main(["job", "show", str(JOB), *set_args]) == 0
    assert "not running" in capsys.readouterr().out
    assert "the driver heartbeat record" in caplog.text and "is not valid" in caplog.text
    offsets = tmp_path / "offsets.yaml"
    offsets.write_text("filelog.pageviews.0: 0\n")
    assert main(["checkpoint", "set", str(JOB), "--file", str(offsets), *set_args]) == 0


def test_a_checkpointed_offset_that_is_not_an_offset_is_one_line(tmp_path: Path) -> None:
    """Issue 37: a checkpoint offset `abc` was a ValueError traceback."""
    from sparkpoint.checkpoint import CheckpointId, CheckpointV2
    from sparkpoint.checkpoint.manager import CheckpointManager
    from sparkpoint.checkpoint.offsets import OffsetOutOfRange
    from sparkpoint.model import SystemStreamPartition, TaskName
    from sparkpoint.runtime.driver.coordinator import JobCoordinator
    from sparkpoint.runtime.driver.inline import InlineRunner

    _, data = _ran_in_process(tmp_path)
    config = load_config(JOB, {"job.data.dir": str(data)})
    ssp = SystemStreamPartition("filelog", "pageviews", 0)
    bad = CheckpointV2(CheckpointId.create(), {ssp: "abc"})
    CheckpointManager(config).write_checkpoint(TaskName("Partition 0"), bad)
    coordinator = JobCoordinator(config, InlineRunner())
    with pytest.raises(OffsetOutOfRange, match="offset 'abc' is not an offset of system filelog"):
        coordinator.start()
    coordinator.close()
