"""Reading job files and overrides, and loading a :class:`~sparkpoint.config.view.Config`
from them: YAML (nested keys flatten to dotted names) or ``.properties``, ``--set`` pairs, the
paths made absolute, and where each value came from (:func:`config_sources`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sparkpoint.config.keys import KEYS
from sparkpoint.config.view import Config
from sparkpoint.errors import ConfigError


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings to dotted keys; lists become comma-separated strings. A key
    reached twice (``stores: {s: {factory: x}}`` and ``stores.s.factory: y``) is an error."""
    out: dict[str, str] = {}

    def put(key: str, value: str) -> None:
        if key in out:
            raise ConfigError(f"key {key} is given twice (once nested, once dotted); keep one")
        out[key] = value

    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            for sub_key, sub_value in flatten(v, key + ".").items():
                put(sub_key, sub_value)
            continue
        if isinstance(v, list | tuple):
            put(key, ",".join(str(x) for x in v))
        elif isinstance(v, bool):
            put(key, "true" if v else "false")
        elif v is None:
            put(key, "")
        else:
            put(key, str(v))
    return out


class _StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"line {key_node.start_mark.line + 1}: key {key!r} is given twice in one mapping "
                f"(first on line {seen[key]}); keep one"
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java-style properties (``key=value`` or ``key: value``, ``#``/``!`` comments)."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if not m:
            raise ConfigError(f"line {lineno}: expected 'key=value', got {raw!r}")
        if m.group(1) in out:
            raise ConfigError(f"line {lineno}: key {m.group(1)} is given twice; keep one")
        out[m.group(1)] = m.group(2).strip()
    return out


def read_job_file(path: str | Path) -> dict[str, str]:
    """Read a YAML or properties job file into flat dotted keys."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read job file {p}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{p}: not a text job file (byte {exc.start} is not UTF-8); give a YAML or "
            f".properties file"
        ) from None
    if p.suffix in (".properties", ".props"):
        try:
            return parse_properties(text)
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}") from exc
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: a job file must be a mapping of keys to values")
    try:
        return flatten(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Parse ``key=value`` strings from ``--set``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def load_config(
    job_file: str | Path | None,
    overrides: Mapping[str, str] | None = None,
    *,
    base: Mapping[str, str] | None = None,
) -> Config:
    """Load a job file (or start from ``base``), apply overrides and defaults, validate.

    Paths (``job.data.dir``, ``systems.<s>.path``, ``job.logged.store.base.dir``, the
    ``*.schema.file`` keys) are made absolute: a relative one from the job file against the
    job file's directory, any other against the current directory. ``job.data.dir`` defaults
    to ``.sparkpoint/<job.name>`` in the job file's directory (the current one without a job
    file).
    """
    values: dict[str, str] = dict(base or {})
    from_file: dict[str, str] = {}
    home = Path.cwd()
    if job_file is not None:
        from_file = read_job_file(job_file)
        values.update(from_file)
        home = Path(job_file).expanduser().resolve().parent
    values.update(overrides or {})
    if not values.get("job.name"):
        raise ConfigError("missing required config key job.name (the job's name)")

    def absolute(key: str) -> str:
        path = Path(values[key]).expanduser()
        in_file = key in from_file and values[key] == from_file[key]
        return str(((home if in_file else Path.cwd()) / path).resolve())

    if values.get("job.data.dir"):
        values["job.data.dir"] = absolute("job.data.dir")
    else:
        values["job.data.dir"] = str(home / ".sparkpoint" / values["job.name"])
    for key, value in list(values.items()):
        # the embedded filelog system keeps its streams under job.data.dir unless told otherwise
        if key.startswith("systems.") and key.endswith(".factory") and value == "filelog":
            path_key = key[: -len("factory")] + "path"
            if not values.get(path_key):
                name = key[len("systems.") : -len(".factory")]
                values[path_key] = str(Path(values["job.data.dir"]) / "streams" / name)
            values[path_key] = absolute(path_key)
    for key in [k for k in values if k.endswith(".schema.file") and values[k]]:
        values[key] = absolute(key)  # a store's or a registry serde's schema, read anywhere
    if (
        values.get("job.logged.store.base.dir")
        and "{cwd}" not in values["job.logged.store.base.dir"]
    ):
        values["job.logged.store.base.dir"] = absolute("job.logged.store.base.dir")
    return Config(values)


def config_sources(
    job_file: str | Path | None, overrides: Mapping[str, str]
) -> list[tuple[str, str, str]]:
    """``(key, value, source)`` of the effective config: file, --set, derived or default."""
    from_file = read_job_file(job_file) if job_file is not None else {}
    config = load_config(job_file, overrides)
    rows = []
    for key in sorted(config):
        if key in overrides:
            source = "--set"
        elif key in from_file:
            source = "file" if from_file[key] == config[key] else "file (made absolute)"
        else:
            source = "derived"
        rows.append((key, config[key], source))
    for spec in KEYS:
        if "<s>" not in spec.pattern and spec.pattern not in config and spec.default is not None:
            rows.append((spec.pattern, spec.default, "default"))
    return sorted(rows)
