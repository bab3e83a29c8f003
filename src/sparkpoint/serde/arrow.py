"""Arrow columns encoded by a serde in bulk, byte for byte as its ``to_bytes`` encodes each
value (what a DataFrame output sends, without a Python object per field).

:func:`encode_array` covers the built-in ``bytes``, ``string`` and ``json`` serdes on the Arrow
types whose encoding Arrow reproduces exactly; anything else returns ``None`` and the caller
encodes value by value. JSON as :class:`~sparkpoint.serde.JsonSerde` writes it: compact,
object keys sorted, ``ensure_ascii``. Strings go through in bulk when they need no escaping
(printable ASCII without ``"`` or ``\\``); integers and booleans always; a struct becomes an
object of its fields. Floats, lists, maps and other types take the per-value path (Python's
float text is not Arrow's).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.serde import Serde

#: strings JSON writes between quotes unchanged (ensure_ascii escapes the rest)
_PLAIN = r"^[\x20\x21\x23-\x5b\x5d-\x7e]*$"
_NULL = pa.scalar(b"null", pa.binary())
_QUOTE = pa.scalar(b'"', pa.binary())


def encode_array(serde: Serde[Any], array: pa.Array) -> list[bytes | None] | None:
    """``[serde.to_bytes(v) for v in array.to_pylist()]``, with ``None`` for nulls, computed by
    Arrow; ``None`` when this serde or type needs the per-value path."""
    encoded: pa.Array | None = None
    if serde.name == "json":
        encoded = _json(array)
        if encoded is not None and array.null_count:
            encoded = pc.if_else(array.is_null(), pa.scalar(None, pa.binary()), encoded)
    elif serde.name == "string" and pa.types.is_string(array.type):
        encoded = array.cast(pa.binary())
    elif serde.name == "bytes" and pa.types.is_binary(array.type):
        encoded = array
    if encoded is None:
        return None
    values: list[bytes | None] = encoded.to_pylist()
    return values


def _json(array: pa.Array) -> pa.Array | None:
    """Each value's JSON text (binary; ``null`` for a null), or ``None``."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if pc.all(pc.match_substring_regex(array, _PLAIN)).as_py() is False:
            return None
        text = pc.binary_join_element_wise(_QUOTE, array.cast(pa.binary()), _QUOTE, b"")
    elif pa.types.is_integer(kind):
        text = array.cast(pa.string()).cast(pa.binary())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(array, pa.scalar(b"true", pa.binary()), pa.scalar(b"false", pa.binary()))
    elif pa.types.is_struct(kind):
        return _json_object(array)
    else:
        return None
    return text.fill_null(_NULL) if array.null_count else text


def _json_object(array: pa.StructArray) -> pa.Array | None:
    names = [array.type.field(i).name for i in range(array.type.num_fields)]
    if not names or len(set(names)) != len(names):
        return None  # {} (rare), or duplicates a dict keeps one of: the per-value path
    parts: list[Any] = []
    fields = array.flatten()  # the struct's nulls applied to its fields
    for n, name in enumerate(sorted(names)):
        value = _json(fields[names.index(name)])
        if value is None:
            return None
        parts += [("{" if n == 0 else ",") + json.dumps(name) + ":", value]
    parts.append("}")
    joined = pc.binary_join_element_wise(*[_binary(p) for p in parts], b"")
    if array.null_count:
        joined = pc.if_else(array.is_null(), _NULL, joined)
    return joined


def _binary(part: Any) -> Any:
    return pa.scalar(part.encode(), pa.binary()) if isinstance(part, str) else part


__all__ = ["encode_array"]
