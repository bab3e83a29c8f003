"""How a store's raw entries read as data: through its serdes (a plain store), or through the
layouts the runtime's own helpers keep (window and session stores, join buffers, the timer
store), for the tools that show committed state (``sparkpoint state dump``).

A window or join store is declared in the task's code, not in the config, so its layout is
recognised from its entries: a key of ``<2-byte length><key><8-byte time>`` whose value is a
JSON object with ``end`` and ``acc`` (a window) or a JSON list (a join buffer's values). The
timer store is the one ``task.timers.store`` names.

May import the store layouts (:mod:`sparkpoint.storage.windows`, :mod:`sparkpoint.storage.timers`)
and the serdes; nothing of the runtime.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.model import SystemStreamPartition
from sparkpoint.serde import Serde
from sparkpoint.storage.kv.store import store_serdes
from sparkpoint.storage.timers import (
    BY_KEY,
    END_OF_TIME,
    MARK,
    SINCE,
    TIME,
    TIMER,
    WATERMARK,
    split_owned,
)
from sparkpoint.storage.windows import KEY_LENGTH, split_entry_key


class Layout(StrEnum):
    AUTO = "auto"  # recognised from the first entry (the timer store: by the config)
    PLAIN = "plain"  # the store's key and value serdes
    WINDOW = "window"  # window and session stores: {key, window_start, window_end, value}
    JOIN = "join"  # a join's buffer: {key, time, values}
    TIMERS = "timers"  # task.timers.store: timers, event time per partition, the watermark


Row = dict[str, Any]


def _window_shaped(raw: bytes) -> bool:
    if len(raw) < KEY_LENGTH.size + TIME.size:
        return False
    n: int = KEY_LENGTH.unpack_from(raw)[0]
    return len(raw) == KEY_LENGTH.size + n + TIME.size


def recognise(config: Config, store: str, first: tuple[bytes, bytes] | None) -> Layout:
    """The layout of ``store``, from the config and its first entry (``None``: empty)."""
    if config.get_str("task.timers.store") == store:
        return Layout.TIMERS
    if first is None or not _window_shaped(first[0]):
        return Layout.PLAIN
    try:
        value = json.loads(first[1])
    except ValueError:
        return Layout.PLAIN
    if isinstance(value, dict) and {"end", "acc"} <= value.keys():
        return Layout.WINDOW
    return Layout.JOIN if isinstance(value, list) else Layout.PLAIN


def decoder(config: Config, store: str, layout: Layout) -> Callable[[bytes, bytes], Row | None]:
    """The function from one raw entry of ``store`` to its row (``None``: an entry that only
    indexes others, left out); a :class:`UserError` names an entry the layout cannot read."""
    key_serde, msg_serde = store_serdes(config, store)
    if layout is Layout.PLAIN:
        return _checked(
            store,
            layout,
            lambda k, v: {"key": key_serde.from_bytes(k), "value": msg_serde.from_bytes(v)},
        )
    if layout is Layout.WINDOW:
        return _checked(store, layout, lambda k, v: _window(key_serde, k, v))
    if layout is Layout.JOIN:
        return _checked(store, layout, lambda k, v: _join(key_serde, k, v))
    keys: dict[str, Serde[Any]] = {}

    def key_of(owner: str) -> Serde[Any]:  # an owned timer's key: its window store's serde
        if owner not in keys:
            keys[owner] = store_serdes(config, owner)[0] if owner in config.stores else key_serde
        return keys[owner]

    return _checked(store, layout, lambda k, v: _timer_entry(key_serde, key_of, k, v))


def _checked(
    store: str, layout: Layout, fn: Callable[[bytes, bytes], Row | None]
) -> Callable[[bytes, bytes], Row | None]:
    def decode(key: bytes, value: bytes) -> Row | None:
        try:
            return fn(key, value)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise UserError(
                f"store {store}: entry {key[:60]!r} does not read in the {layout} layout "
                f"({type(exc).__name__}: {exc}); a window, join or timer store keeps its own: "
                "name it with --layout window|join|timers, or see the bytes with --raw"
            ) from exc

    return decode


def _window(key_serde: Serde[Any], raw: bytes, value: bytes) -> Row:
    key, start = split_entry_key(raw)
    data = json.loads(value)
    row = {
        "key": key_serde.from_bytes(key),
        "window_start": start,
        "window_end": int(data["end"]),
        "value": data["acc"],
    }
    if data.get("fired"):
        row["fired"] = True
    return row


def _join(key_serde: Serde[Any], raw: bytes, value: bytes) -> Row:
    key, time = split_entry_key(raw)
    values = json.loads(value)
    if not isinstance(values, list):
        raise TypeError(f"a join buffer's value is a JSON list, not {type(values).__name__}")
    return {"key": key_serde.from_bytes(key), "time": time, "values": values}


def _timer_entry(
    key_serde: Serde[Any], key_of: Callable[[str], Serde[Any]], raw: bytes, value: bytes
) -> Row | None:
    if raw.startswith(TIMER):
        kind = {b"p": "processing", b"e": "event"}[raw[1:2]]
        (time,) = TIME.unpack_from(raw, 2)
        return {"entry": "timer", "kind": kind, "time": time, **_timer_key(key_of, raw[10:])}
    if raw.startswith(BY_KEY):
        return None  # each key's timers again, as an index: the timers above are the data
    if raw.startswith(WATERMARK):
        data = json.loads(value)
        ssp = SystemStreamPartition.parse(raw[len(WATERMARK) :].decode())
        return {
            "entry": "event-time",
            "ssp": str(ssp),
            "max": data["max"],
            "active": data["active"],
        }
    if raw == MARK:
        (time,) = TIME.unpack(value)
        return {"entry": "watermark", "time": time, "end_of_input": time >= END_OF_TIME}
    if raw == SINCE:
        return {"entry": "tracking-since", "time": TIME.unpack(value)[0]}
    return {"entry": "unknown", "key": repr(raw)[2:-1], "value": repr(value)[2:-1]}


def _timer_key(key_of: Callable[[str], Serde[Any]], key: bytes) -> Row:
    owned = split_owned(key)
    if owned is None:
        return {"key": key_of("").from_bytes(key)}  # a user's key: the timer store's serde
    owner, entry = owned
    inner, start = split_entry_key(entry)
    return {"store": owner, "key": key_of(owner).from_bytes(inner), "window_start": start}
