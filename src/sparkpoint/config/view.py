"""The :class:`Config` view: an immutable, validated job config with typed accessors whose
defaults come from the declared keys only."""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from sparkpoint.config.keys import KEYS, OWNED_PREFIXES, ConfigKey, declared, is_stream_property
from sparkpoint.config.plugins import plugin_keys
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream


class Config(Mapping[str, str]):
    """An immutable, validated job config with typed accessors."""

    def __init__(
        self,
        values: Mapping[str, str],
        *,
        validate: bool = True,
        one_off: frozenset[str] = frozenset(),
    ) -> None:
        self._values = dict(values)
        #: keys set for one run only (``--set``): not stored as the job's config
        self.one_off = one_off
        self._plugins: tuple[ConfigKey, ...] | None = None
        if validate:
            self._validate()

    @property
    def plugin_keys(self) -> tuple[ConfigKey, ...]:
        """The keys plugins this config uses declare (see :func:`plugin_keys`)."""
        if self._plugins is None:
            self._plugins = plugin_keys(self._values)
        return self._plugins

    # Mapping protocol
    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def to_dict(self) -> dict[str, str]:
        return dict(self._values)

    def with_overrides(self, overrides: Mapping[str, str]) -> Config:
        return Config({**self._values, **overrides}, one_off=self.one_off)

    def with_one_off(self, keys: Iterable[str]) -> Config:
        """This config, with ``keys`` marked as set for this run only (``--set``)."""
        return Config(self._values, validate=False, one_off=self.one_off | frozenset(keys))

    # typed access
    def get_str(self, key: str, default: str | None = None) -> str | None:
        value = self._values.get(key)
        if value is None or value == "":
            spec = declared(key) or declared(key, self.plugin_keys)
            return default if default is not None else (spec.default if spec else None)
        return value

    def require(self, key: str) -> str:
        value = self.get_str(key)
        if value is None:
            spec = declared(key)
            what = f" ({spec.allowed}: {spec.help})" if spec else ""
            raise ConfigError(f"missing required config key {key}{what}")
        return value

    def _spec(self, key: str) -> ConfigKey | None:
        """The declaration of ``key``; with ``SPARKPOINT_STRICT_KEYS`` set (the test suite
        sets it), reading a key nobody declared is an error, so no default lives at a call
        site."""
        spec = declared(key) or declared(key, self.plugin_keys)
        if spec is None and os.environ.get("SPARKPOINT_STRICT_KEYS"):
            raise ConfigError(
                f"config key {key} is read but not declared: declare it in sparkpoint.config.KEYS "
                f"(or a plugin's config_keys) with its default"
            )
        return spec

    def get_int(self, key: str) -> int:
        """The key's integer value, else its declared default (an error if it has none)."""
        self._spec(key)
        value = self.get_str(key)
        if value is None:
            return self.get_int_required(key)
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} is not an integer") from None

    def get_int_required(self, key: str) -> int:
        return int(self.require(key))

    def get_bool(self, key: str) -> bool:
        """The key's value, else its declared default: only the table says what a boolean key
        defaults to."""
        self._spec(key)
        value = self.get_str(key)
        return (value or "").lower() == "true"

    def get_list(self, key: str) -> list[str]:
        value = self.get_str(key) or ""
        return [v.strip() for v in value.split(",") if v.strip()]

    def subset(self, prefix: str) -> dict[str, str]:
        """Keys under ``prefix`` with the prefix removed."""
        return {k[len(prefix) :]: v for k, v in self._values.items() if k.startswith(prefix)}

    def names_under(self, namespace: str) -> list[str]:
        """Names ``x`` with some key ``namespace.x.factory`` (stores, systems)."""
        names = set()
        for key in self._values:
            if key.startswith(namespace + ".") and key.endswith(".factory"):
                names.add(key[len(namespace) + 1 : -len(".factory")])
        return sorted(names)

    # job views
    @property
    def job_name(self) -> str:
        return self.require("job.name")

    @property
    def job_id(self) -> str:
        return self.get_str("job.id") or "1"

    @property
    def job_label(self) -> str:
        """``<job.name>-<job.id>``: the job instance, as messages and metrics keys name it."""
        return f"{self.job_name}-{self.job_id}"

    @property
    def data_dir(self) -> Path:
        return Path(self.require("job.data.dir"))

    @property
    def store_base_dir(self) -> Path:
        """Where this process keeps task state; ``{cwd}`` is the process's working directory.

        On a Spark cluster ``{cwd}`` makes the directory private to each executor (its working
        directory), so a task that moves restores its state from a backend.
        """
        value = self.get_str("job.logged.store.base.dir")
        if not value:
            return self.data_dir / "state"
        return Path(value.replace("{cwd}", os.getcwd()))

    @property
    def systems(self) -> list[str]:
        return self.names_under("systems")

    @property
    def stores(self) -> list[str]:
        return self.names_under("stores")

    @property
    def inputs(self) -> list[SystemStream]:
        """Every stream the job's tasks read: ``task.inputs``, then the tables' side inputs."""
        main = [SystemStream.parse(s) for s in self.get_list("task.inputs")]
        return main + [s for s in self.side_inputs if s not in main]

    @property
    def intermediate_names(self) -> set[str]:
        """The stream names flagged ``streams.<s>.samza.intermediate``, inputs or not."""
        head, tail = "streams.", ".samza.intermediate"
        return {
            key[len(head) : -len(tail)]
            for key in self._values
            if key.startswith(head) and key.endswith(tail) and self.get_bool(key)
        }

    @property
    def intermediate_streams(self) -> list[SystemStream]:
        """The inputs the job also writes (``streams.<s>.samza.intermediate``), in input order."""
        names = self.intermediate_names
        return [s for s in self.inputs if s.stream in names]

    @property
    def side_inputs(self) -> dict[SystemStream, str]:
        """The streams that fill tables (``stores.<s>.side.inputs``), each with its store."""
        out: dict[SystemStream, str] = {}
        for store in self.stores:
            for text in self.get_list(f"stores.{store}.side.inputs"):
                stream = SystemStream.parse(text)
                other = out.setdefault(stream, store)
                if other != store:
                    raise ConfigError(
                        f"stores.{store}.side.inputs: {stream} fills store {other!r} already; "
                        "a stream fills one table"
                    )
        return out

    @property
    def broadcast_inputs(self) -> list[tuple[SystemStream, set[int] | None]]:
        """Broadcast streams with their partitions (``None``: every partition)."""
        out: list[tuple[SystemStream, set[int] | None]] = []
        for item in self.get_list("task.broadcast.inputs"):
            name, _, spec = item.partition("#")
            parts: set[int] | None = None
            if spec:
                m = re.fullmatch(r"(\d+)|\[(\d+)-(\d+)\]", spec)
                if not m:
                    raise ConfigError(
                        f"task.broadcast.inputs: {item!r}: expected system.stream#N or "
                        "system.stream#[A-B]"
                    )
                lo, hi = (m.group(1), m.group(1)) if m.group(1) else (m.group(2), m.group(3))
                parts = set(range(int(lo), int(hi) + 1))
            out.append((SystemStream.parse(name), parts))
        return out

    @property
    def coordinator_system(self) -> str:
        value = self.get_str("job.coordinator.system")
        if value:
            return value
        systems = self.systems
        if not systems:
            raise ConfigError("no system configured: add systems.<name>.factory (e.g. filelog)")
        return systems[0]

    @property
    def checkpoint_system(self) -> str:
        return self.get_str("task.checkpoint.system") or self.coordinator_system

    def stream_properties(self, stream: SystemStream) -> dict[str, str]:
        """System-specific properties to create ``stream`` with (Kafka topic configs):
        ``systems.<s>.default.stream.<p>``, overridden by ``streams.<stream>.<p>``; ``samza.*``
        settings and the partition count are sparkpoint's, not properties."""
        out: dict[str, str] = {}
        for prefix in (f"systems.{stream.system}.default.stream.", f"streams.{stream.stream}."):
            for key, value in self.subset(prefix).items():
                if not key.startswith("samza.") and key != "partitions":
                    out[key] = value
        return out

    def stream_key(self, stream: SystemStream, suffix: str) -> str | None:
        """A per-stream setting, falling back to the system's ``default.stream`` one."""
        return self.get_str(f"streams.{stream.stream}.{suffix}") or self.get_str(
            f"systems.{stream.system}.default.stream.{suffix}"
        )

    def _validate(self) -> None:
        for key, value in self._values.items():
            spec = declared(key) or declared(key, self.plugin_keys)
            if spec is None:
                self._undeclared(key)
                continue
            if spec.check is not None and value != "" and not spec.check(value):
                raise ConfigError(f"{key}={value!r} is invalid; allowed: {spec.allowed}")
        for store, key in self._stores_without_factory():
            raise ConfigError(
                f"{key} names store {store}, which has no stores.{store}.factory "
                f"(rocksdb or in-memory)"
            )
        systems = set(self.systems)
        main = set(self.get_list("task.inputs"))
        for stream, store in self.side_inputs.items():
            if str(stream) in main:
                raise ConfigError(
                    f"stores.{store}.side.inputs: {stream} is in task.inputs too; a stream is "
                    "either an input of the task or a table's side input: remove it from one"
                )
        for ss_text in [*main, *(str(s) for s in self.side_inputs)]:
            ss = SystemStream.parse(ss_text)
            if ss.system not in systems:
                known = ", ".join(sorted(systems)) or "none"
                raise ConfigError(
                    f"{'task.inputs' if ss_text in main else 'side input'}: system "
                    f"{ss.system!r} of {ss_text!r} is not configured "
                    f"(add systems.{ss.system}.factory); configured systems: {known}"
                )
        for key in ("job.coordinator.system", "task.checkpoint.system"):
            configured = self._values.get(key)
            if configured and configured not in systems:
                raise ConfigError(
                    f"{key}={configured!r} is not a configured system; "
                    f"configured: {', '.join(sorted(systems)) or 'none'}"
                )

    def _stores_without_factory(self) -> Iterator[tuple[str, str]]:
        """(store, one of its keys) for stores configured without a factory."""
        suffixes = [
            k.pattern[len("stores.<s>.") :] for k in KEYS if k.pattern.startswith("stores.<s>.")
        ]
        factories = set(self.stores)
        for key in sorted(self._values):
            for suffix in suffixes:
                if key.startswith("stores.") and key.endswith("." + suffix):
                    store = key[len("stores.") : -len(suffix) - 1]
                    if store and store not in factories:
                        yield store, key
                    break

    def _undeclared(self, key: str) -> None:
        """A key no one declares: passed on (a stream property, a blob store option), or
        refused where sparkpoint owns the prefix, or as a typo of a declared stream key."""
        passed_on = is_stream_property(key) or key.startswith("blob.store.options.")
        if key.startswith(OWNED_PREFIXES) and not passed_on:
            self._unknown(key)
        if is_stream_property(key):
            _refuse_misspelt_stream_key(key)

    def _unknown(self, key: str) -> None:
        # compare against declared patterns with the name part filled from the key itself
        candidates = []
        parts = key.split(".")
        for spec in KEYS:
            pattern = spec.pattern
            if "<s>" in pattern and len(parts) > 1:
                pattern = pattern.replace("<s>", parts[1])
            candidates.append(pattern)
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"unknown config key {key}{hint} (run 'sparkpoint config keys' to list)")


@functools.cache
def _declared_stream_suffixes() -> list[str]:
    """What follows ``streams.<s>.`` in the declared keys (``event.time.field`` ...)."""
    head = "streams.<s>."
    return [
        spec.pattern[len(head) :]
        for spec in KEYS
        if spec.pattern.startswith(head) and "<" not in spec.pattern[len(head) :]
    ]


def _refuse_misspelt_stream_key(key: str) -> None:
    """``streams.<s>.<p>`` keys sparkpoint does not declare are passed to the system as the
    stream's properties, so a typo of a declared one (``event.time.feild``) would be taken for
    one and ignored: refused, with the key it is close to. Stream names may hold dots, so each
    split of the key into a name and a suffix is tried."""
    suffixes = _declared_stream_suffixes()
    parts = key.split(".")
    for i in range(2, len(parts)):
        name, suffix = ".".join(parts[1:i]), ".".join(parts[i:])
        close = difflib.get_close_matches(suffix, suffixes, n=1, cutoff=0.85)
        if close and close[0] != suffix:
            raise ConfigError(
                f"unknown config key {key}; did you mean streams.{name}.{close[0]}? (an "
                "undeclared streams.<s>.<p> key is passed to the system as a stream "
                "property; run 'sparkpoint config keys' to list sparkpoint's)"
            )
