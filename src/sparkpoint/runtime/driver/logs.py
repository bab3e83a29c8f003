"""Log lines a log shipper can take: ``sparkpoint run --log-format json`` writes one JSON object
per line to stderr (``time`` in ISO 8601 UTC, ``level``, ``logger``, ``job``, ``message``, and
``task``/``batch`` where they apply; an error's traceback in ``error``), for the driver's log
records, each batch's progress and the final error line alike. Lines the JVM writes itself
(Spark's warnings) are not Python's and pass through as they are; its start-up noise is left
out unless ``-v`` (:mod:`sparkpoint.runtime.spark.gateway`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: the formats of ``--log-format``
FORMATS = ("text", "json")

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def json_line(level: str, message: str, *, logger: str = "sparkpoint", **fields: Any) -> str:
    """One log line as JSON (``fields``: ``job``, ``task``, ``batch``, ...; ``None``s left
    out)."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    data = {"time": stamp, "level": level, "logger": logger, "message": message}
    data.update({k: v for k, v in fields.items() if v is not None})
    return json.dumps(data, default=str)


class JsonFormatter(logging.Formatter):
    """A log record as :func:`json_line`; ``job`` on every line, ``task``/``batch`` from the
    record's extras."""

    def __init__(self, job: str | None = None) -> None:
        super().__init__()
        self.job = job

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"job": self.job}
        for name in ("task", "batch"):
            fields[name] = getattr(record, name, None)
        if record.exc_info:
            fields["error"] = self.formatException(record.exc_info)
        return json_line(record.levelname, record.getMessage(), logger=record.name, **fields)


def setup_logging(verbose: bool, log_format: str = "text", job: str | None = None) -> None:
    """The process's root logger: INFO with ``verbose`` else WARNING, as text or JSON, on
    stderr (replacing handlers an earlier call set)."""
    if log_format not in FORMATS:
        raise ValueError(f"--log-format {log_format!r}: use one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(job) if log_format == "json" else logging.Formatter(_TEXT))
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)


__all__ = ["FORMATS", "JsonFormatter", "json_line", "setup_logging"]
