"""The driver JVM's stderr: start-up noise is dropped unless sparkpoint logs at INFO (``-v``);
every other line passes through unchanged."""

from __future__ import annotations

import logging
import os

import pytest

from sparkpoint.runtime.spark.gateway import forward

LINES = [
    b"WARNING: Using incubator modules: jdk.incubator.vector\n",
    b"Picked up JAVA_TOOL_OPTIONS: -Xss4m\n",
    b"05:01:02 WARN TaskSchedulerImpl: Initial job has not accepted any resources\n",
    b"Traceback (most recent call last):\n",
]


def forwarded(lines: list[bytes]) -> list[bytes]:
    read, write = os.pipe()
    forward(iter(lines), write)
    os.close(write)
    with os.fdopen(read, "rb") as out:
        return out.read().splitlines(keepends=True)


@pytest.mark.parametrize("level", [logging.WARNING, logging.INFO])
def test_noise_is_shown_with_verbose_only(level: int) -> None:
    logger = logging.getLogger("sparkpoint")
    before = logger.level
    logger.setLevel(level)
    try:
        out = forwarded(LINES)
    finally:
        logger.setLevel(before)
    assert out == (LINES if level == logging.INFO else LINES[2:])


def test_an_unwritable_stderr_does_not_stop_the_draining() -> None:
    lines = iter(LINES)
    forward(lines, fd=987654)  # not open: every write fails
    assert next(lines, None) is None  # yet every line was read
