"""Loading what a config names as ``module:attr``: task classes, pipelines, serdes, systems,
state backends, blob store factories, functions. One loader, so every such name fails the same
way: a :class:`~sparkpoint.errors.ConfigError` that names the config key and the value, and
the user's file and line when the module's own code failed while it was imported. And the
plugins installed under an entry-point group (:func:`installed`).

A leaf: imports nothing of sparkpoint's but :mod:`sparkpoint.errors`.
"""

from __future__ import annotations

import importlib
import os
import traceback
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from sparkpoint.errors import ConfigError

#: sparkpoint's own source folder: frames in it are not the user's code
_PACKAGE_DIR = str(Path(os.path.abspath(__file__)).parent)


@cache
def installed(group: str) -> tuple[EntryPoint, ...]:
    """The entry points of ``group``, read once per process: reading them scans every installed
    distribution's metadata (milliseconds each time), and a driver asks at every checkpoint."""
    return tuple(entry_points(group=group))


def raised_at(exc: BaseException) -> str:
    """`` (at FILE:LINE in FUNC)``: the innermost frame of ``exc`` outside sparkpoint (the
    user's code, or a library it called), for messages; empty when there is none."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(_PACKAGE_DIR)
    ]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name})"


def load_reference(path: str, what: str, *, hint: str = "", dotted: bool = False) -> Any:
    """The object ``path`` (``module:attr``; with ``dotted``, also ``module.attr``) names.
    ``what`` says where it was named (``task.class='m:C'``, a config key); ``hint`` is added
    to the error when the module or the name is not there."""
    module, sep, attr = path.partition(":")
    if not sep and dotted:
        module, _, attr = path.rpartition(".")
    more = f"; {hint}" if hint else ""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot import it ({exc}){more}") from exc
    except SyntaxError as exc:
        raise ConfigError(
            f"{what}: {exc.filename}:{exc.lineno}: {exc.msg} (a syntax error)"
        ) from exc
    except Exception as exc:  # the module's own code failed while it was imported
        raise ConfigError(
            f"{what}: importing {module} failed: {type(exc).__name__}: {exc}{raised_at(exc)}"
        ) from exc


__all__ = ["load_reference", "raised_at"]
