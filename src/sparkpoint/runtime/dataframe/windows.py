"""``batch.window``: the task API's window stores (:mod:`sparkpoint.runtime.executor.windows`)
as a stateful step of a DataFrame pipeline.

The step adds each row of its input to each of its window stores (the same layout and the same
timers as ``context.windows``, so a job can move between the APIs and keep its open windows);
once the batch's rows are in, the watermark advances, the due windows close, and the step
yields them as rows ``store, key, window_start, window_end, value``. Late rows go to each
window's named stream, sent and flushed before the step ends (at-least-once, as every output).
A pipeline's timers belong to one step, so one ``batch.window`` step holds all its windows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkpoint.errors import ConfigError, TaskError
from sparkpoint.runtime.dataframe.task import NoOutput, StepCode, StepState
from sparkpoint.runtime.executor.output import OutputCollector
from sparkpoint.runtime.executor.windows import TaskWindows, WindowedStore
from sparkpoint.storage.windows import Aggregate, Window, WindowSpec, count

#: the columns of ``batch.window``'s result, after ``value``'s type
SCHEMA = (
    "store STRING, key STRING, window_start LONG, window_end LONG, value {value_type}, "
    "emission STRING"
)


@dataclass(frozen=True)
class WindowDef:
    """One window store of a ``batch.window`` step: its store, windows and aggregate."""

    store: str
    spec: WindowSpec
    aggregate: Aggregate
    late_stream: str | None = None
    #: the triggers (:class:`~sparkpoint.runtime.executor.windows.Triggers`)
    early: bool = False
    allowed_lateness_ms: int = 0


def tumbling_window(
    store: str,
    *,
    size_ms: int,
    aggregate: Aggregate | None = None,
    late_stream: str | None = None,
    early: bool = False,
    allowed_lateness_ms: int = 0,
) -> WindowDef:
    """Windows ``[n*size, (n+1)*size)`` kept in ``store`` (default aggregate: count)."""
    spec = WindowSpec.tumbling(size_ms)
    agg = aggregate or count()
    return WindowDef(store, spec, agg, late_stream, early, allowed_lateness_ms)


def hopping_window(
    store: str,
    *,
    size_ms: int,
    slide_ms: int,
    aggregate: Aggregate | None = None,
    late_stream: str | None = None,
    early: bool = False,
    allowed_lateness_ms: int = 0,
) -> WindowDef:
    """Windows of ``size_ms`` every ``slide_ms``, kept in ``store``."""
    spec = WindowSpec.hopping(size_ms, slide_ms)
    agg = aggregate or count()
    return WindowDef(store, spec, agg, late_stream, early, allowed_lateness_ms)


def session_window(
    store: str,
    *,
    gap_ms: int,
    aggregate: Aggregate | None = None,
    late_stream: str | None = None,
    early: bool = False,
) -> WindowDef:
    """A key's rows at most ``gap_ms`` apart, kept in ``store``."""
    spec = WindowSpec.session(gap_ms)
    return WindowDef(store, spec, aggregate or count(), late_stream, early)


def window_defs(windows: WindowDef | Sequence[WindowDef]) -> list[WindowDef]:
    defs = [windows] if isinstance(windows, WindowDef) else list(windows)
    if not defs or not all(isinstance(d, WindowDef) for d in defs):
        raise ConfigError(
            "batch.window(windows=...) takes tumbling_window(...), hopping_window(...) or "
            f"session_window(...), or a list of them; got {windows!r}"
        )
    stores = [d.store for d in defs]
    if len(set(stores)) != len(stores):
        raise ConfigError(f"batch.window: two windows keep their state in one store ({stores})")
    return defs


#: the collector of a window step without late streams: its windows go out as rows
_NOWHERE = NoOutput("a window step without a late stream")


def _column(chunk: pa.RecordBatch, name: str | None, rows: int) -> list[Any]:
    return [None] * rows if name is None else chunk.column(name).to_pylist()


class WindowStep:
    """The functions of a window step (picklable): rows in, closed windows out."""

    def __init__(
        self, defs: Sequence[WindowDef], key: str, time: str | None, value: str | None
    ) -> None:
        self.defs = list(defs)
        self.key = key
        self.time = time
        self.value = value
        self._closed: list[tuple[str, Window]] = []
        self._late: Any = _NOWHERE

    def code(self) -> StepCode:
        return StepCode(self.add, self.on_timer, finish=self.finish)

    def add(self, state: StepState, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Each row into its windows of every store (one batch's rows, in order)."""
        self._closed = []
        stores = self._open(state)
        late = self._late
        for chunk in chunks:
            keys = chunk.column(self.key).to_pylist()
            times = _column(chunk, self.time, len(keys))
            values = _column(chunk, self.value, len(keys))
            for key, at, value in zip(keys, times, values, strict=True):
                for windows in stores:
                    windows.add(key, at, value, collector=late)
        yield from ()

    def _open(self, state: StepState) -> list[WindowedStore]:
        self._late = _NOWHERE
        if any(d.late_stream for d in self.defs):
            self._late = state.late_collector()
        opened = []
        stores = {d.store: state.store(d.store) for d in self.defs}
        opener = TaskWindows(state.task_name, state.config, stores, state.timers)
        for d in self.defs:

            def emit(window: Window, _collector: Any, store: str = d.store) -> None:
                self._closed.append((store, window))

            opened.append(
                opener.open(
                    d.store,
                    d.spec,
                    aggregate=d.aggregate,
                    emit=emit,
                    time="event" if self.time is not None else "processing",
                    late_stream=d.late_stream,
                    early=d.early,
                    allowed_lateness_ms=d.allowed_lateness_ms,
                )
            )
        return opened

    def on_timer(self, state: StepState, expired: Any) -> Iterable[Any]:
        """A timer of the step's own: there are none (its windows' timers close windows)."""
        raise TaskError(
            f"task {state.task_name}: a window step got {len(expired)} timers it did not "
            "register; the timer store holds another step's timers"
        )

    def finish(self, state: StepState) -> Iterator[pa.RecordBatch]:
        """The windows that closed, as rows; late rows sent and flushed."""
        if isinstance(self._late, OutputCollector):
            self._late.flush()
            self._late.close()
        self._late = _NOWHERE
        closed, self._closed = self._closed, []
        if closed:
            yield pa.RecordBatch.from_pydict(
                {
                    "store": pa.array([s for s, _ in closed], pa.string()),
                    "key": pa.array([str(w.key) for _, w in closed], pa.string()),
                    "window_start": pa.array([w.start for _, w in closed], pa.int64()),
                    "window_end": pa.array([w.end for _, w in closed], pa.int64()),
                    "value": pa.array([w.value for _, w in closed]),
                    "emission": pa.array([w.emission for _, w in closed], pa.string()),
                }
            )


__all__ = [
    "SCHEMA",
    "WindowDef",
    "WindowStep",
    "hopping_window",
    "session_window",
    "tumbling_window",
    "window_defs",
]
