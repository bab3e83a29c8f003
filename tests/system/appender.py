"""A child process that appends numbered records to one filelog partition in small flushes."""

from __future__ import annotations

from sparkpoint.system.base import Record
from sparkpoint.system.filelog import FileLogSystemFactory


def append(root: str, writer: int, count: int, per_flush: int) -> None:
    config = {"systems.fl.path": root}
    producer = FileLogSystemFactory().get_producer("fl", config)
    for i in range(count):
        producer.send("shared", 0, Record("", f"w{writer}".encode(), f"{writer}:{i}".encode(), i))
        if (i + 1) % per_flush == 0:
            producer.flush()
    producer.close()
