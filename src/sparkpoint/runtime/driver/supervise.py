"""``sparkpoint run --supervise``: a supervisor that restarts a driver that died.

The supervisor runs the same ``sparkpoint run`` command without ``--supervise`` as a child
process and waits for it. A driver that exits 0 (done, or stopped) ends the supervisor with 0;
one that exits 2 (a user error: a bad config, a job that refuses to start) is not restarted,
since it would fail the same way; any other end (a crash, a kill, an out-of-memory) is
restarted after a backoff (1 s, doubling, at most 30 s) until ``--max-restarts``. Each restart
is logged, and the child learns its restart count from ``SPARKPOINT_DRIVER_RESTARTS`` (the
``sparkpoint_driver_restarts`` metric). SIGTERM or SIGINT to the supervisor goes to the driver,
which finishes its batch and commits; the supervisor then exits with the driver's code.

A restarted driver resumes from the last checkpoint as any restart does: state stays exact.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: the environment variable that tells a supervised driver how often it was restarted
RESTARTS_ENV = "SPARKPOINT_DRIVER_RESTARTS"

USER_ERROR = 2
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


def child_command(argv: Sequence[str]) -> list[str]:
    """``sparkpoint`` CLI arguments without the supervisor's own options, as a command."""
    args: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--supervise":
            continue
        if arg == "--max-restarts":
            skip = True
            continue
        if arg.startswith("--max-restarts="):
            continue
        args.append(arg)
    return [sys.executable, "-m", "sparkpoint", *args]


def backoff_s(restart: int) -> float:
    """The wait before restart number ``restart`` (1, 2, ...)."""
    return float(min(FIRST_BACKOFF_S * 2 ** (restart - 1), MAX_BACKOFF_S))


def supervise(
    command: Sequence[str], *, max_restarts: int, say: Callable[[str], None] = print
) -> int:
    """Run ``command`` until it ends well, ends with a user error, or has been restarted
    ``max_restarts`` times; its last exit code."""
    stopping = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: Any) -> None:
        stopping.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    restarts = 0
    try:
        while True:
            env = {**os.environ, RESTARTS_ENV: str(restarts)}
            child = subprocess.Popen(list(command), env=env)
            say(f"supervisor: driver started (pid {child.pid}, restart {restarts})")
            code = child.wait()
            if code == 0 or stopping.is_set():
                return code
            if code == USER_ERROR:
                say("supervisor: the driver stopped with a user error (exit 2): not restarted")
                return code
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            if restarts >= max_restarts:
                say(f"supervisor: the driver died ({how}); gave up after {restarts} restarts")
                return code
            restarts += 1
            wait = backoff_s(restarts)
            say(f"supervisor: the driver died ({how}); restart {restarts} in {wait:.0f}s")
            if stopping.wait(wait):
                return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["RESTARTS_ENV", "backoff_s", "child_command", "supervise"]
