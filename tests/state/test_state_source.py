"""A job's committed state as a DataFrame (``sparkpoint-state``) and looked up by key (issue
68): the DataFrame holds what ``sparkpoint state dump`` prints, store by store (plain, window,
session, timers, TTL), the ``tasks`` option reads only those tasks, a filtered query does not
change the next one, and a lookup answers as the dump does, naming the checkpoint it read."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sparkpoint import state
from sparkpoint.errors import UserError
from sparkpoint.system.registry import Systems
from sparkpoint.tools.state import committed_rows
from tests.e2e.cli import sp
from tests.helpers import changelog_job, generate, run_job
from tests.runtime.executor.test_windows import job, send, views


def dumped(job_file: Path, store: str) -> list[dict[str, Any]]:
    out = sp("state", "dump", str(job_file), "--store", store).stdout
    return [json.loads(line) for line in out.splitlines()]


def read(spark: Any, job_file: Path, store: str, **options: str) -> Any:
    reader = spark.read.format("sparkpoint-state").option("job", str(job_file))
    for key, value in {"store": store, **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def job_file(tmp_path: Path, config: Any) -> Path:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(config.to_dict()))  # JSON is YAML
    return path


def test_a_plain_store_reads_as_the_dump_prints_it(tmp_path: Path, spark: Any) -> None:
    config = changelog_job(tmp_path)
    generate(config, tmp_path / "a.yaml", 400, seed=71, users=30)
    run_job(config, until_caught_up=True)
    path = job_file(tmp_path, config)
    state.register(spark)
    df = read(spark, path, "user-counts")
    assert df.columns == ["task", "key", "value"]
    rows = sorted((r["key"], r["value"]) for r in df.collect())  # (its serde's type)
    assert rows == sorted((d["key"], d["value"]) for d in dumped(path, "user-counts"))
    one = read(spark, path, "user-counts", tasks="Partition 1")
    assert one.rdd.getNumPartitions() == 1  # only that task is read
    assert {r["task"] for r in one.collect()} == {"Partition 1"} and one.count() > 0
    keys = [rows[0][0], rows[-1][0]]
    picked = df.where(f"key IN ('{keys[0]}', '{keys[1]}')")
    assert sorted(r["key"] for r in picked.collect()) == sorted(keys)
    # the same DataFrame again, unfiltered: every row (a pushed-down filter leaked into it)
    assert df.where("task = 'Partition 1'").count() == one.count()
    assert df.count() == len(rows)
    # looked up without Spark: as the dump, naming the task's checkpoint
    answers = state.lookup(path, "user-counts", [keys[0], "nobody"])
    assert (answers[0].found, answers[0].value) == (True, rows[0][1])
    assert answers[0].checkpoint and answers[0].task.startswith("Partition ")
    assert (answers[1].found, answers[1].value) == (False, None)
    got = sp("state", "get", str(path), "--store", "user-counts", keys[0]).stdout
    assert json.loads(got)["value"] == rows[0][1]
    with pytest.raises(UserError, match="no store 'nope'"):
        state.lookup(path, "nope", ["a"])


def test_window_session_and_timer_stores_read_as_the_dump_prints_them(
    tmp_path: Path, spark: Any
) -> None:
    config = job(tmp_path)
    send(config, views(300, seed=72, start_ms=0))
    run_job(config, until_caught_up=True)
    path = job_file(tmp_path, config)
    state.register(spark)
    for store in ("minute-counts", "sessions", "timers"):
        df = read(spark, path, store)
        got = sorted(
            json.dumps({k: v for k, v in r.asDict().items() if v is not None}, sort_keys=True)
            for r in df.collect()
        )
        want = []
        for d in dumped(path, store):
            if "value" in d and store != "timers":
                d["value"] = json.dumps(d["value"], separators=(",", ":"))
            if "key" in d and store == "timers":
                d["key"] = json.dumps(d["key"], separators=(",", ":"))
            want.append(json.dumps(d, sort_keys=True))
        assert got == sorted(want), store
    windows = read(spark, path, "minute-counts").columns
    assert windows == ["task", "key", "window_start", "window_end", "value", "fired"]
    marks = read(spark, path, "timers").where("entry = 'watermark'").collect()
    assert len(marks) == 4 and all(r["time"] > 0 for r in marks)


def test_a_ttl_store_reads_with_when_each_entry_expires(tmp_path: Path, spark: Any) -> None:
    ttl = 3_600_000
    config = changelog_job(tmp_path, **{"stores.user-counts.rocksdb.ttl.ms": str(ttl)})
    generate(config, tmp_path / "a.yaml", 200, seed=73, users=20)
    before = int(time.time() * 1000)
    run_job(config, until_caught_up=True)
    after = int(time.time() * 1000)
    path = job_file(tmp_path, config)
    state.register(spark)
    df = read(spark, path, "user-counts")
    assert df.columns == ["task", "key", "value", "expires_at"]
    rows = df.collect()
    assert rows and all(before + ttl <= r["expires_at"] <= after + ttl for r in rows)
    dumped_rows = {d["key"]: d["expires_at"] for d in dumped(path, "user-counts")}
    assert dumped_rows == {r["key"]: r["expires_at"] for r in rows}


def test_a_key_the_input_does_not_place_is_found_in_the_task_that_holds_it(
    tmp_path: Path,
) -> None:
    """Views keyed (and partitioned) by page, counted per user: a user's count is in whichever
    task read the view, not where the partitioner would put the user. The lookup looks there
    too (it answered "not found" from the routed task only)."""
    from generate import write

    config = changelog_job(tmp_path)
    source = tmp_path / "gen.json"
    source.write_text(json.dumps(dict(config.items())))
    admin = Systems(config).admin("filelog")
    place = lambda key: admin.partition_for_key(key.encode(), 4)  # noqa: E731
    # each user views one page, which the partitioner places in another task than the user
    pairs = [(f"user-{i}", f"page-{i}") for i in range(40)]
    pairs = [(u, p) for u, p in pairs if place(u) != place(p)]
    views = [{"user": u, "page": p, "ts": 1_700_000_000_000 + n} for n, (u, p) in enumerate(pairs)]
    write(str(source), 0, 0, 0, source=views * 3, key_field="page")
    run_job(config, until_caught_up=True)
    path = job_file(tmp_path, config)
    held = {(t, r["key"]): r["value"] for t, _, r in committed_rows(config, "user-counts")}
    users = sorted({k for _t, k in held})
    answers = state.lookup(path, "user-counts", users)
    assert len(users) == len(pairs) > 10
    assert [a.key for a in answers] == users and all(a.found for a in answers)
    assert all(held[(a.task, a.key)] == a.value == 3 for a in answers)
