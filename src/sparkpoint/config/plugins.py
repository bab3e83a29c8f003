"""Config keys that plugins declare: the ``config_keys`` of installed state backends and
systems (entry points) and of the ``module:Class`` ones a config names."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from sparkpoint.config.keys import ConfigKey
from sparkpoint.refs import installed

#: entry-point groups whose classes may declare ``config_keys`` (a tuple of :class:`ConfigKey`)
PLUGIN_GROUPS = ("sparkpoint.state_backends", "sparkpoint.systems")
_PLUGIN_REFERENCES = (".backup.factories", ".restore.factories")


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception:
        return None


def plugin_keys(values: Mapping[str, str] | None = None) -> tuple[ConfigKey, ...]:
    """Config keys declared by plugins: the ``config_keys`` of every installed state backend and
    system (entry points), and of ``module:Class`` backends and systems that ``values`` name.
    They are listed by ``sparkpoint config keys`` and validated like the built-in keys."""
    classes = []
    for group in PLUGIN_GROUPS:
        for ep in installed(group):
            classes.append(_load(ep.value))
    for key, value in (values or {}).items():
        named = key.endswith(_PLUGIN_REFERENCES) or (
            key.startswith("systems.") and key.endswith(".factory")
        )
        if named:
            classes.extend(_load(n.strip()) for n in value.split(",") if ":" in n)
    found: list[ConfigKey] = []
    for cls in classes:
        for spec in getattr(cls, "config_keys", ()):
            if isinstance(spec, ConfigKey) and spec not in found:
                found.append(spec)
    return tuple(found)
