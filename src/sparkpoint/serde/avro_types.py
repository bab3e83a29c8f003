"""An Avro record schema as Spark SQL columns: what a DataFrame pipeline's ``batch.df``
``value`` struct is when its input is read with the ``avro`` serde (no ``value_schema`` to
write by hand).

Avro ``null`` unions of one other type are that type (nullable); enums are strings; fixed is
binary; logical types keep their underlying type (a ``timestamp-millis`` is a ``BIGINT`` of
milliseconds, as the task API sees it). A union of two or more other types has no Spark type:
the error names the field.
"""

from __future__ import annotations

from typing import Any

from sparkpoint.errors import ConfigError

_PRIMITIVE = {
    "string": "STRING",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "bytes": "BINARY",
    "enum": "STRING",
    "fixed": "BINARY",
}


def value_columns(schema: Any) -> str:
    """``"name TYPE, ..."`` for the fields of an Avro record schema (parsed JSON)."""
    if not isinstance(schema, dict) or schema.get("type") not in ("record", "error"):
        raise ConfigError(f"an Avro value schema to read as columns is a record, not {schema!r}")
    names: dict[str, Any] = {}
    return _fields(schema, names, "")


def _fields(record: dict[str, Any], names: dict[str, Any], path: str) -> str:
    names[str(record["name"]).rsplit(".", 1)[-1]] = names[str(record["name"])] = record
    columns = []
    for f in record.get("fields", []):
        where = f"{path}.{f['name']}" if path else str(f["name"])
        columns.append(f"`{f['name']}` {_type(f['type'], names, where)}")
    return ", ".join(columns)


def _type(schema: Any, names: dict[str, Any], where: str) -> str:
    if isinstance(schema, list):
        others = [s for s in schema if s != "null"]
        if len(others) != 1:
            raise ConfigError(
                f"Avro field {where}: a union of {len(others)} types other than null has no "
                "Spark type; read this input with value_type='BINARY' and decode it yourself"
            )
        return _type(others[0], names, where)
    if isinstance(schema, str):
        if schema in _PRIMITIVE:
            return _PRIMITIVE[schema]
        if schema in names:
            return _type(names[schema], names, where)
        raise ConfigError(f"Avro field {where}: unknown type {schema!r}")
    kind = schema.get("type")
    if kind in ("record", "error"):
        return f"STRUCT<{_fields(schema, names, where)}>".replace("` ", "`: ")
    if kind == "array":
        return f"ARRAY<{_type(schema['items'], names, where + '[]')}>"
    if kind == "map":
        return f"MAP<STRING, {_type(schema['values'], names, where + '{}')}>"
    if kind in ("enum", "fixed"):
        names[str(schema["name"])] = schema
        return _PRIMITIVE[kind]
    return _type(kind, names, where)
