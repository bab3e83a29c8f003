"""Whether one Avro schema can read what another wrote: the "Schema Resolution" rules of the
Avro specification (avro.apache.org/docs/current/specification/#schema-resolution), as the
Schema Registry applies them for its compatibility levels.

:func:`problems` answers with the reasons a reader cannot read a writer's data, each naming
the field path and the rule, so a refused change says what to fix. It checks schemas only;
the encoding and decoding are fastavro's.
"""

from __future__ import annotations

from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
#: writer type -> the reader types it is promoted to
PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_NAMED = ("record", "enum", "fixed", "error")

Names = dict[str, dict[str, Any]]


def _full_name(schema: dict[str, Any], namespace: str) -> str:
    name = str(schema["name"])
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def _collect(schema: Any, names: Names, namespace: str = "") -> None:
    """Every named type ``schema`` defines, by full and short name (references resolve)."""
    if isinstance(schema, list):
        for branch in schema:
            _collect(branch, names, namespace)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED:
            full = _full_name(schema, namespace)
            names[full] = names[full.rsplit(".", 1)[-1]] = schema
            namespace = full.rpartition(".")[0]
            for f in schema.get("fields", []) if kind in ("record", "error") else []:
                _collect(f["type"], names, namespace)
        elif kind == "array":
            _collect(schema["items"], names, namespace)
        elif kind == "map":
            _collect(schema["values"], names, namespace)
        elif isinstance(kind, dict | list):
            _collect(kind, names, namespace)


def _resolve(schema: Any, names: Names) -> Any:
    """A type as a primitive's name, a dict or a union list: a reference becomes the named
    type's definition, ``{"type": "int", "logicalType": ...}`` the primitive (resolution reads
    the underlying type)."""
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return schema
        if schema not in names:
            raise ValueError(f"unknown Avro type {schema!r}")
        return names[schema]
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind in PRIMITIVES:
            return kind
        if isinstance(kind, str) and kind in _TYPES:
            return schema
        return _resolve(kind, names)
    return schema


_TYPES = frozenset({"record", "error", "enum", "array", "map", "fixed"}) | PRIMITIVES


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    return str(schema.get("type"))


def problems(reader: Any, writer: Any) -> list[str]:
    """Why ``reader`` cannot read data ``writer`` wrote (an empty list: it can)."""
    reader_names: Names = {}
    writer_names: Names = {}
    _collect(reader, reader_names)
    _collect(writer, writer_names)
    out: list[str] = []
    _match(reader, writer, reader_names, writer_names, "", out, set())
    return out


def _match(
    reader: Any, writer: Any, rn: Names, wn: Names, path: str, out: list[str], seen: set[Any]
) -> None:
    r, w = _resolve(reader, rn), _resolve(writer, wn)
    rk, wk = _kind(r), _kind(w)
    where = f"field {path}" if path else "the value"
    if wk == "union":
        for branch in w:  # every branch the writer may have written must be readable
            _match(r, branch, rn, wn, path, out, seen)
        return
    if rk == "union":
        for branch in r:  # the first branch that reads the writer's type
            found: list[str] = []
            _match(branch, w, rn, wn, path, found, seen)
            if not found:
                return
        out.append(f"{where}: no branch of the reader's union reads the writer's {wk}")
        return
    if rk == wk and rk in PRIMITIVES:
        return
    if wk in PROMOTIONS and rk in PROMOTIONS[wk]:
        return
    if rk != wk and not ({rk, wk} <= {"record", "error"}):
        out.append(f"{where}: the writer's {wk} cannot be read as {rk}")
        return
    _match_complex(r, w, rk, rn, wn, path, out, seen)


def _match_complex(
    r: Any, w: Any, kind: str, rn: Names, wn: Names, path: str, out: list[str], seen: set[Any]
) -> None:
    """Two types of the same complex ``kind`` (record, enum, fixed, array or map)."""
    where = f"field {path}" if path else "the value"
    named = kind in ("record", "error", "enum", "fixed")
    if named and not _same_name(r, w):
        out.append(f"{where}: {kind} {w['name']} cannot be read as {r['name']} (names differ)")
    elif kind in ("record", "error"):
        if (id(r), id(w)) not in seen:  # else a recursive type, already being compared
            seen.add((id(r), id(w)))
            _records(r, w, rn, wn, path, out, seen)
    elif kind == "enum":
        missing = [s for s in w.get("symbols", []) if s not in r.get("symbols", [])]
        if missing and "default" not in r:
            out.append(
                f"{where}: enum {r['name']} lacks symbol(s) {', '.join(missing)} the writer has, "
                "and has no default"
            )
    elif kind == "fixed" and r.get("size") != w.get("size"):
        out.append(f"{where}: fixed {r['name']} of size {r.get('size')}, written {w.get('size')}")
    elif kind == "array":
        _match(r["items"], w["items"], rn, wn, f"{path}[]", out, seen)
    elif kind == "map":
        _match(r["values"], w["values"], rn, wn, f"{path}{{}}", out, seen)


def _same_name(r: dict[str, Any], w: dict[str, Any]) -> bool:
    """Whether the reader's named type reads the writer's: the same unqualified name, or the
    writer's among the reader's aliases."""
    short = str(w["name"]).rsplit(".", 1)[-1]
    aliases = {str(a).rsplit(".", 1)[-1] for a in r.get("aliases", [])}
    return str(r["name"]).rsplit(".", 1)[-1] == short or short in aliases


def _records(
    r: dict[str, Any],
    w: dict[str, Any],
    rn: Names,
    wn: Names,
    path: str,
    out: list[str],
    seen: set[Any],
) -> None:
    written = {f["name"]: f for f in w.get("fields", [])}
    for f in r.get("fields", []):
        name = f["name"]
        field_path = f"{path}.{name}" if path else name
        source = written.get(name) or next(
            (written[a] for a in f.get("aliases", []) if a in written), None
        )
        if source is None:
            if "default" not in f:
                out.append(
                    f"field {field_path}: the writer has no such field and the reader gives "
                    "it no default (add a default)"
                )
            continue
        _match(f["type"], source["type"], rn, wn, field_path, out, seen)
