"""Named failpoints: places in the commit and restore sequences where a job can be made to crash.

They are part of the product (the commit and restore code call :func:`maybe_crash`) and are off
unless configured: with no ``testing.crash.at`` key every call returns at once. Tests and the
soak use them to crash a job at a chosen point, once, and check what a restart recovers.

Set ``testing.crash.at`` to a point name and ``testing.crash.flag`` to a file path holding a
number N; the point is passed N times, and the next time it is reached the file is deleted and
the process "crashes":
by raising :class:`InjectedCrash` (``testing.crash.mode=raise``, the default, which fails the
batch like a dying worker would) or by exiting at once without clean-up (``exit``).

Points of the commit and restore (:data:`POINTS`): ``after-snapshot``, ``after-upload``,
``after-local-checkpoint-write`` (executor, in the commit), ``after-checkpoint-write`` (driver,
after writing a task's checkpoint: the batch's checkpoints are written in one append, and a
crash here makes those before it durable first),
``during-cleanup`` (executor), ``during-restore`` (executor, after the first store restored).
Points of a DataFrame batch (:data:`FRAME_POINTS`): ``during-stateful-step`` (executor, after a
step's output chunk was taken), ``after-output-flush`` (executor, a stream output durable, its
task not finished). Points of a publish of exactly-once output (:data:`PUBLISH_POINTS`):
``publish-after-intent`` and ``publish-after-append`` (whoever publishes a commit's staged
output: before and after its records are appended).

A *pause* point holds the process instead, for a test to act at a known moment:
``testing.pause.at=before-batch`` (the driver, between two batches) or ``in-task`` (each task
of the task API on its executor, its input processed, before its output is flushed and its
commit: the batch is under way) with ``testing.pause.file`` a path: while that file exists the
process waits there, with ``<file>.paused`` written (holding the name of each task held, for
``in-task``; several tasks may be held at once).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping

POINTS = (
    "after-snapshot",
    "after-upload",
    "after-local-checkpoint-write",
    "after-checkpoint-write",
    "during-cleanup",
    "during-restore",
)

#: points of a DataFrame pipeline's batch (a stateful step and its stream output)
FRAME_POINTS = ("during-stateful-step", "after-output-flush")

#: points of a publish of exactly-once output (:mod:`sparkpoint.system.filelog.staging`)
PUBLISH_POINTS = ("publish-after-intent", "publish-after-append")

#: points of ``sparkpoint state reshard`` (:mod:`sparkpoint.tools.reshard`): every task's new
#: state written, the commit point written, the first checkpoint of its roll-forward written
RESHARD_POINTS = ("reshard-after-state", "reshard-after-record", "reshard-roll-forward")


class InjectedCrash(Exception):
    """Raised at an injected crash point."""


def maybe_crash(
    config: Mapping[str, str], point: str, before: Callable[[], None] | None = None
) -> None:
    """Crash here if the config asks for this point and its flag file still exists; ``before``
    runs first when it does (it makes what precedes the point durable)."""
    if config.get("testing.crash.at") != point:
        return
    flag = config.get("testing.crash.flag", "")
    if not flag:
        return
    try:
        with open(flag) as f:
            skip = int(f.read().strip() or "0")
    except (FileNotFoundError, ValueError):
        return
    if skip > 0:  # pass this point ``skip`` more times first
        with open(flag, "w") as f:
            f.write(str(skip - 1))
        return
    try:
        os.unlink(flag)
    except FileNotFoundError:
        return  # another thread took this crash
    if before is not None:
        before()
    if config.get("testing.crash.mode", "raise") == "exit":
        os._exit(137)
    raise InjectedCrash(f"injected crash at {point}")


def maybe_pause(config: Mapping[str, str], point: str, who: str = "") -> None:
    """Wait here while ``testing.pause.file`` exists, if ``testing.pause.at`` names this
    point (see the module docstring); ``who`` (a task) is added as a line to the ``.paused``
    file, so a test sees which tasks are held."""
    if config.get("testing.pause.at") != point or not config.get("testing.pause.file"):
        return
    flag = config["testing.pause.file"]
    paused = f"{flag}.paused"
    if not os.path.exists(flag):
        return
    with open(paused, "a" if who else "w") as f:
        f.write(f"{who}\n" if who else point)
    try:
        while os.path.exists(flag):
            time.sleep(0.05)
    finally:
        with contextlib.suppress(FileNotFoundError):  # another task held it too
            os.unlink(paused)
