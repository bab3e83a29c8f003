"""The contract every table system keeps (Delta, Iceberg, PostgreSQL), through the system
interfaces sparkpoint's output path uses, read back by each table's own client: rows and Arrow
batches land; an upsert keeps the last row of each key; a commit is published once whatever is
retried; staged parts are swept; the schema is held (issue 67)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkpoint.errors import TableSchemaError, UserError
from sparkpoint.failpoints import InjectedCrash
from sparkpoint.system.registry import Systems
from sparkpoint.system.tables.system import TableAdmin, TableStaging
from tests.system.tables.conftest import TableKind

OWNER = "job-1.Partition_0"


def systems(tables: TableKind, **settings: str) -> Systems:
    return Systems({**tables.config, **settings})


def staging(s: Systems) -> TableStaging:
    admin = s.admin("t")
    assert isinstance(admin, TableAdmin)
    return admin.output_staging()


def stage(s: Systems, part: str, rows: list[dict[str, Any]], owner: str = OWNER) -> None:
    table = "views"
    producer = staging(s).producer(owner, part)
    producer.send_rows(table, rows)
    assert producer.stage() == {(table, 0): part}


def test_rows_and_arrow_batches_are_appended_in_one_commit_per_flush(tables: TableKind) -> None:
    s = systems(tables)
    producer = s.producer("t")
    producer.send_rows("views", [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    producer.send_batch("views", pa.record_batch({"user": ["c"], "n": pa.array([3], pa.int32())}))
    producer.send_rows("views", [{"user": "d", "n": None}])
    producer.flush()
    assert tables.read("views") == [
        {"user": "a", "n": 1},
        {"user": "b", "n": 2},
        {"user": "c", "n": 3},
        {"user": "d", "n": None},
    ]
    assert tables.commits("views") in (1, -1)  # one table commit for the flush
    assert s.admin("t").list_streams() == ["views"]
    producer.flush()  # nothing held: no empty commit
    assert tables.commits("views") in (1, -1)


def test_an_upsert_keeps_the_last_row_of_each_key(tables: TableKind) -> None:
    s = systems(tables, **{"streams.counts.table.mode": "upsert", "streams.counts.table.key": "u"})
    producer = s.producer("t")
    producer.send_rows("counts", [{"u": "a", "n": 1}, {"u": "b", "n": 1}, {"u": "a", "n": 2}])
    producer.flush()
    producer.send_rows("counts", [{"u": "b", "n": 5}, {"u": "c", "n": 1}])
    producer.flush()
    assert tables.read("counts") == [{"u": "a", "n": 2}, {"u": "b", "n": 5}, {"u": "c", "n": 1}]
    producer.send_rows("counts", [{"u": None, "n": 1}])
    with pytest.raises(TableSchemaError, match="counts: 1 rows have no value in key column 'u'"):
        producer.flush()


def test_a_staged_commit_is_published_once_whoever_publishes_it_again(tables: TableKind) -> None:
    s = systems(tables)
    store = staging(s)
    stage(s, "p1", [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    stage(s, "p2", [{"user": "c", "n": 3}])
    assert [(p.owner, p.part, p.records) for p in store.staged("views")] == [
        (OWNER, "p1", 2),
        (OWNER, "p2", 1),
    ]
    assert "views" not in s.admin("t").list_streams()  # nothing visible: no table yet
    assert store.publish("views", 0, OWNER, 10, ["p1", "p2"]) == 3
    assert store.staged("views") == []  # deleted once in the table
    stage(s, "p1", [{"user": "a", "n": 1}, {"user": "b", "n": 2}])  # a replay stages it again
    assert store.publish("views", 0, OWNER, 10, ["p1"]) == 0  # the same commit: nothing
    assert store.publish("views", 0, OWNER, 9, []) == 0  # an older one: nothing
    assert store.staged("views") == []
    assert len(tables.read("views")) == 3
    # a DataFrame batch's key (the batch log's epoch in ms, then the batch) exceeds 64 bits
    big = 1_765_000_000_000 * 1_000_000_000 + 7
    stage(s, "p3", [{"user": "d", "n": 4}], "job-1-batches")
    assert store.publish("views", 0, "job-1-batches", big, ["p3"]) == 1
    stage(s, "p4", [{"user": "e", "n": 5}], "job-1-batches")
    assert store.publish("views", 0, "job-1-batches", big, ["p4"]) == 0
    stage(s, "p4", [{"user": "e", "n": 5}], "job-1-batches")
    assert store.publish("views", 0, "job-1-batches", big + 1, ["p4"]) == 1
    assert len(tables.read("views")) == 5
    assert store.publishers("views", 0) == sorted([OWNER, "job-1-batches"])


def test_a_publish_takes_the_staged_file_not_the_rows_held_since(tables: TableKind) -> None:
    """A process keeps the rows it staged for its own publish; what is on disk wins when
    another process staged the part again, or swept it."""
    s, other = systems(tables), systems(tables)  # two processes' systems, one directory
    stage(s, "p1", [{"user": "a", "n": 1}])
    stage(other, "p1", [{"user": "b", "n": 2}])  # a later attempt staged the part again
    assert staging(s).publish("views", 0, OWNER, 5, ["p1"]) == 1
    assert tables.read("views") == [{"user": "b", "n": 2}]
    stage(s, "p2", [{"user": "c", "n": 3}])
    assert staging(other).sweep("views", "job-1.", ()) == {OWNER: 1}
    with pytest.raises(UserError, match="staged part p2 of job-1.Partition_0 is missing"):
        staging(s).publish("views", 0, OWNER, 6, ["p2"])
    assert tables.read("views") == [{"user": "b", "n": 2}]


@pytest.mark.parametrize("point", ["publish-after-intent", "publish-after-append"])
def test_a_publish_killed_half_way_is_finished_by_the_next(tables: TableKind, point: str) -> None:
    s = systems(tables)
    store = staging(s)
    stage(s, "p1", [{"user": "a", "n": 1}])
    flag = tables.data_dir / "flag"
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.write_text("0")
    crash = {"testing.crash.at": point, "testing.crash.flag": str(flag)}
    with pytest.raises(InjectedCrash):
        store.publish("views", 0, OWNER, 5, ["p1"], crash)
    written = store.publish("views", 0, OWNER, 5, ["p1"], crash)
    assert written == (1 if point == "publish-after-intent" else 0)
    assert tables.read("views") == [{"user": "a", "n": 1}]
    assert store.staged("views") == []


def test_a_sweep_deletes_the_parts_no_commit_names(tables: TableKind) -> None:
    s = systems(tables)
    store = staging(s)
    stage(s, "keep", [{"user": "a", "n": 1}])
    stage(s, "lost", [{"user": "b", "n": 2}])
    assert store.streams() == ["views"]
    assert store.sweep("views", "other-1.", ()) == {}
    assert store.sweep("views", "job-1.", ["keep"]) == {OWNER: 1}
    assert [p.part for p in store.staged("views")] == ["keep"]
    assert [r.value for r in store.read_part("views", 0, OWNER, "keep")] == [
        b'{"user": "a", "n": 1}'
    ]


def test_a_missing_part_of_an_unpublished_commit_stops_the_publish(tables: TableKind) -> None:
    s = systems(tables)
    with pytest.raises(UserError, match="staged part gone of job-1.Partition_0 is missing"):
        staging(s).publish("views", 0, OWNER, 5, ["gone"])


def test_a_new_column_is_refused_or_added_and_a_changed_type_refused(tables: TableKind) -> None:
    s = systems(tables)
    producer = s.producer("t")
    producer.send_rows("views", [{"user": "a", "n": 1}])
    producer.flush()
    producer.send_rows("views", [{"user": "b", "n": 2, "page": "/"}])
    with pytest.raises(TableSchemaError) as refused:
        producer.flush()
    assert str(refused.value) == (
        "table t.views: column 'page' is not in the table; set "
        "streams.views.table.schema.evolution: add-columns to add it, or drop it"
    )
    evolving = systems(tables, **{"streams.views.table.schema.evolution": "add-columns"})
    producer = evolving.producer("t")
    producer.send_rows("views", [{"user": "b", "n": 2, "page": "/"}])
    producer.send_batch("views", pa.record_batch({"user": ["c"]}))  # a column left out: null
    producer.flush()
    assert tables.read("views") == [
        {"user": "a", "n": 1, "page": None},
        {"user": "b", "n": 2, "page": "/"},
        {"user": "c", "n": None, "page": None},
    ]
    producer.send_rows("views", [{"user": "d", "n": "many"}])
    with pytest.raises(TableSchemaError, match="column 'n' is int64 in the table but string"):
        producer.flush()
    assert len(tables.read("views")) == 3  # nothing of the refused batches


def test_rows_with_other_columns_and_columns_with_no_value(tables: TableKind) -> None:
    """Found in review: a batch's columns are those of all its rows, not of its first; a
    column with no value in a table's first batch leaves no column of no type behind."""
    s = systems(tables, **{"streams.views.table.schema.evolution": "add-columns"})
    producer = s.producer("t")
    producer.send_rows("views", [{"user": "a", "note": None}, {"user": "b", "n": 2}])
    producer.flush()
    assert tables.read("views") == [{"user": "a", "n": None}, {"user": "b", "n": 2}]
    producer.send_rows("views", [{"user": "c", "n": 3, "note": "x"}])
    producer.flush()
    assert tables.read("views")[-1] == {"user": "c", "n": 3, "note": "x"}
