"""Job configuration: loading job files, overrides, validation and typed views.

A job file is YAML (nested mappings flatten to Samza-style dotted names; lists join with commas)
or Java-style ``.properties``. ``--set key=value`` overrides win over the file. Every key sparkpoint
reads is declared once in :data:`KEYS` with its default, what is allowed and a line of help; a bad
value, or an unknown key in a namespace sparkpoint owns (``job.``, ``task.``, ``stores.<s>.``,
``streams.<s>.``), is a :class:`ConfigError` naming the key and what is allowed. Keys under
``systems.<s>.`` beyond the ones declared are passed to the system; ``spark.*`` go to Spark.

Every path a job uses derives from ``job.data.dir`` (default ``.sparkpoint/<job.name>`` next to
the job file), made absolute when the config is loaded so that executors on other processes see
the same paths. A relative path in a job file is relative to the job file's directory; one given
with ``--set`` (or with no job file) to the current directory.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream
from sparkpoint.serde import BUILTIN_SERDES


@dataclass(frozen=True)
class ConfigKey:
    """A declared key: ``pattern`` may hold ``<s>`` for a store, system or stream name."""

    pattern: str
    default: str | None
    allowed: str
    help: str
    check: Callable[[str], bool] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        return _pattern_regex(self.pattern)


@functools.cache
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A key pattern as a regex, built once per pattern (key lookups run in every batch)."""
    return re.compile("^" + re.escape(pattern).replace("<s>", r"[^.]+(?:\.[^.]+)*?") + "$")


#: what a serde key allows: the built-in serdes, or one registered in config
SERDE_NAMES = (
    " | ".join(BUILTIN_SERDES) + ", or a name registered as serializers.registry.<name>.class"
)


def _int(minimum: int | None = None) -> Callable[[str], bool]:
    def check(v: str) -> bool:
        try:
            n = int(v)
        except ValueError:
            return False
        return minimum is None or n >= minimum

    return check


def _one_of(*choices: str) -> Callable[[str], bool]:
    return lambda v: v in choices


def _bool(v: str) -> bool:
    return v.lower() in ("true", "false")


KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "job.name",
        None,
        "a name of letters, digits, '-', '_'",
        "the job's name",
        lambda v: bool(re.fullmatch(r"[A-Za-z0-9_-]+", v)),
    ),
    ConfigKey(
        "job.id",
        "1",
        "a name of letters, digits, '-', '_'",
        "instance id of the job",
        lambda v: bool(re.fullmatch(r"[A-Za-z0-9_-]+", v)),
    ),
    ConfigKey(
        "job.data.dir",
        None,
        "a directory path",
        "root of every path the job uses (default .sparkpoint/<job.name> next to the job file; "
        "relative paths in a job file are relative to its directory)",
    ),
    ConfigKey(
        "job.logged.store.base.dir",
        None,
        "a directory path",
        "where executors keep store directories (default <job.data.dir>/state; {cwd} = the "
        "executor's working directory, private per executor)",
    ),
    ConfigKey(
        "job.host-affinity.enabled",
        "true",
        "true | false",
        "on a Spark cluster, run each task on the executor that holds its state (Samza's host "
        "affinity); the assignment is kept in the metadata store",
        _bool,
    ),
    ConfigKey(
        "job.host-affinity.rebalance",
        "false",
        "true | false",
        "move tasks from the busiest executors to idle ones (a new executor) until task "
        "counts differ by at most one; moved tasks restore there (sparkpoint run --rebalance)",
        _bool,
    ),
    ConfigKey(
        "job.coordinator.system",
        None,
        "a configured system name",
        "system of the coordinator and checkpoint streams (default: first system)",
    ),
    ConfigKey(
        "job.spark.class.archive",
        "true",
        "true | false",
        "start the Spark driver JVM with the class-data-sharing archive made at install "
        "(python -m sparkpoint.runtime.jvm_archive), when there is one: seconds off every start",
        _bool,
    ),
    ConfigKey(
        "job.spark.driver.quick.jit",
        "true",
        "true | false",
        "in local mode, run the Spark driver JVM with its quick (C1) JIT compiler only "
        "(-XX:TieredStopAtLevel=1): Spark starts about 0.8 s sooner; the JVM only schedules "
        "and moves small plans there. Never applied on a cluster",
        _bool,
    ),
    ConfigKey(
        "job.restore.while.spark.starts",
        "true",
        "true | false",
        "in local mode, restore every task's state in the driver while the Spark session "
        "starts (the driver shares the executors' disk), so a restart is back in about the "
        "longer of the two instead of their sum; on a cluster the executors restore",
        _bool,
    ),
    ConfigKey(
        "job.executor.log.level",
        "WARNING",
        "DEBUG | INFO | WARNING | ERROR",
        "log level of sparkpoint on the executors",
        _one_of("DEBUG", "INFO", "WARNING", "ERROR"),
    ),
    ConfigKey("task.inputs", None, "comma-separated system.stream names", "input streams"),
    ConfigKey(
        "metrics.reporters",
        None,
        "comma-separated: prometheus, snapshot",
        "where the driver reports job and task metrics (docs/operations.md)",
    ),
    ConfigKey(
        "metrics.reporter.prometheus.host",
        "127.0.0.1",
        "a host or address",
        "address the Prometheus text endpoint listens on (0.0.0.0: every interface)",
    ),
    ConfigKey(
        "metrics.reporter.prometheus.port",
        "9464",
        "a port",
        "port of the Prometheus text endpoint, http://<host>:<port>/metrics",
        _int(0),
    ),
    ConfigKey(
        "metrics.reporter.snapshot.stream",
        None,
        "system.stream",
        "stream of Samza-style metrics snapshots (default <coordinator system>.metrics)",
    ),
    ConfigKey(
        "metrics.reporter.snapshot.interval.ms",
        "60000",
        "milliseconds >= 0",
        "how often a metrics snapshot is written (and once when the job stops)",
        _int(0),
    ),
    ConfigKey(
        "task.broadcast.inputs",
        None,
        "comma-separated system.stream, system.stream#N or system.stream#[A-B]",
        "streams (or partitions) every task consumes in full",
    ),
    ConfigKey(
        "task.startpoint.max.age.ms",
        "43200000",
        "an integer >= 0 (milliseconds)",
        "startpoints older than this are ignored with a warning",
        _int(0),
    ),
    ConfigKey(
        "task.class",
        None,
        "module:Class or module.Class of a StreamTask",
        "the low-level task class",
    ),
    ConfigKey(
        "task.commit.ms",
        "60000",
        "an integer >= 0 (milliseconds)",
        "commit at the end of a batch when this long has passed since the last",
        _int(0),
    ),
    ConfigKey(
        "task.ignored.exceptions",
        None,
        "comma-separated exception class names (ValueError, mymod.MyError) or *",
        "exceptions from process() that skip the message (logged) instead of failing the job",
    ),
    ConfigKey(
        "task.drop.deserialization.errors",
        "false",
        "true | false",
        "skip (and log) input messages that cannot be decoded instead of failing the job",
        _bool,
    ),
    ConfigKey(
        "task.window.ms",
        "-1",
        "an integer (milliseconds; -1 disables)",
        "call window() on tasks this often",
        _int(-1),
    ),
    ConfigKey(
        "task.checkpoint.system",
        None,
        "a configured system name",
        "system of the checkpoint stream (default: job.coordinator.system)",
    ),
    ConfigKey(
        "task.checkpoint.write.versions",
        "1,2",
        "a list of versions from 1, 2",
        "checkpoint versions written at every commit",
    ),
    ConfigKey(
        "task.checkpoint.read.versions",
        "2,1",
        "a list of versions from 1, 2 (by priority)",
        "checkpoint versions read at start, in priority order (Samza's default is 1; V1 "
        "checkpoints carry no blob-store markers)",
    ),
    ConfigKey(
        "task.live.checkpoint.max.age",
        "600000",
        "an integer >= 0 (milliseconds)",
        "a lower-priority checkpoint this much newer than the preferred one wins",
        _int(0),
    ),
    ConfigKey(
        "task.batch.max.messages",
        "10000",
        "an integer >= 1",
        "most messages read from one partition in one micro-batch",
        _int(1),
    ),
    ConfigKey(
        "task.poll.interval.ms",
        "500",
        "an integer >= 0 (milliseconds)",
        "pause between batches when no input is waiting",
        _int(0),
    ),
    ConfigKey(
        "task.shutdown.ms",
        "30000",
        "an integer >= 0 (milliseconds)",
        "how long a shutdown may wait for the current batch",
        _int(0),
    ),
    ConfigKey(
        "systems.<s>.factory",
        None,
        "filelog, or module:Class of a SystemFactory",
        "the system's implementation",
    ),
    ConfigKey(
        "systems.<s>.default.stream.samza.offset.default",
        "oldest",
        "oldest | upcoming",
        "where to start a partition with no checkpoint",
        _one_of("oldest", "upcoming"),
    ),
    ConfigKey(
        "systems.<s>.default.stream.partitions",
        "1",
        "an integer >= 1",
        "partition count of streams the job creates in this system",
        _int(1),
    ),
    ConfigKey(
        "streams.<s>.samza.offset.default",
        None,
        "oldest | upcoming",
        "overrides the system default for this stream",
        _one_of("oldest", "upcoming"),
    ),
    ConfigKey(
        "streams.<s>.samza.reset.offset",
        "false",
        "true | false",
        "ignore this stream's checkpointed offsets at start",
        _bool,
    ),
    ConfigKey(
        "streams.<s>.samza.key.serde",
        "string",
        SERDE_NAMES,
        "serde of message keys in this stream",
    ),
    ConfigKey(
        "streams.<s>.samza.msg.serde",
        "json",
        SERDE_NAMES,
        "serde of message values in this stream",
    ),
    ConfigKey(
        "streams.<s>.partitions",
        None,
        "an integer >= 1",
        "partition count when the stream is created",
        _int(1),
    ),
    ConfigKey(
        "streams.<s>.<property>",
        None,
        "a value",
        "any other key (not samza.*) is a property the system creates the stream with, e.g. "
        "Kafka's retention.ms; systems.<s>.default.stream.<property> sets it for every stream",
    ),
    ConfigKey("stores.<s>.factory", None, "rocksdb | in-memory", "the store's engine"),
    ConfigKey("stores.<s>.key.serde", "string", SERDE_NAMES, "serde of the store's keys"),
    ConfigKey("stores.<s>.msg.serde", "json", SERDE_NAMES, "serde of the store's values"),
    ConfigKey(
        "stores.<s>.changelog",
        None,
        "system.stream",
        "changelog stream of the store (used by the changelog backend)",
    ),
    ConfigKey(
        "stores.<s>.write.batch.size",
        "10000",
        "an integer >= 1",
        "writes wait for a commit, a range or all scan, a flush, or this many distinct keys; "
        "then only the newest value of each key is written to the store and logged to its "
        "changelog, in one batch, as Samza's CachedStore does; reads see waiting writes",
        _int(1),
    ),
    ConfigKey(
        "stores.<s>.changelog.restore.accept.loss",
        "false",
        "true | false",
        "restore what a changelog that is missing, recreated or shorter than the checkpointed "
        "offset still holds, losing committed writes, instead of stopping the job; set it "
        "once, deliberately, after the error names the store",
        _bool,
    ),
    ConfigKey(
        "stores.<s>.changelog.min.compaction.lag.ms",
        "14400000",
        "milliseconds >= 0",
        "with transactional state, the changelog's records stay uncompacted this long "
        "(Kafka topic config min.compaction.lag.ms, 4 h) so that a restore can trim writes "
        "made after the last checkpoint; set it above the longest time between commits",
        _int(0),
    ),
    ConfigKey(
        "stores.<s>.clean.on.container.start",
        "false",
        "true | false",
        "at every job start, delete the store's local state and restore it from its backend",
        _bool,
    ),
    ConfigKey(
        "stores.<s>.backup.factories",
        None,
        "comma-separated backend names (changelog, blobstore, or registered ones)",
        "backends every commit backs the store up to (several = dual commit)",
    ),
    ConfigKey(
        "stores.<s>.restore.factories",
        None,
        "comma-separated backend names, preferred first",
        "backends the store may be restored from (default: the backup factories)",
    ),
    ConfigKey(
        "task.transactional.state.checkpoint.enabled",
        "true",
        "true | false",
        "restore state to exactly its checkpoint (true) or to the newest changelog entry",
        _bool,
    ),
    ConfigKey(
        "task.transactional.state.retain.existing.state",
        "false",
        "true | false",
        "with no checkpointed changelog offset, restore the whole changelog (true) instead of "
        "trimming it (Samza's default is true)",
        _bool,
    ),
    ConfigKey(
        "task.commit.max.delay.ms",
        "60000",
        "an integer >= 0 (milliseconds)",
        "skip a commit while the previous upload has run less than this; then wait for it",
        _int(0),
    ),
    ConfigKey(
        "task.commit.timeout.ms",
        "1800000",
        "an integer >= 1 (milliseconds)",
        "fail the task when a commit waits longer than this for the previous upload",
        _int(1),
    ),
    ConfigKey(
        "task.commit.skip.commit.during.failures.enabled",
        "false",
        "true | false",
        "log and skip failed or timed-out commits (up to the limits below) instead of failing",
        _bool,
    ),
    ConfigKey(
        "task.commit.skip.commit.exception.max.limit",
        "5",
        "an integer >= 0",
        "with skipping on: fail after more than this many successive failed commits",
        _int(0),
    ),
    ConfigKey(
        "task.commit.skip.commit.timeout.max.limit",
        "2",
        "an integer >= 0",
        "with skipping on: fail after more than this many successive commit timeouts",
        _int(0),
    ),
    ConfigKey(
        "task.commit.async.enabled",
        "true",
        "true | false",
        "upload while processing continues (true), or wait for uploads inside the batch",
        _bool,
    ),
    ConfigKey(
        "blob.store.url",
        None,
        "an fsspec URL: file://, s3://, abfs://, gs://, ...",
        "where the blob store backend keeps snapshots (default file://<job.data.dir>/blobs)",
    ),
    ConfigKey(
        "blob.store.manager.factory",
        "fsspec",
        "fsspec | module:function",
        "the blob store manager (fsspec serves every URL; a function (config, url) for others)",
        lambda v: v == "fsspec" or bool(re.fullmatch(r"[\w.]+:\w+", v)),
    ),
    ConfigKey(
        "blob.store.ttl.ms", "86400000", "an integer >= 1", "life of unadopted uploads", _int(1)
    ),
    ConfigKey(
        "blob.store.max.retries", "5", "an integer >= 0", "retries of a blob operation", _int(0)
    ),
    ConfigKey(
        "blob.store.retry.max.duration.ms", "60000", "an integer >= 0", "retry budget", _int(0)
    ),
    ConfigKey(
        "blob.store.retry.backoff.ms", "100", "an integer >= 0", "first retry backoff", _int(0)
    ),
    ConfigKey(
        "blob.store.sst.checksum.skip",
        "true",
        "true | false",
        "compare immutable .sst files by name, size and permissions only",
        _bool,
    ),
    ConfigKey("serializers.registry.<s>.class", None, "module:Class of a Serde", "a user serde"),
)

_OWNED_PREFIXES = ("job.", "task.", "stores.", "streams.", "metrics.", "blob.store.")


def _is_stream_property(key: str) -> bool:
    """``streams.<s>.<p>`` other than sparkpoint's ``samza.*`` ones: a property the system
    creates the stream with (see :meth:`Config.stream_properties`)."""
    return key.startswith("streams.") and ".samza." not in key and key.count(".") >= 2


def _declared(key: str, extra: tuple[ConfigKey, ...] = ()) -> ConfigKey | None:
    for spec in (*KEYS, *extra):
        if spec.regex.match(key):
            return spec
    return None


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
        for ep in entry_points(group=group):
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


_SECRET = re.compile(
    r"secret|password|passwd|token|credential|connection[_.]?string|account[_.]?key|sas|(^|[._])key$",
    re.I,
)


def redact(key: str, value: str) -> str:
    """``value``, or a mask when ``key`` names a credential (for logs and printed config)."""
    if key.startswith(("blob.store.options.", "systems.", "spark.")) and _SECRET.search(key):
        return "****" if value else value
    return value


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
            spec = _declared(key) or _declared(key, self.plugin_keys)
            return default if default is not None else (spec.default if spec else None)
        return value

    def require(self, key: str) -> str:
        value = self.get_str(key)
        if value is None:
            spec = _declared(key)
            what = f" ({spec.allowed}: {spec.help})" if spec else ""
            raise ConfigError(f"missing required config key {key}{what}")
        return value

    def _spec(self, key: str) -> ConfigKey | None:
        """The declaration of ``key``; with ``SPARKPOINT_STRICT_KEYS`` set (the test suite
        sets it), reading a key nobody declared is an error, so no default lives at a call
        site."""
        spec = _declared(key) or _declared(key, self.plugin_keys)
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
        return [SystemStream.parse(s) for s in self.get_list("task.inputs")]

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
            spec = _declared(key) or _declared(key, self.plugin_keys)
            if spec is None:
                passed_on = _is_stream_property(key) or key.startswith("blob.store.options.")
                if key.startswith(_OWNED_PREFIXES) and not passed_on:
                    self._unknown(key)
                continue
            if spec.check is not None and value != "" and not spec.check(value):
                raise ConfigError(f"{key}={value!r} is invalid; allowed: {spec.allowed}")
        for store, key in self._stores_without_factory():
            raise ConfigError(
                f"{key} names store {store}, which has no stores.{store}.factory "
                f"(rocksdb or in-memory)"
            )
        systems = set(self.systems)
        for ss_text in self.get_list("task.inputs"):
            ss = SystemStream.parse(ss_text)
            if ss.system not in systems:
                known = ", ".join(sorted(systems)) or "none"
                raise ConfigError(
                    f"task.inputs: system {ss.system!r} of {ss_text!r} is not configured "
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


def load_config(
    job_file: str | Path | None,
    overrides: Mapping[str, str] | None = None,
    *,
    base: Mapping[str, str] | None = None,
) -> Config:
    """Load a job file (or start from ``base``), apply overrides and defaults, validate.

    Paths (``job.data.dir``, ``systems.<s>.path``, ``job.logged.store.base.dir``) are made
    absolute: a relative one from the job file against the job file's directory, any other
    against the current directory. ``job.data.dir`` defaults to ``.sparkpoint/<job.name>`` in
    the job file's directory (the current one without a job file).
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
