"""Test support shipped with sparkpoint, for its own tests and for users' tests.

:class:`JobTestDriver` runs a job (a task class or a DataFrame pipeline) on lists of messages
and shows its stores and outputs; see :mod:`sparkpoint.testing.driver`. Its names load on
first use, so the service fixtures (:mod:`.services`) import nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkpoint.testing.driver import JobTestDriver, Message, OutputMessage

__all__ = ["JobTestDriver", "Message", "OutputMessage"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'sparkpoint.testing' has no attribute {name!r}")
    return getattr(importlib.import_module("sparkpoint.testing.driver"), name)
