"""Which of a DataFrame batch's outputs run fused with their stateful step (driver side).

Written plainly, a stateful step's rows go from its Python worker into a cache in the JVM, and
from there to a second Python worker that sends them to the output stream. When stream outputs
are the only readers of the step, each its rows or the rows one column's value picks (with
columns selected or renamed: a :class:`~sparkpoint.runtime.dataframe.udfs.Route`),
:class:`~sparkpoint.runtime.dataframe.udfs.FusedStep` sends them from the step's own worker
instead (one Python pass, no cache). When, in addition,
the step's input is only columns and struct fields of ``batch.df`` (``select("task",
"value.user")``, say), :class:`~sparkpoint.runtime.dataframe.udfs.FusedRead` has each task read
its messages in that same worker, and no row crosses the JVM.

Both decisions read Spark's plans. Each step's UDF is named with a token unique to the batch
(:func:`step_token`), and a plan that reads the step prints that name; the batch source's UDF
likewise. Anything this module does not recognise keeps the plain path, which is always
correct; a plan misread as fusable is caught by the step's run-once guard, never counted twice.
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.runtime.dataframe.source import arrow_schema
from sparkpoint.runtime.dataframe.udfs import Projection, Route, StepUdf

log = logging.getLogger(__name__)


def step_token(step: str, batch: int) -> str:
    """The name of a step's UDF in Spark's plans, unique to the pipeline's batch (the step's
    name made an identifier, and its checksum: steps ``a-b`` and ``a_b`` differ)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", step)
    return f"sparkpoint_step_{name}_{zlib.crc32(step.encode()):08x}_b{batch}"


def source_token(batch: int) -> str:
    """The name of the batch source's UDF in Spark's plans."""
    return f"sparkpoint_batch_source_b{batch}"


@dataclass(frozen=True)
class StepFrame:
    """A stateful step of a batch: its UDF, input and output DataFrames, declared schema."""

    udf: StepUdf
    input: Any
    output: Any
    schema: str


def plan_text(df: Any) -> str | None:
    """The analyzed logical plan of ``df`` as text; ``None`` if it is not a Spark DataFrame."""
    try:
        return str(df._jdf.queryExecution().analyzed().toString())
    except Exception:  # not a DataFrame of this session
        return None


def reads(df: Any, token: str) -> bool:
    """Whether ``df``'s plan reads the UDF named ``token`` (``True`` when it cannot tell)."""
    text = plan_text(df)
    return text is None or _calls(text, token)


def _calls(text: str, token: str) -> bool:
    """Whether a plan's text calls the UDF named ``token`` itself (``token(``), not one whose
    name merely contains it."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(token)}\(", text) is not None


def fusable(
    spark: Any, steps: Sequence[StepFrame], outputs: Sequence[tuple[Any, bool]]
) -> dict[int, tuple[StepFrame, Route]]:
    """The outputs (by index into ``outputs``, pairs of a DataFrame and whether it goes to a
    sparkpoint stream) that can run fused with the step they send, each with the rows it
    takes (:func:`step_route`): the stream outputs of an Arrow step whose every reader is such
    an output (the step's own DataFrame, or rows of it picked by one column's value, with its
    columns selected or renamed), and no other step's input."""
    fused: dict[int, tuple[StepFrame, Route]] = {}
    for step in steps:
        if step.udf.pandas:
            continue
        token = step.udf.__name__
        if any(reads(s.input, token) for s in steps if s is not step):
            continue
        routes: dict[int, Route] = {}
        for i, (df, to_stream) in enumerate(outputs):
            if df is step.output:
                route: Route | None = Route()
            elif reads(df, token):
                route = step_route(spark, df, step)
            else:
                continue
            if not to_stream or route is None:
                break
            routes[i] = route
        else:
            fused.update({i: (step, route) for i, route in routes.items()})
    return fused


def step_route(spark: Any, df: Any, step: StepFrame) -> Route | None:
    """How ``df`` takes its rows from ``step``, if only so: ``step.output`` with a filter that
    one column equals a string or integer literal, and columns selected, renamed or taken
    from structs (Spark's optimized plan ``Project(Filter(MapInArrow))``, each part optional).
    ``None`` for anything else (a computed column, an aggregation, another condition)."""
    token = step.udf.__name__
    try:
        plan = _optimized(spark, df)
        projection = None
        if plan.getClass().getSimpleName() == "Project":
            projection = _items(plan.projectList())
            plan = plan.child()
        where = None
        if plan.getClass().getSimpleName() == "Filter":
            where = _equality(plan.condition())
            if where is None:
                return None
            plan = plan.child()
        if not _is_source(plan, token):
            return None
    except Exception as exc:  # a plan this module does not know: the plain path
        log.debug("no route from a stateful step to an output: %s", exc)
        return None
    if projection is None:
        if list(df.columns) != list(step.output.columns):
            return None
        return Route(where)
    if [name for name, _ in projection] != list(df.columns):
        return None
    return Route(where, projection, arrow_schema(df.schema))


_EQUATABLE = frozenset({"string", "tinyint", "smallint", "int", "bigint"})


def _equality(condition: Any) -> tuple[str, str | int] | None:
    """``(column, value)`` of a condition that is ``column = literal`` (with Spark's inferred
    ``isnotnull(column)``, which the equality implies), else ``None``."""
    parts = [condition]
    conjuncts = []
    while parts:
        expr = parts.pop()
        if expr.getClass().getSimpleName() == "And":
            parts += [expr.left(), expr.right()]
        else:
            conjuncts.append(expr)
    equal = [c for c in conjuncts if c.getClass().getSimpleName() == "EqualTo"]
    if len(equal) != 1:
        return None
    left, right = equal[0].left(), equal[0].right()
    if left.getClass().getSimpleName() == "Literal":
        left, right = right, left
    if (
        left.getClass().getSimpleName() != "AttributeReference"
        or right.getClass().getSimpleName() != "Literal"
        or right.value() is None
    ):
        return None
    column = str(left.name())
    kind = str(left.dataType().simpleString())
    if kind not in _EQUATABLE or str(right.dataType().simpleString()) != kind:
        return None
    for other in conjuncts:
        if other is equal[0]:
            continue
        child = other.child() if other.getClass().getSimpleName() == "IsNotNull" else None
        if child is None or child.getClass().getSimpleName() != "AttributeReference":
            return None
        if str(child.name()) != column:
            return None
    value = right.value()
    return column, (str(value.toString()) if kind == "string" else int(value))


def _items(items: Any) -> Projection:
    projection: Projection = []
    for i in range(items.size()):
        column = _column(items.apply(i))
        if column is None:
            raise ValueError(f"not a column: {items.apply(i)}")
        projection.append(column)
    return projection


def source_projection(spark: Any, df: Any, token: str) -> Projection | None:
    """How ``df`` is made from the batch source (the UDF named ``token``), if it is only that
    source's columns and struct fields, renamed or not: ``[(name, (column, field, ...))]`` in
    ``df``'s column order. ``None`` for anything else (a filter, a computed column, a join)."""
    try:
        projection = _projection(_optimized(spark, df), token)
    except Exception as exc:  # a plan this module does not know: the plain path
        log.debug("no source projection for a stateful step's input: %s", exc)
        return None
    if projection is None or [name for name, _ in projection] != list(df.columns):
        return None
    return projection


def _optimized(spark: Any, df: Any) -> Any:
    """``df``'s optimized logical plan (a JVM object): what Spark would run."""
    optimizer = spark._jsparkSession.sessionState().optimizer()
    return optimizer.execute(df._jdf.queryExecution().analyzed())


def _projection(plan: Any, token: str) -> Projection | None:
    if _is_source(plan, token):
        output = plan.output()
        names = [str(output.apply(i).name()) for i in range(output.size())]
        return [(name, (name,)) for name in names]
    if plan.getClass().getSimpleName() != "Project" or not _is_source(plan.child(), token):
        return None
    try:
        return _items(plan.projectList())
    except ValueError:
        return None


def _is_source(node: Any, token: str) -> bool:
    return node.getClass().getSimpleName() == "MapInArrow" and _calls(
        str(node.simpleString(100)), token
    )


def _column(expr: Any) -> tuple[str, tuple[str, ...]] | None:
    kind = expr.getClass().getSimpleName()
    if kind == "AttributeReference":
        return str(expr.name()), (str(expr.name()),)
    if kind == "Alias":
        path = _path(expr.child())
        return None if path is None else (str(expr.name()), path)
    return None


def _path(expr: Any) -> tuple[str, ...] | None:
    kind = expr.getClass().getSimpleName()
    if kind == "AttributeReference":
        return (str(expr.name()),)
    if kind == "GetStructField":
        inner = _path(expr.child())
        return None if inner is None else (*inner, str(expr.extractFieldName()))
    return None


__all__ = [
    "StepFrame",
    "fusable",
    "plan_text",
    "reads",
    "source_projection",
    "source_token",
    "step_route",
]
