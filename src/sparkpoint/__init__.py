"""sparkpoint: stateful stream processing on Spark with Samza's state and checkpoint model.

Everything a job needs is importable from here::

    from sparkpoint import StreamTask, OutgoingMessageEnvelope, SystemStream

* the task API: :class:`StreamTask` and what its methods receive (:class:`TaskContext`,
  :class:`IncomingMessageEnvelope`, :class:`MessageCollector`, :class:`TaskCoordinator`),
  :class:`OutgoingMessageEnvelope` to send, :class:`KeyValueStore` for state;
* the DataFrame API: :class:`Pipeline`, the :class:`Batch` its function gets and the
  :class:`Output` it returns, a stateful step's :class:`StepState`, sinks
  (:class:`ParquetSink`, or any :class:`Sink`), and ``batch.window``'s windows
  (:func:`tumbling_window`, :func:`hopping_window`, :func:`session_window`);
* streams and tasks: :class:`SystemStream`, :class:`SystemStreamPartition`, :class:`TaskName`;
* windows (``context.windows``): the closed :class:`Window` and the aggregates
  (:func:`count`, :func:`sum_of`, :func:`min_of`, :func:`max_of`, :func:`reduce_with`,
  :func:`collect`, or an :class:`Aggregate` of your own);
* running a job from Python, on a Spark session you hold or one it starts: :func:`run`;
* config: :func:`load_config`, :class:`Config`;
* startpoints: the four kinds, and :func:`set_startpoints` / :func:`list_startpoints` /
  :func:`delete_startpoints` (the ``sparkpoint startpoint`` commands);
* errors: :class:`SparkpointError` and its user-facing kinds.

The DataFrame API names import Spark, so they load on first use: ``import sparkpoint`` stays
light for task modules and tools. :mod:`sparkpoint.testing` runs jobs in tests.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sparkpoint.config import Config, load_config
from sparkpoint.errors import ConfigError, SparkpointError, UserError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.runtime.api.task import (
    MessageCollector,
    StreamTask,
    TaskContext,
    TaskCoordinator,
)
from sparkpoint.startpoint import (
    Startpoint,
    StartpointOldest,
    StartpointSpecific,
    StartpointTimestamp,
    StartpointUpcoming,
)
from sparkpoint.storage.kv.base import KeyValueStore
from sparkpoint.storage.windows import (
    Aggregate,
    Window,
    collect,
    count,
    max_of,
    min_of,
    reduce_with,
    sum_of,
)
from sparkpoint.system.base import IncomingMessageEnvelope, OutgoingMessageEnvelope
from sparkpoint.system.tables.global_tables import GlobalTable
from sparkpoint.tools.startpoints import delete_startpoints, list_startpoints, set_startpoints

if TYPE_CHECKING:
    from sparkpoint.runtime.dataframe.pipeline import Batch, Output, Pipeline
    from sparkpoint.runtime.dataframe.sinks import ParquetSink, Sink
    from sparkpoint.runtime.dataframe.task import StepState
    from sparkpoint.runtime.dataframe.windows import (
        hopping_window,
        session_window,
        tumbling_window,
    )
    from sparkpoint.runtime.driver.entry import run

__version__ = "0.1.0"

#: names that import Spark, loaded on first use
_LAZY = {
    "Batch": "sparkpoint.runtime.dataframe.pipeline",
    "Output": "sparkpoint.runtime.dataframe.pipeline",
    "ParquetSink": "sparkpoint.runtime.dataframe.sinks",
    "Pipeline": "sparkpoint.runtime.dataframe.pipeline",
    "Sink": "sparkpoint.runtime.dataframe.sinks",
    "StepState": "sparkpoint.runtime.dataframe.task",
    "hopping_window": "sparkpoint.runtime.dataframe.windows",
    "session_window": "sparkpoint.runtime.dataframe.windows",
    "tumbling_window": "sparkpoint.runtime.dataframe.windows",
    "run": "sparkpoint.runtime.driver.entry",
}

__all__ = [
    "Aggregate",
    "Batch",
    "Config",
    "ConfigError",
    "GlobalTable",
    "IncomingMessageEnvelope",
    "KeyValueStore",
    "MessageCollector",
    "OutgoingMessageEnvelope",
    "Output",
    "ParquetSink",
    "Pipeline",
    "Sink",
    "SparkpointError",
    "Startpoint",
    "StartpointOldest",
    "StartpointSpecific",
    "StartpointTimestamp",
    "StartpointUpcoming",
    "StepState",
    "StreamTask",
    "SystemStream",
    "SystemStreamPartition",
    "TaskContext",
    "TaskCoordinator",
    "TaskName",
    "UserError",
    "Window",
    "__version__",
    "collect",
    "count",
    "delete_startpoints",
    "hopping_window",
    "list_startpoints",
    "load_config",
    "max_of",
    "min_of",
    "reduce_with",
    "run",
    "session_window",
    "set_startpoints",
    "sum_of",
    "tumbling_window",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
