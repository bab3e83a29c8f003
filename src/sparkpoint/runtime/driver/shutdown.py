"""How long a shutdown waits (``task.shutdown.ms``): a stop asked from outside the loop (a
signal, Ctrl-C) lets the running batch finish and commit, but only for that long; then the
batch is cancelled through the runner (:meth:`~sparkpoint.runtime.runner.BatchRunner.cancel`)
and the run ends with :class:`~sparkpoint.errors.ShutdownOverdue`. Nothing is lost: the
cancelled batch commits nothing, and the next start reads its input again from the last
checkpoint.

May import the config and the errors.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sparkpoint.config import Config
from sparkpoint.errors import ShutdownOverdue

log = logging.getLogger(__name__)


class ShutdownWatch:
    """Arms a timer when a stop is asked from outside; if the run has not ended when it goes
    off, ``cancel`` ends the running batch (:attr:`overdue` tells the run why it failed)."""

    def __init__(self, config: Config, cancel: Callable[[], None]) -> None:
        self.ms = config.get_int("task.shutdown.ms")
        self.cancel = cancel
        self.reason = ""
        self.overdue = False
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, reason: str) -> None:
        """The stop was asked (``reason``): the run has ``task.shutdown.ms`` to end."""
        with self._lock:
            if self._timer is not None:
                return
            self.reason = reason
            self._timer = threading.Timer(self.ms / 1000, self._go_off)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        """The run ended."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _go_off(self) -> None:
        self.overdue = True
        log.warning(
            "the run did not end within task.shutdown.ms=%d after %s: cancelling its batch",
            self.ms,
            self.reason,
        )
        self.cancel()

    def error(self) -> ShutdownOverdue:
        """Why the run failed, once :attr:`overdue`."""
        return ShutdownOverdue(
            f"the running batch did not finish within task.shutdown.ms={self.ms} after "
            f"{self.reason}, so it was cancelled: nothing it did is committed, and the next start "
            "reads its input again from the last checkpoint (raise task.shutdown.ms to let "
            "batches finish)"
        )
