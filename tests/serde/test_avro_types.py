"""An Avro record schema as the Spark columns of a DataFrame's value struct
(sparkpoint.serde.avro_types), checked by Spark's own parser and by Arrow holding what
fastavro decodes."""

from __future__ import annotations

import datetime
import decimal
import io
from typing import Any

import fastavro
import pyarrow as pa
import pytest

from sparkpoint.errors import ConfigError
from sparkpoint.runtime.dataframe.source import arrow_schema
from sparkpoint.serde.avro_types import value_columns

SCHEMA = {
    "type": "record",
    "name": "V",
    "namespace": "n",
    "fields": [
        {"name": "user", "type": "string"},
        {"name": "n", "type": ["null", "long"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {
            "name": "home",
            "type": {
                "type": "record",
                "name": "Place",
                "fields": [{"name": "x", "type": "double"}],
            },
        },
        {"name": "work", "type": "n.Place"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    ],
}


def test_the_columns_hold_what_fastavro_decodes(spark: Any) -> None:
    ddl = value_columns(SCHEMA)
    struct = pa.struct(list(arrow_schema(ddl)))  # parsed by Spark, as a pipeline does
    datum = {
        "user": "u1",
        "n": None,
        "ts": datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC),
        "day": datetime.date(2026, 12, 7),
        "amount": decimal.Decimal("12.34"),
        "tags": ["a"],
        "home": {"x": 1.5},
        "work": {"x": 2.5},
        "kind": "B",
    }
    buf = io.BytesIO()
    parsed = fastavro.parse_schema(SCHEMA)
    fastavro.schemaless_writer(buf, parsed, datum)
    buf.seek(0)
    decoded = fastavro.schemaless_reader(buf, parsed, None)
    assert pa.array([decoded], struct).to_pylist()[0]["amount"] == decimal.Decimal("12.34")


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (
            {"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]},
            "a union of 2 types",
        ),
        (
            {"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]},
            "holds itself",
        ),
        ("string", "is a record"),
    ],
)
def test_what_has_no_spark_type_is_refused_naming_the_field(schema: Any, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        value_columns(schema)
