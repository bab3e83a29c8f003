"""How a config key is declared (:class:`ConfigKey`) and the value checks declarations share.
Imports nothing of sparkpoint's."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigKey:
    """A declared key: ``pattern`` may hold ``<s>`` for a store, system or stream name."""

    pattern: str
    default: str | None
    allowed: str
    help: str
    check: Callable[[str], bool] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        return _pattern_regex(self.pattern)


@functools.cache
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A key pattern as a regex, built once per pattern (key lookups run in every batch)."""
    return re.compile("^" + re.escape(pattern).replace("<s>", r"[^.]+(?:\.[^.]+)*?") + "$")


def int_at_least(minimum: int | None = None) -> Callable[[str], bool]:
    def check(v: str) -> bool:
        try:
            n = int(v)
        except ValueError:
            return False
        return minimum is None or n >= minimum

    return check


def one_of(*choices: str) -> Callable[[str], bool]:
    return lambda v: v in choices


def is_bool(v: str) -> bool:
    return v.lower() in ("true", "false")
