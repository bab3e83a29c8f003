"""The state of a windowed stream-stream join: each side's records buffered in a store of its
own, by key and event time, until no record of the other side can match them any more.

Two records of a key match when their event times are at most ``within_ms`` apart. A record
is buffered on its side and matched against the other side's buffer as it arrives, so each
matching pair is found once, when its second record arrives. A buffered record at time ``t``
can match no record that is not late once the watermark passes ``t + within_ms``: its timer
(at ``t + within_ms + 1``) then deletes it, so the buffers hold only what can still match.

Layout of a buffer store (raw engine keys, as a window store's)::

    <2-byte key length><key bytes><8-byte event time>  ->  JSON list of the values at that time

May import the store interfaces and :mod:`sparkpoint.storage.windows`' key layout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

from sparkpoint.errors import StoreError
from sparkpoint.storage.kv.base import KeyValueEngine
from sparkpoint.storage.windows import entry_key


class Joined(NamedTuple):
    """A matching pair of a windowed join: the key, each side's event time and value."""

    key: Any
    left_time: int
    left: Any
    right_time: int
    right: Any


class JoinBuffer:
    """One side's buffered records, over its store's engine."""

    def __init__(self, engine: KeyValueEngine, name: str) -> None:
        self.engine = engine
        self.name = name

    def _values(self, raw: bytes, data: bytes) -> list[Any]:
        try:
            values = json.loads(data)
        except ValueError as exc:
            raise StoreError(
                f"join buffer {self.name!r}: entry {raw!r} is not a JSON list ({exc}); is the "
                "store kept for this join alone?"
            ) from None
        if not isinstance(values, list):
            raise StoreError(f"join buffer {self.name!r}: entry {raw!r} is not a JSON list")
        return values

    def add(self, key: bytes, time_ms: int, value: Any) -> bool:
        """Buffer ``value`` at ``time_ms``; whether it is the key's first value at that time
        (its entry is new and needs a timer)."""
        raw = entry_key(key, time_ms)
        data = self.engine.get(raw)
        values = [] if data is None else self._values(raw, data)
        values.append(value)
        self.engine.put(raw, json.dumps(values, separators=(",", ":")).encode())
        return data is None

    def between(self, key: bytes, lo: int, hi: int) -> Iterator[tuple[int, Any]]:
        """The key's buffered values with times in ``[lo, hi]``, by time then arrival."""
        start = entry_key(key, max(lo, 0))
        end = entry_key(key, hi + 1)
        offset = len(start) - 8
        for raw, data in self.engine.range(start, end):
            at = int.from_bytes(raw[offset:], "big")
            for value in self._values(raw, data):
                yield at, value

    def drop(self, raw: bytes) -> None:
        """Delete one entry (a key's values at one time), when its timer fires."""
        self.engine.delete(raw)


__all__ = ["JoinBuffer", "Joined"]
