"""Every declared config key does something (issue 72): ``task.shutdown.ms`` was declared,
documented and read nowhere. A key is read when the code names it (the whole key, or, for a
key of a named store, system or stream, what follows the name), or when it belongs to a family
the code reads by its prefix and passes on (named below, with where)."""

from __future__ import annotations

from pathlib import Path

from sparkpoint.config.keys import KEYS

SRC = Path(__file__).resolve().parents[2] / "src" / "sparkpoint"

#: key prefixes read as a family, each by one reader: the prefix as the code spells it, and why
READ_BY_PREFIX = {
    # serde/registry.py: every option under it goes to confluent-kafka's SchemaRegistryClient
    "systems.<s>.schema.registry.": 'f"systems.{system}.schema.registry."',
    # config/view.py: a stream's setting falls back to its system's default
    "systems.<s>.default.stream.": 'f"systems.{stream.system}.default.stream.',
    # storage/commit.py: Samza's skip-commit settings, read under one prefix
    "task.commit.skip.commit.": '"task.commit.skip.commit."',
}


def _code() -> str:
    return "\n".join(
        p.read_text() for p in sorted(SRC.rglob("*.py")) if p != SRC / "config" / "keys.py"
    )


def _read(pattern: str, code: str) -> bool:
    for prefix, spelled in READ_BY_PREFIX.items():
        if pattern.startswith(prefix):
            return spelled in code
    if "<s>" in pattern:  # what follows the name: f"...{store}.rocksdb.ttl.ms", or named + "..."
        tail = pattern.rsplit("<s>", 1)[1]
        return tail in code or f'"{tail.removeprefix(".")}"' in code
    return f'"{pattern}"' in code


def test_every_declared_key_is_read_by_the_code() -> None:
    code = _code()
    unread = [k.pattern for k in KEYS if not _read(k.pattern, code)]
    assert unread == [], f"declared but read nowhere (read them, or undeclare them): {unread}"


def test_the_families_read_by_prefix_are_declared() -> None:
    for prefix in READ_BY_PREFIX:
        assert any(k.pattern.startswith(prefix) for k in KEYS), prefix


def test_the_committed_configuration_reference_is_current() -> None:
    """Issue 72: docs/configuration.md was empty in the source tree (the reference was made at
    build time only); it is committed, and held to the registry here."""
    import importlib.util

    path = SRC.parents[1] / "docs" / "hooks" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference", path)
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.PAGE.read_text()
    assert "| `task.shutdown.ms` |" in page
    assert hook.render(page) == page, (
        "docs/configuration.md is out of date: python docs/hooks/config_reference.py --write"
    )
