"""Finding a system's implementation by name, fsspec-style.

``systems.<s>.factory`` is a registered name (built-in ``filelog``, or any name a package adds to
the ``sparkpoint.systems`` entry-point group) or ``module:Class`` of a :class:`SystemFactory`.
Implementations load lazily, so a system's dependencies are imported only when it is used.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from functools import cache

from sparkpoint.errors import ConfigError, StreamNotFound
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.refs import installed, load_reference
from sparkpoint.system.base import (
    READ_UNCOMMITTED,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
)

BUILTIN: dict[str, tuple[str, str]] = {
    "filelog": ("sparkpoint.system.filelog:FileLogSystemFactory", "built in"),
    "kafka": (
        "sparkpoint.system.kafka:KafkaSystemFactory",
        "needs confluent-kafka: pip install 'sparkpoint[kafka]'",
    ),
    **{
        name: (f"sparkpoint.system.tables.{name}:{cls}", f"{lib}: pip install 'sparkpoint[tables]'")
        for name, cls, lib in (
            ("delta", "DeltaSystemFactory", "Delta tables need deltalake"),
            ("iceberg", "IcebergSystemFactory", "Iceberg tables need pyiceberg"),
            ("postgres", "PostgresSystemFactory", "PostgreSQL tables need psycopg"),
        )
    },
}


def _load(path: str, key: str, hint: str) -> type[SystemFactory]:
    cls = load_reference(path, f"{key}={path!r}", hint=hint)
    if not (isinstance(cls, type) and issubclass(cls, SystemFactory)):
        raise ConfigError(f"{key}: {path!r} is not a SystemFactory")
    return cls


@cache
def factory_class(name: str, key: str = "systems.<s>.factory") -> type[SystemFactory]:
    """The factory class registered as ``name`` (or at ``module:Class``)."""
    if name in BUILTIN:
        path, hint = BUILTIN[name]
        return _load(path, key, hint)
    for ep in installed("sparkpoint.systems"):
        if ep.name == name:
            return _load(ep.value, key, f"from entry point {ep.name}")
    if ":" in name:
        return _load(name, key, "check the module path")
    known = sorted(set(BUILTIN) | {ep.name for ep in installed("sparkpoint.systems")})
    raise ConfigError(
        f"{key}: unknown system factory {name!r}; known: {', '.join(known)}, "
        "or module:Class of a SystemFactory"
    )


class Systems:
    """Admins, consumers and producers of every system in a config, made on first use."""

    def __init__(self, config: Mapping[str, str]) -> None:
        self._config = config
        self._factories: dict[str, SystemFactory] = {}
        self._admins: dict[str, SystemAdmin] = {}
        # made once each, also when tasks share this on threads (the driver's restore ahead)
        self._lock = threading.RLock()

    def factory(self, system: str) -> SystemFactory:
        with self._lock:
            return self._factory(system)

    def _factory(self, system: str) -> SystemFactory:
        if system not in self._factories:
            key = f"systems.{system}.factory"
            name = self._config.get(key)
            if not name:
                known = sorted(
                    k[len("systems.") : -len(".factory")]
                    for k in self._config
                    if k.startswith("systems.") and k.endswith(".factory")
                )
                raise ConfigError(
                    f"system {system!r} is not configured: set {key}; "
                    f"configured systems: {', '.join(known) or 'none'}"
                )
            self._factories[system] = factory_class(name, key)()
        return self._factories[system]

    def admin(self, system: str) -> SystemAdmin:
        with self._lock:
            if system not in self._admins:
                self._admins[system] = self._factory(system).get_admin(system, self._config)
            return self._admins[system]

    def consumer(self, system: str, *, uncommitted: bool = False) -> SystemConsumer:
        """A consumer; ``uncommitted``: one that also reads what read-committed readers do not
        (``isolation.level`` read_uncommitted: a changelog's restore, which trims it)."""
        config = self._config
        if uncommitted:
            config = {**config, f"systems.{system}.consumer.isolation.level": READ_UNCOMMITTED}
        return self.factory(system).get_consumer(system, config)

    def producer(self, system: str) -> SystemProducer:
        return self.factory(system).get_producer(system, self._config)

    def partitions_of(self, streams: Iterable[SystemStream]) -> list[SystemStreamPartition]:
        """Every partition of ``streams``; :class:`StreamNotFound` names a missing one."""
        ssps: list[SystemStreamPartition] = []
        for stream in streams:
            admin = self.admin(stream.system)
            if stream.stream not in admin.list_streams():
                known = ", ".join(admin.list_streams()) or "none"
                raise StreamNotFound(
                    f"input stream {stream} does not exist (task.inputs); streams in system "
                    f"{stream.system}: {known}. Create it with 'sparkpoint stream create'."
                )
            n = admin.partition_count(stream.stream)
            ssps.extend(SystemStreamPartition(stream.system, stream.stream, p) for p in range(n))
        return ssps

    def job_inputs(
        self,
        inputs: Iterable[SystemStream],
        broadcast: Iterable[tuple[SystemStream, set[int] | None]],
    ) -> tuple[list[SystemStreamPartition], list[SystemStreamPartition]]:
        """(input SSPs, broadcast SSPs) of a job; a missing stream or partition is named."""
        shared: list[SystemStreamPartition] = []
        for stream, parts in broadcast:
            every = self.partitions_of([stream])
            if parts is not None:
                missing = sorted(parts - {s.partition for s in every})
                if missing:
                    raise StreamNotFound(
                        f"task.broadcast.inputs: {stream} has no partition {missing[0]} "
                        f"(partitions 0..{len(every) - 1})"
                    )
                every = [s for s in every if s.partition in parts]
            shared.extend(every)
        return self.partitions_of(inputs), shared

    def close(self) -> None:
        for admin in self._admins.values():
            admin.close()
        self._admins.clear()
