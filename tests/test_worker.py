"""What a process keeps between batches lives in one registry with its rules (issue 30: five
modules kept worker-lifetime state in module globals)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from sparkpoint import worker

SRC = Path(__file__).resolve().parent.parent / "src" / "sparkpoint"


def test_every_slot_is_taken_by_the_module_that_owns_it() -> None:
    for name, declared in worker.SLOTS.items():
        importlib.import_module(declared.owner)
        assert name in worker.taken(), f"{declared.owner} does not take slot {name}"
        assert declared.holds and declared.rule  # every kept thing has its rule written


def test_an_undeclared_slot_is_refused() -> None:
    with pytest.raises(KeyError, match="worker slot 'scratch' is not declared"):
        worker.slot("scratch", dict)


def test_no_module_rebinds_process_state_with_global() -> None:
    """A `global` statement is state kept between calls outside the registry."""
    found = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    assert found == []
