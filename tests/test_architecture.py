"""Dependencies run one way (DESIGN.md §9): cli, runtime -> tools -> storage, checkpoint,
startpoint -> metadata, system -> model, config, serde (serde is a leaf: config names its
serdes); only runtime imports pyspark; nothing in the product imports the test kit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "sparkpoint"

# a package may import its own modules and those of lower layers, never higher ones
LAYER = {
    "errors": 0,
    "fsutil": 0,
    "failpoints": 0,
    "model": 1,
    "config": 1,
    "serde": 1,
    "system": 3,
    "metadata": 4,
    "checkpoint": 4,
    "startpoint": 4,
    "storage": 5,
    "tools": 6,
    "runtime": 7,
    "cli": 8,
    "testing": 9,
    "__init__": 9,
}


# Startpoint values are plain values (the model layer); SystemAdmin.resolve_startpoint_to_offset
# takes them, as in Samza's SystemAdmin API. The startpoint *manager* stays above the systems.
VALUE_MODULES = {"sparkpoint.startpoint.model"}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> list[tuple[str, str, int]]:
    """(importing package, imported sparkpoint module, line) for every import in the product."""
    out = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        here = package_of(".".join(rel.parts))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                out.append((f"{here}:{rel}", name, node.lineno))
    return out


def test_layers_are_respected() -> None:
    wrong = []
    for where, name, line in imports():
        here = where.split(":")[0]
        if not name.startswith("sparkpoint.") or here == "testing" or name in VALUE_MODULES:
            continue
        there = package_of(name)
        if there != here and LAYER[there] > LAYER[here]:
            wrong.append(f"{where.split(':')[1]}:{line} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("forbidden", ["pyspark", "sparkpoint.testing"])
def test_only_where_allowed(forbidden: str) -> None:
    allowed = {"runtime", "cli", "testing", "__init__"} if forbidden == "pyspark" else {"testing"}
    wrong = [
        f"{where.split(':')[1]}:{line}"
        for where, name, line in imports()
        if name.startswith(forbidden) and where.split(":")[0] not in allowed
    ]
    assert wrong == []


# test folders that are not a package of sparkpoint: whole-job tests, fixtures
NOT_PACKAGES = {"e2e", "golden", "jobs", "pipeline"}


def test_tests_mirror_the_package_layout() -> None:
    """A test folder is named after the sparkpoint package it tests (``tests/storage/blobstore``
    tests ``sparkpoint.storage.blobstore``), so a package's tests are found where it lives."""
    tests = Path(__file__).resolve().parent
    stray = [
        str(d.relative_to(tests))
        for d in sorted(tests.rglob("*"))
        if d.is_dir()
        and d.name != "__pycache__"
        and d.relative_to(tests).parts[0] not in NOT_PACKAGES
        and not (SRC / d.relative_to(tests)).is_dir()
    ]
    assert stray == [], f"test folders with no sparkpoint package of that name: {stray}"
