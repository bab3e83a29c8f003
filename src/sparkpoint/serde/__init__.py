"""Serdes: turning keys and values into bytes and back.

Built-in names:

- ``bytes`` (identity), ``string`` (UTF-8);
- ``json``: compact, sorted keys, ASCII-escaped, byte for byte what
  ``json.dumps(v, separators=(",", ":"), sort_keys=True)`` writes (so a JSON key finds the same
  state whichever sparkpoint wrote it), plus ``uuid.UUID`` as its string and an ``enum.Enum``
  member as its value;
- ``integer``: signed 64-bit big-endian, so byte order matches numeric order for non-negatives.

Users register their own with ``serializers.registry.<name>.class = module:Class`` (a class with
``to_bytes`` and ``from_bytes`` and a no-argument constructor). Pickle is never used: state and
streams outlive code versions.
"""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import re
import struct
import uuid
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

import orjson

from sparkpoint.errors import ConfigError
from sparkpoint.refs import load_reference
from sparkpoint.serde.base import REGISTRY_SERDES as REGISTRY_SERDES
from sparkpoint.serde.base import Serde as Serde
from sparkpoint.serde.base import is_registry_serde as is_registry_serde


class BytesSerde(Serde[bytes]):
    name = "bytes"

    def to_bytes(self, value: bytes) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"bytes serde needs bytes, got {type(value).__name__}")
        return bytes(value)

    def from_bytes(self, data: bytes) -> bytes:
        return bytes(data)


class StringSerde(Serde[str]):
    name = "string"

    def to_bytes(self, value: str) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"string serde needs str, got {type(value).__name__}")
        return value.encode("utf-8")

    def from_bytes(self, data: bytes) -> str:
        return bytes(data).decode("utf-8")


def _json_default(value: Any) -> Any:
    """What the standard library's encoder calls for a type it does not know: the two that
    orjson writes natively, written the same way, so both paths give the same bytes."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=_json_default)
_JSON_DECODER = json.JSONDecoder()


def _json_fast_paths() -> tuple[Callable[[Any], str] | None, Callable[[str], Any] | None]:
    """CPython's C encoder and scanner, built once. ``JSONEncoder.encode`` builds a new C
    encoder (and a closure) on every call and ``JSONDecoder.decode`` adds two regex matches:
    together about 2.5 us per message, more than the C work itself. Circular-reference checks
    are off here (a cycle is a RecursionError, and the slow path then names it)."""
    make_encoder = getattr(json.encoder, "c_make_encoder", None)
    make_scanner = getattr(json.scanner, "c_make_scanner", None)
    encode: Callable[[Any], str] | None = None
    decode: Callable[[str], Any] | None = None
    if make_encoder is not None:
        chunks = make_encoder(
            None,  # markers: no circular check
            _JSON.default,
            json.encoder.encode_basestring_ascii,  # ensure_ascii, as JSONEncoder's default
            None,  # indent
            _JSON.key_separator,
            _JSON.item_separator,
            _JSON.sort_keys,
            _JSON.skipkeys,
            _JSON.allow_nan,
        )

        def encode(value: Any) -> str:
            return "".join(chunks(value, 0))

    if make_scanner is not None:
        scan = make_scanner(_JSON_DECODER)

        def decode(text: str) -> Any:
            value, end = scan(text, 0)
            if end != len(text):
                raise ValueError("trailing data")  # whitespace, or not JSON: the slow path
            return value

    return encode, decode


_JSON_ENCODE_FAST, _JSON_DECODE_FAST = _json_fast_paths()

# orjson, about 5x faster than the C encoder above and 3x faster than its scanner, is used where
# its result is provably the standard library's; every other value takes the path above.
# - Encoding, orjson differs on: non-ASCII (written raw, not escaped), DEL (raw), floats under
#   1e-4 ("1e-7" and "0.00001" for "1e-07" and "1e-05"), NaN and infinities (null). So its bytes
#   are kept only when ASCII with no DEL, "null", "0.0000" or a digit before "e-". Dataclasses
#   and dates, which orjson writes and the standard library refuses, go to _orjson_declines.
# - Decoding, orjson differs on: NaN and infinities, lone surrogates, a byte-order mark and
#   UTF-16/32 (all errors in orjson), and integers outside 64 bits (read as floats). So an error
#   takes the standard path, and a result other than an object of strings, integers, booleans and
#   nulls is kept only when the text has no run of 19 digits (an integer read as a float).
_ORJSON_ENCODE_OPTIONS = (
    orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
)
_SMALL_FLOAT = re.compile(r"[0-9]e-")
_LONG_NUMBER = re.compile(rb"[0-9]{19}")
#: every digit as "0": a run of 19 digits is then a plain substring search, in C. Past ~128
#: bytes it beats the regex, which tries each digit of a digit-dense text (hex, say) 19 times:
#: 3 us against 20 us for a 1 KB value with a hex payload; below that the regex is quicker
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else b for b in range(256))
_DIGIT_RUN = b"0" * 19


def _has_long_number(data: bytes) -> bool:
    """Whether ``data`` has a run of 19 digits (an integer orjson may have read as a float)."""
    if len(data) <= 128:
        return _LONG_NUMBER.search(data) is not None
    return _DIGIT_RUN in bytes(data).translate(_DIGITS_AS_ZERO)


_NO_FLOAT = frozenset({str, int, bool, type(None)})


def _orjson_declines(value: Any) -> Any:
    raise TypeError  # orjson's default hook: the value takes the standard library's encoder


class JsonSerde(Serde[Any]):
    name = "json"

    def to_bytes(self, value: Any) -> bytes:
        try:
            data = orjson.dumps(value, _orjson_declines, _ORJSON_ENCODE_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError too: not orjson's, or too deep, or a cycle
            pass
        else:
            if data.isascii():
                text = data.decode("ascii")  # str's `in` is several times faster than bytes'
                if (
                    "null" not in text
                    and "0.0000" not in text
                    and "\x7f" not in text
                    and ("e-" not in text or _SMALL_FLOAT.search(text) is None)
                ):
                    # a copy of the exact size: orjson's bytes sit in a 1 KiB buffer shrunk in
                    # place, and the outputs a batch keeps fragment the heap (1.6 us a message
                    # when kept, against 0.25 us with this copy)
                    return text.encode("ascii")
        if _JSON_ENCODE_FAST is not None:
            try:
                return _JSON_ENCODE_FAST(value).encode("utf-8")
            except RecursionError:
                pass  # a cycle, or nesting too deep: the checked encoder says which
        return _JSON.encode(value).encode("utf-8")

    def from_bytes(self, data: bytes) -> Any:
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # not orjson's (NaN, a lone surrogate, a BOM, UTF-16/32), or not JSON
        else:
            if type(value) is dict:
                for item in value.values():
                    if type(item) not in _NO_FLOAT:
                        break
                else:
                    return value
            if not _has_long_number(data):
                return value
        if _JSON_DECODE_FAST is not None:
            try:  # UTF-8, as RFC 8259 asks, without json.loads' encoding detection per call
                return _JSON_DECODE_FAST(bytes(data).decode("utf-8"))
            except (UnicodeDecodeError, ValueError, StopIteration):
                pass  # UTF-16/32, surrounding whitespace, or an error json.loads names
        return json.loads(bytes(data))


_INT = struct.Struct(">q")


class IntegerSerde(Serde[int]):
    name = "integer"

    def to_bytes(self, value: int) -> bytes:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"integer serde needs int, got {type(value).__name__}")
        try:
            return _INT.pack(value)
        except struct.error as exc:
            raise ValueError(f"integer serde: {value} does not fit in 64 bits") from exc

    def from_bytes(self, data: bytes) -> int:
        try:
            return int(_INT.unpack(bytes(data))[0])
        except struct.error as exc:  # not a ValueError: callers catch ValueError
            raise ValueError(f"integer serde needs 8 bytes, got {len(data)}") from exc


BUILTIN_SERDES: dict[str, type[Serde[Any]]] = {
    "bytes": BytesSerde,
    "string": StringSerde,
    "json": JsonSerde,
    "integer": IntegerSerde,
    "long": IntegerSerde,
}


def load_serde(
    name: str,
    config: Mapping[str, str] | None = None,
    *,
    key: str = "",
    stream: tuple[str, str] | None = None,
    for_keys: bool = False,
    store: str | None = None,
) -> Serde[Any]:
    """The serde called ``name``: a built-in, a registry serde, or one registered in config.

    ``key`` is the config key that named it, quoted in the error when the name is unknown.
    ``stream`` (system, stream) and ``for_keys`` say what a registry serde serves: its subject
    is named after them; ``store`` names a store whose values it serves (``avro`` only).
    """
    if name in BUILTIN_SERDES:
        return BUILTIN_SERDES[name]()
    values = config or {}
    if is_registry_serde(name, values):
        from sparkpoint.serde.registry import RegistrySerde, RegistrySettings

        if stream is None and store is not None and name == "avro" and not for_keys:
            job = values.get("job.name", "job")
            return RegistrySerde(
                RegistrySettings.for_store(values, store, key), f"{job}.{store}", False
            )
        if stream is None:
            raise ConfigError(
                f"{key}: serde {name!r} takes its schemas from a Schema Registry, which "
                "serves streams' keys and values, and the values of stores (avro)"
            )
        settings = RegistrySettings.of(values, name, stream[0], key)
        return RegistrySerde(settings, stream[1], for_keys)
    path = values.get(f"serializers.registry.{name}.class")
    if path:
        cls = load_reference(path, f"serializers.registry.{name}.class={path!r}")
        serde = cls()
        if not isinstance(serde, Serde):
            raise ConfigError(f"serializers.registry.{name}.class: {path!r} is not a Serde")
        return serde
    allowed = ", ".join(sorted([*BUILTIN_SERDES, *REGISTRY_SERDES]))
    where = f"{key}: " if key else ""
    raise ConfigError(
        f"{where}unknown serde {name!r}; built-in serdes are {allowed}, "
        f"or register one with serializers.registry.{name}.class"
    )
