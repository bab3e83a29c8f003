"""The window arithmetic and layout (sparkpoint.storage.windows), on both engines: which
windows a record is in, how sessions grow and merge, what each aggregate keeps, when a record
is late, and bad specs refused with what to fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.errors import ConfigError
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.kv.factory import open_engine
from sparkpoint.storage.windows import (
    Open,
    WindowSpec,
    WindowState,
    collect,
    count,
    entry_key,
    max_of,
    min_of,
    reduce_with,
    split_entry_key,
    sum_of,
)


@pytest.fixture(params=["rocksdb", "in-memory"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueEngine]:
    e = open_engine("windows", str(request.param), tmp_path / "db")
    yield e
    e.close()


def test_a_record_is_in_its_tumbling_window_and_in_size_over_slide_hopping_ones() -> None:
    assert WindowSpec.tumbling(60).windows_of(59) == [(0, 60)]
    assert WindowSpec.tumbling(60).windows_of(60) == [(60, 120)]
    assert WindowSpec.hopping(60, 20).windows_of(65) == [(20, 80), (40, 100), (60, 120)]
    assert WindowSpec.hopping(60, 20).windows_of(5) == [(0, 60)]  # none starts before 0


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: WindowSpec.tumbling(0), "a window's size must be a positive integer"),
        (lambda: WindowSpec.tumbling(-5), "a window's size must be a positive integer"),
        (lambda: WindowSpec.hopping(60, 25), r"size \(60 ms\) must be a multiple of its slide"),
        (lambda: WindowSpec.session(0), "a session's gap must be a positive integer"),
        (lambda: WindowSpec.tumbling(1.5), "not 1.5"),  # type: ignore[arg-type]
    ],
)
def test_bad_window_specs_say_what_to_fix(make: object, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        make()  # type: ignore[operator]


def test_tumbling_windows_count_and_refuse_a_record_for_a_closed_window(
    engine: KeyValueEngine,
) -> None:
    state = WindowState(engine, WindowSpec.tumbling(60), count())
    assert state.add(b"a", 10, None, None) == ([Open(0, 60, 1)], [])  # opened: needs a timer
    assert state.add(b"a", 20, None, None) == ([], [])  # joined an open window
    assert state.add(b"a", 70, None, 59) == ([Open(60, 120, 1)], [])
    assert state.add(b"a", 30, None, 60) is None  # [0, 60) is closed: late
    assert [(w.start, w.acc) for w in state.of(b"a")] == [(0, 2), (60, 1)]
    assert state.close(b"a", 0) == Open(0, 60, 2)
    assert state.close(b"a", 0) is None
    assert [w.start for w in state.of(b"a")] == [60]


def test_windows_taken_out_are_gone_at_once_and_deleted_together(
    engine: KeyValueEngine,
) -> None:
    """``take`` (how closing windows leave) hides a window from every read at once; its
    deletion waits for ``settle`` or the next write, which writes it first."""
    state = WindowState(engine, WindowSpec.tumbling(60), count())
    for key in (b"a", b"b"):
        state.add(key, 10, None, None)
        state.add(key, 70, None, None)
    assert state.take(b"a", 0) == Open(0, 60, 1)
    assert state.take(b"a", 0) is None and state.get(b"a", 0) is None
    assert [w.start for w in state.of(b"a")] == [60]
    assert engine.get(entry_key(b"a", 0)) is not None  # not deleted yet
    assert state.add(b"a", 20, None, None) == ([Open(0, 60, 1)], [])  # a new window
    assert [(w.start, w.acc) for w in state.of(b"a")] == [(0, 1), (60, 1)]
    assert state.take(b"b", 0) == Open(0, 60, 1)
    state.settle()
    assert engine.get(entry_key(b"b", 0)) is None
    assert [w.start for w in state.of(b"b")] == [60]


def test_sessions_grow_and_a_bridging_record_merges_two(engine: KeyValueEngine) -> None:
    state = WindowState(engine, WindowSpec.session(10), collect())
    assert state.add(b"k", 100, "a", None) == ([Open(100, 100, ["a"])], [])
    assert state.add(b"k", 120, "c", None) == ([Open(120, 120, ["c"])], [])  # 20 apart: two
    opened, gone = state.add(b"k", 105, "b", None) or ([], [])
    assert opened == [Open(100, 105, ["a", "b"])] and gone == [Open(100, 100, ["a"])]
    assert state.add(b"k", 131, "d", None) == ([Open(131, 131, ["d"])], [])  # over a gap apart
    opened, gone = state.add(b"k", 112, "x", None) or ([], [])  # under 10 from both: bridges
    assert opened == [Open(100, 120, ["a", "b", "x", "c"])]
    assert gone == [Open(100, 105, ["a", "b"]), Open(120, 120, ["c"])]
    assert list(state.of(b"k")) == [Open(100, 120, ["a", "b", "x", "c"]), Open(131, 131, ["d"])]
    assert state.add(b"k", 110, "y", None) == ([], [])  # inside: nothing to re-time
    assert state.add(b"k", 300, "z", 311) is None  # its own session would be closed: late
    assert state.add(b"k", 300, "z", 310) is not None  # 310 = 300 + the gap: still open
    assert state.add(b"k", 141, "e", None) == (
        [Open(131, 141, ["d", "e"])],
        [Open(131, 131, ["d"])],
    )


def test_a_record_that_would_join_a_closed_session_is_late(engine: KeyValueEngine) -> None:
    """A session closed by the watermark whose timer has not fired yet (more timers due than a
    batch fires) takes no record: one within its gap is late, and the session stays as it
    went out."""
    state = WindowState(engine, WindowSpec.session(10), count())
    assert state.add(b"k", 100, None, None) == ([Open(100, 100, 1)], [])
    assert state.add(b"k", 105, None, 120) is None  # [100, 100] closes at 111 <= 120
    assert state.add(b"k", 95, None, 120) is None
    assert list(state.of(b"k")) == [Open(100, 100, 1)]
    assert state.add(b"k", 200, None, 120) == ([Open(200, 200, 1)], [])  # far from it: its own


def test_aggregates_fold_and_merge() -> None:
    for aggregate, values, want in [
        (count(), [5, 6, 7], 3),
        (sum_of(), [5, 6, 7], 18),
        (min_of(), [5, 2, 7], 2),
        (max_of(), [5, 9, 7], 9),
        (reduce_with(lambda a, b: a * b), [2, 3, 4], 24),
        (collect(), [1, 2], [1, 2]),
    ]:
        acc = aggregate.init()
        for v in values:
            acc = aggregate.add(acc, v)
        assert aggregate.result(acc) == want, aggregate.name
    assert max_of().merge(None, 3) == 3 and min_of().merge(4, None) == 4
    with pytest.raises(ValueError, match=r"collect\(limit=2\)"):
        collect(limit=2).add([1, 2], 3)


def test_keys_sharing_a_prefix_keep_their_own_windows(engine: KeyValueEngine) -> None:
    state = WindowState(engine, WindowSpec.tumbling(60), count())
    state.add(b"ab", 1, None, None)
    state.add(b"a", 1, None, None)
    state.add(b"a\x00", 1, None, None)
    assert [w.acc for w in state.of(b"a")] == [1]
    assert split_entry_key(entry_key(b"a\x00", 42)) == (b"a\x00", 42)


def _fold_by_definition(
    spec: WindowSpec, windows: list[Open], t: int, value: str, closed_upto: int | None
) -> list[Open] | None:
    """What ``fold`` must give, written from the definitions (no fast path): a record joins
    each ``[start, end)`` window it is in that is not closed; a session joins every session
    within a gap of it, unless one of them (or its own) closed."""
    if spec.is_session:
        gap = spec.gap_ms
        near = [w for w in windows if w.start - gap <= t <= w.end + gap]
        if closed_upto is not None:
            if not near and spec.closes_at(t) <= closed_upto:
                return None
            if any(spec.closes_at(w.end) <= closed_upto for w in near):
                return None
        # the values in time order: sessions starting at or before the record come first
        accs = [w.acc for w in near if w.start <= t] + [[value]]
        accs += [w.acc for w in near if w.start > t]
        merged = Open(
            min([t, *(w.start for w in near)]),
            max([t, *(w.end for w in near)]),
            [v for acc in accs for v in acc],
        )
        return sorted([w for w in windows if w not in near] + [merged], key=lambda w: w.start)
    by_start = {w.start: w for w in windows}
    joined = False
    for start, end in spec.windows_of(t):
        if closed_upto is not None and end <= closed_upto:
            continue
        old = by_start.get(start, Open(start, end, []))
        by_start[start] = Open(start, end, [*old.acc, value], old.fired)
        joined = True
    return [by_start[s] for s in sorted(by_start)] if joined else None


@pytest.mark.parametrize(
    "spec", [WindowSpec.tumbling(10), WindowSpec.hopping(10, 5), WindowSpec.session(4)]
)
def test_fold_gives_what_the_definitions_give_for_any_records(spec: WindowSpec) -> None:
    """Random records (in and out of order, some late) folded one by one: each step's windows
    are those of the definitions, for every kind (each has its own fast path in ``fold``)."""
    import random

    rng = random.Random(7)
    state = WindowState(open_engine("w", "in-memory", Path(".")), spec, collect())
    for _ in range(300):
        windows: list[Open] = []
        closed: int | None = None
        for i in range(rng.randint(1, 12)):
            t = rng.randint(0, 60)
            if rng.random() < 0.2:
                closed = rng.randint(0, 40)
            want = _fold_by_definition(spec, windows, t, f"v{i}", closed)
            got = state.fold(windows, t, f"v{i}", closed)
            assert got == want, (spec, windows, t, closed)
            windows = got if got is not None else windows


def test_an_accumulator_is_stored_as_the_standard_library_writes_it(
    engine: KeyValueEngine,
) -> None:
    """Scalars go through the serde's fast path; anything else as ``json.dumps`` writes it: a
    dict with keys of mixed types is stored (its keys as JSON makes them), and a value JSON
    does not have is refused, not stored as something else."""
    import enum

    state = WindowState(engine, WindowSpec.tumbling(10), collect())
    state.write(b"k", [], [Open(0, 10, 3), Open(10, 20, {None: 1, "a": [2.5, "x"]})])
    assert list(state.of(b"k")) == [Open(0, 10, 3), Open(10, 20, {"null": 1, "a": [2.5, "x"]})]

    class Colour(enum.Enum):
        RED = "red"

    with pytest.raises(TypeError):
        state.write(b"j", [], [Open(0, 10, {"c": Colour.RED})])
