"""Which of a DataFrame batch's outputs run fused with their stateful step (driver side).

Written plainly, a stateful step's rows go from its Python worker into a cache in the JVM, and
from there to a second Python worker that sends them to the output stream. When the stream
output is the only reader of the step, :class:`~sparkpoint.runtime.dataframe.udfs.FusedStep`
sends them from the step's own worker instead (one Python pass, no cache). When, in addition,
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkpoint.runtime.dataframe.udfs import Projection, StepUdf

log = logging.getLogger(__name__)


def step_token(step: str, batch: int) -> str:
    """The name of a step's UDF in Spark's plans, unique to the pipeline's batch."""
    return f"sparkpoint_step_{re.sub(r'[^A-Za-z0-9_]', '_', step)}_b{batch}"


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
    return text is None or token in text


def fusable(
    steps: Sequence[StepFrame], outputs: Sequence[tuple[Any, bool]]
) -> dict[int, StepFrame]:
    """The outputs (by index into ``outputs``, pairs of a DataFrame and whether it goes to a
    sparkpoint stream) that can run fused with the step they send: a stream output of an
    Arrow step's own DataFrame, where no other output and no other step's input reads the
    step."""
    fused: dict[int, StepFrame] = {}
    for i, (df, to_stream) in enumerate(outputs):
        step = next((s for s in steps if s.output is df), None)
        if not to_stream or step is None or step.udf.pandas:
            continue
        token = step.udf.__name__
        others = [o for j, (o, _) in enumerate(outputs) if j != i]
        others += [s.input for s in steps if s is not step]
        if any(reads(other, token) for other in others):
            continue
        fused[i] = step
    return fused


def source_projection(spark: Any, df: Any, token: str) -> Projection | None:
    """How ``df`` is made from the batch source (the UDF named ``token``), if it is only that
    source's columns and struct fields, renamed or not: ``[(name, (column, field, ...))]`` in
    ``df``'s column order. ``None`` for anything else (a filter, a computed column, a join)."""
    try:
        optimizer = spark._jsparkSession.sessionState().optimizer()
        plan = optimizer.execute(df._jdf.queryExecution().analyzed())
        projection = _projection(plan, token)
    except Exception as exc:  # a plan this module does not know: the plain path
        log.debug("no source projection for a stateful step's input: %s", exc)
        return None
    if projection is None or [name for name, _ in projection] != list(df.columns):
        return None
    return projection


def _projection(plan: Any, token: str) -> Projection | None:
    if _is_source(plan, token):
        output = plan.output()
        names = [str(output.apply(i).name()) for i in range(output.size())]
        return [(name, (name,)) for name in names]
    if plan.getClass().getSimpleName() != "Project" or not _is_source(plan.child(), token):
        return None
    items = plan.projectList()
    projection: Projection = []
    for i in range(items.size()):
        column = _column(items.apply(i))
        if column is None:
            return None
        projection.append(column)
    return projection


def _is_source(node: Any, token: str) -> bool:
    return node.getClass().getSimpleName() == "MapInArrow" and token in str(node.simpleString(100))


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


__all__ = ["StepFrame", "fusable", "plan_text", "reads", "source_projection", "source_token"]
