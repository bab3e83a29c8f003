"""Which columns a store's committed state reads as, by its layout
(:mod:`sparkpoint.storage.layouts`), and how a decoded entry fills them.

Every layout starts with ``task``. A plain store has ``key`` and ``value`` (and a TTL store
``expires_at``, ms); a window or
session store ``key``, ``window_start``, ``window_end``, ``value`` (the window's aggregate) and
``fired``; a join's buffer ``key``, ``time``, ``values``; the timer store a row per entry:
``entry`` (``timer``, ``event-time``, ``watermark``, ``tracking-since``), ``kind``, ``time``,
``store``, ``key``, ``window_start``, ``ssp``, ``max``, ``active``, ``end_of_input``.

A key or value takes the type its serde decodes to: ``string`` a STRING, ``integer`` a BIGINT,
``bytes`` a BINARY, ``avro`` a struct of its schema's fields (the subject's latest); any other
(``json``, a plugin's) its JSON text, a STRING (``from_json`` reads it, or the reader's
``value_schema`` option parses it into a struct).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkpoint.config import Config
from sparkpoint.serde import BytesSerde, IntegerSerde, Serde, StringSerde
from sparkpoint.serde.avro_types import value_columns
from sparkpoint.serde.registry import RegistrySerde
from sparkpoint.storage.kv.store import store_serdes
from sparkpoint.storage.kv.ttl import ttl_of
from sparkpoint.storage.layouts import Layout

Convert = Callable[[Any], Any]


def _json_text(value: Any) -> Any:
    return None if value is None else json.dumps(value, default=str, separators=(",", ":"))


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Column:
    name: str
    ddl: str  # its Spark SQL type
    convert: Convert = _same  # from the decoded entry's field to the column's value


def serde_column(name: str, serde: Serde[Any], value_schema: str | None = None) -> Column:
    """The column of a key or value decoded by ``serde`` (see the module docstring)."""
    if value_schema:
        return Column(name, f"STRUCT<{value_schema}>")
    if isinstance(serde, StringSerde):
        return Column(name, "STRING")
    if isinstance(serde, IntegerSerde):
        return Column(name, "BIGINT")
    if isinstance(serde, BytesSerde):
        return Column(name, "BINARY")
    if isinstance(serde, RegistrySerde) and serde.name == "avro":
        try:
            return Column(name, f"STRUCT<{value_columns(serde.latest_schema())}>")
        except Exception:  # no schema to name before a record is read: its JSON text
            pass
    return Column(name, "STRING", _json_text)


def columns(
    config: Config, store: str, layout: Layout, value_schema: str | None = None
) -> list[Column]:
    """The columns of ``store``'s state in ``layout`` (not ``auto``)."""
    key_serde, msg_serde = store_serdes(config, store)
    key = serde_column("key", key_serde)
    task = Column("task", "STRING")
    if layout is Layout.PLAIN:
        plain = [task, key, serde_column("value", msg_serde, value_schema)]
        return plain + ([Column("expires_at", "BIGINT")] if ttl_of(config, store) else [])
    if layout is Layout.WINDOW:
        return [
            task,
            key,
            Column("window_start", "BIGINT"),
            Column("window_end", "BIGINT"),
            Column("value", "STRING", _json_text),
            Column("fired", "BOOLEAN", bool),
        ]
    if layout is Layout.JOIN:
        return [task, key, Column("time", "BIGINT"), Column("values", "STRING", _json_text)]
    return [
        task,
        Column("entry", "STRING"),
        Column("kind", "STRING"),
        Column("time", "BIGINT"),
        Column("store", "STRING"),
        Column("key", "STRING", _json_text),
        Column("window_start", "BIGINT"),
        Column("ssp", "STRING"),
        Column("max", "BIGINT"),
        Column("active", "BIGINT"),
        Column("end_of_input", "BOOLEAN", bool),
    ]


def ddl(cols: Iterable[Column]) -> str:
    """The columns as a Spark DDL schema string."""
    return ", ".join(f"`{c.name}` {c.ddl}" for c in cols)


def fill(cols: list[Column], rows: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, list[Any]]:
    """``(task, row)`` pairs as one list per column (a field a row lacks is null)."""
    out: dict[str, list[Any]] = {c.name: [] for c in cols}
    for task, row in rows:
        for c in cols:
            value = task if c.name == "task" else row.get(c.name)
            out[c.name].append(None if value is None else c.convert(value))
    return out
