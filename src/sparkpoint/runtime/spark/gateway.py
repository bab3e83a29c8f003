"""The driver's JVM, started with its stderr read by sparkpoint: the JVM's start-up noise (such
as ``WARNING: Using incubator modules: jdk.incubator.vector``, printed by every Spark 4 driver)
is kept out of the user's terminal unless sparkpoint logs at INFO (``-v``); every other line
(Spark's warnings, a local Python worker's output) passes through unchanged, as it did when the
JVM wrote to the terminal itself.

pyspark starts the JVM (``launch_gateway``) with the caller's stderr and no way to filter it;
its ``popen_kwargs`` lets the caller pipe it, and a daemon thread here drains the pipe for the
JVM's whole life (a JVM whose stderr pipe fills would block). Under ``spark-submit`` the JVM is
already running (``PYSPARK_GATEWAY_PORT``) and its stderr is spark-submit's: nothing to do.

May import pyspark and the standard library only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import threading
from collections.abc import Iterable
from typing import IO, Any

#: lines the JVM prints while it starts that say nothing to a sparkpoint user
NOISE = re.compile(
    rb"^(WARNING: Using incubator modules|Picked up (_JAVA_OPTIONS|JAVA_TOOL_OPTIONS))"
)


def is_noise(line: bytes) -> bool:
    """Whether a JVM line is start-up noise, kept out of the terminal unless sparkpoint logs
    at INFO (``-v``)."""
    return NOISE.match(line) is not None and not logging.getLogger("sparkpoint").isEnabledFor(
        logging.INFO
    )


def forward(lines: Iterable[bytes], fd: int = 2) -> None:
    """Write every line but noise to ``fd`` (stderr) until ``lines`` ends (the JVM exited).
    A line that cannot be written is dropped; the draining never stops (a JVM whose pipe
    fills blocks)."""
    for line in lines:
        if is_noise(line):
            continue
        with contextlib.suppress(OSError):
            os.write(fd, line)


def start_gateway(settings: dict[str, str]) -> None:
    """Start the driver's JVM with ``settings`` (``spark.master`` and the ``spark.*`` keys its
    ``spark-submit`` needs at launch, such as the driver's Java options) and its stderr
    filtered, unless a JVM is already up for this process (a context made earlier, or the JVM
    of a ``spark-submit`` that runs this driver)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return
        conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
        gateway: Any = launch_gateway(  # type: ignore[no-untyped-call]
            conf, popen_kwargs={"stderr": subprocess.PIPE}
        )
        stderr: IO[bytes] = gateway.proc.stderr
        threading.Thread(
            target=forward, args=(iter(stderr.readline, b""),), name="jvm-stderr", daemon=True
        ).start()
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm


__all__ = ["NOISE", "forward", "is_noise", "start_gateway"]
