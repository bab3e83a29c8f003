"""Store values that evolve with their Avro schema (issue 66): each value carries the id of the
schema it was written with; values written before a change read with the current schema by
Avro's resolution rules (a field added with a default, a field removed), live, after a restore
from the changelog, and in ``state dump``; a change that cannot read them is refused before any
batch, naming the store, the field and the rule. One task's storage, no driver."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.storage.kv.store import check_store_schemas
from sparkpoint.testing.schema_registry import schema_registry
from sparkpoint.tools.state import committed_entries
from tests.helpers import changelog_job
from tests.storage.cycle import STORE, TaskCycle

V1 = {"type": "record", "name": "Stats", "fields": [{"name": "count", "type": "long"}]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "last_page", "type": "string", "default": ""}]}
V3 = {**V2, "fields": [*V2["fields"], {"name": "country", "type": "string"}]}  # no default


@pytest.fixture
def registry() -> Iterator[str]:
    with schema_registry() as url:
        yield url


def job(tmp_path: Path, registry: str, schema: dict[str, Any], name: str) -> Config:
    avsc = tmp_path / f"{name}.avsc"
    avsc.write_text(json.dumps(schema))
    return changelog_job(
        tmp_path,
        None,
        1,
        **{
            f"stores.{STORE}.msg.serde": "avro",
            f"stores.{STORE}.schema.file": str(avsc),
            "systems.filelog.schema.registry.url": registry,
        },
    )


def test_values_written_before_a_change_read_with_the_new_schema(
    tmp_path: Path, registry: str
) -> None:
    first = job(tmp_path, registry, V1, "v1")
    check_store_schemas(first)  # nothing written yet: nothing to check
    cycle = TaskCycle(first)
    cycle.batch(wait=True, writes=[("u1", {"count": 1}), ("u2", {"count": 5})])

    second = job(tmp_path, registry, V2, "v2")
    check_store_schemas(second)  # a field added with a default reads the old values
    again = TaskCycle(second, run_id="run-2")
    assert again.contents() == {
        "u1": {"count": 1, "last_page": ""},
        "u2": {"count": 5, "last_page": ""},
    }
    again.batch(wait=True, writes=[("u1", {"count": 2, "last_page": "/a"})])
    new = {"u1": {"count": 2, "last_page": "/a"}, "u2": {"count": 5, "last_page": ""}}
    assert {k: v for _t, k, v in committed_entries(second, STORE)} == new  # state dump
    shutil.rmtree(second.store_base_dir)  # restored from the changelog: old and new values
    restored = TaskCycle(second, run_id="run-3")
    assert restored.contents() == new and restored.sources == {"changelog"}

    back = job(tmp_path, registry, V1, "v1-again")  # a field removed: its values are ignored
    check_store_schemas(back)
    assert TaskCycle(back, run_id="run-4").contents() == {"u1": {"count": 2}, "u2": {"count": 5}}


def test_a_change_that_cannot_read_the_values_is_refused_naming_field_and_rule(
    tmp_path: Path, registry: str
) -> None:
    first = job(tmp_path, registry, V1, "v1")
    TaskCycle(first).batch(wait=True, writes=[("u1", {"count": 1})])
    with pytest.raises(
        ConfigError,
        match=r"store user-counts: its schema .*v3\.avsc cannot read the values written with "
        r"version 1 of pageviews\.user-counts-value: field country: the writer has no such "
        r"field and the reader gives it no default",
    ):
        check_store_schemas(job(tmp_path, registry, V3, "v3"))


def test_an_avro_store_without_its_schema_or_registry_names_the_key(tmp_path: Path) -> None:
    no_schema = changelog_job(tmp_path, None, 1, **{f"stores.{STORE}.msg.serde": "avro"})
    with pytest.raises(ConfigError, match=rf"set stores\.{STORE}\.schema\.file"):
        check_store_schemas(no_schema)
    avsc = tmp_path / "v1.avsc"
    avsc.write_text(json.dumps(V1))
    no_registry = changelog_job(
        tmp_path,
        None,
        1,
        **{f"stores.{STORE}.msg.serde": "avro", f"stores.{STORE}.schema.file": str(avsc)},
    )
    with pytest.raises(
        ConfigError,
        match=rf"set stores\.{STORE}\.schema\.registry\.url \(or systems\.filelog\.schema",
    ):
        check_store_schemas(no_registry)
