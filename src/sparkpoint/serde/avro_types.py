"""An Avro record schema as Spark SQL columns: what a DataFrame pipeline's ``batch.df``
``value`` struct is when its input is read with the ``avro`` serde (no ``value_schema`` to
write by hand).

Avro ``null`` unions of one other type are that type (nullable); enums are strings; fixed is
binary; logical types are what fastavro decodes them to: ``timestamp-*`` a ``TIMESTAMP_NTZ`` (UTC),
``date`` a ``DATE``, ``decimal`` a ``DECIMAL(p,s)``, ``uuid`` a ``STRING``, ``time-*`` their
integer. A union of two or more other types, or a record that holds itself, has no Spark type:
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
    return _Columns().fields(schema, "", "")


def _logical(schema: dict[str, Any]) -> str | None:
    """The Spark type of a logical type, as fastavro decodes it (None: not one, or not known)."""
    logical = schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis"):
        return "TIMESTAMP_NTZ"  # fastavro's UTC datetimes; Spark's TIMESTAMP needs a session zone
    if logical == "date":
        return "DATE"
    if logical == "decimal":
        return f"DECIMAL({int(schema.get('precision', 38))},{int(schema.get('scale', 0))})"
    if logical == "uuid":
        return "STRING"
    return None


class _Columns:
    """One conversion: the named types seen (by short and full name), and the records being
    expanded (a record inside itself has no Spark type)."""

    def __init__(self) -> None:
        self.names: dict[str, Any] = {}
        self.open: set[int] = set()

    def register(self, schema: dict[str, Any], namespace: str) -> str:
        """Remember a named type; its namespace (the one its own names inherit)."""
        name = str(schema["name"])
        ns = schema.get("namespace", namespace)
        full = name if "." in name else (f"{ns}.{name}" if ns else name)
        self.names[full.rsplit(".", 1)[-1]] = self.names[full] = schema
        return full.rpartition(".")[0]

    def fields(self, record: dict[str, Any], path: str, namespace: str) -> str:
        if id(record) in self.open:
            raise ConfigError(f"Avro field {path}: a record that holds itself has no Spark type")
        self.open.add(id(record))
        inner = self.register(record, namespace)
        columns = []
        for f in record.get("fields", []):
            where = f"{path}.{f['name']}" if path else str(f["name"])
            columns.append(f"`{f['name']}` {self.type(f['type'], where, inner)}")
        self.open.discard(id(record))
        return ", ".join(columns)

    def type(self, schema: Any, where: str, namespace: str) -> str:
        if isinstance(schema, list):
            others = [s for s in schema if s != "null"]
            if len(others) != 1:
                raise ConfigError(
                    f"Avro field {where}: a union of {len(others)} types other than null has "
                    "no Spark type; read this input with value_type='BINARY' and decode it "
                    "yourself"
                )
            return self.type(others[0], where, namespace)
        if isinstance(schema, str):
            if schema in _PRIMITIVE:
                return _PRIMITIVE[schema]
            named = self.names.get(schema) or self.names.get(f"{namespace}.{schema}")
            if named is None:
                raise ConfigError(f"Avro field {where}: unknown type {schema!r}")
            return self.type(named, where, namespace)
        kind = schema.get("type")
        logical = _logical(schema)
        if logical is not None:
            return logical
        if kind in ("record", "error"):
            return f"STRUCT<{self.fields(schema, where, namespace)}>".replace("` ", "`: ")
        if kind == "array":
            return f"ARRAY<{self.type(schema['items'], where + '[]', namespace)}>"
        if kind == "map":
            return f"MAP<STRING, {self.type(schema['values'], where + '{}', namespace)}>"
        if kind in ("enum", "fixed"):
            self.register(schema, namespace)
            return _PRIMITIVE[kind]
        return self.type(kind, where, namespace)
