"""The coordinator stream: a single-partition, compacted stream of the job's metadata.

Message key: compact JSON ``[version, type, key]`` (version 1). Message value: a JSON map
``{"host", "username", "source", "timestamp", "values": {...}}``; a delete is the same key with a
null value. The message *type* is the metadata namespace: ``set-config`` (job config, values
``{"value": ...}``), ``set-changelog`` (task -> changelog partition), and any namespace a
component asks for (startpoints, liveness). Bootstrapping reads from the oldest offset to the
newest; the last write per key wins and a delete removes it. A message that cannot be parsed is
an error naming the stream and offset: silently skipping it could resurrect old config.
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from collections.abc import Mapping
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.registry import Systems

VERSION = 1
SET_CONFIG = "set-config"
SET_CHANGELOG = "set-changelog"


class CorruptMetadataError(UserError):
    """A coordinator stream message that cannot be parsed."""


def coordinator_stream_name(job_name: str, job_id: str) -> str:
    return f"__coordinator-{job_name}-{job_id}"


def encode_key(namespace: str, key: str) -> bytes:
    return json.dumps([VERSION, namespace, key], separators=(",", ":")).encode()


def encode_value(values: Mapping[str, Any], source: str) -> bytes:
    message = {
        "host": socket.gethostname(),
        "username": getpass.getuser(),
        "source": source,
        "timestamp": int(time.time() * 1000),
        "values": dict(values),
    }
    return json.dumps(message, separators=(",", ":"), sort_keys=True).encode()


def decode(rec: Record, where: str) -> tuple[str, str, dict[str, Any] | None]:
    """(namespace, key, message or None for a delete) of one coordinator stream record."""
    try:
        version, namespace, key = json.loads(rec.key or b"")
        if version != VERSION:
            raise ValueError(f"unknown key version {version!r}")
        message = None if rec.value is None else json.loads(rec.value)
        if message is not None and not isinstance(message.get("values"), dict):
            raise ValueError("value has no 'values' map")
        return str(namespace), str(key), message
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptMetadataError(f"corrupt coordinator stream message at {where}: {exc}") from exc


class CoordinatorStreamStore(MetadataStore):
    """A :class:`MetadataStore` on the job's coordinator stream; values live under ``value``."""

    def __init__(self, config: Config, systems: Systems | None = None, *, source: str = "") -> None:
        self._systems = systems or Systems(config)
        self._system = config.coordinator_system
        self.stream = coordinator_stream_name(config.job_name, config.job_id)
        self._ssp = SystemStreamPartition(self._system, self.stream, 0)
        self._admin = self._systems.admin(self._system)
        self._source = source or "sparkpoint"
        self._data: dict[str, dict[str, dict[str, Any]]] = {}
        self._next: str | None = None
        self._producer = self._systems.producer(self._system)
        self._admin.create_stream(StreamSpec(self.stream, 1, compacted=True))
        self.refresh()

    def refresh(self) -> None:
        meta = self._admin.get_metadata([self._ssp])[self._ssp]
        start = self._next or meta.oldest
        if self._admin.offset_comparator(start, meta.upcoming) < 0:
            consumer = self._systems.consumer(self._system)
            try:
                for rec in consumer.read(self._ssp, start, meta.upcoming):
                    namespace, key, message = decode(rec, f"{self._ssp} offset {rec.offset}")
                    if message is None:
                        self._data.get(namespace, {}).pop(key, None)
                    else:
                        self._data.setdefault(namespace, {})[key] = message
            finally:
                consumer.close()
        self._next = meta.upcoming

    def message(self, namespace: str, key: str) -> dict[str, Any] | None:
        """The whole message last written for a key (with host, source, timestamp)."""
        return self._data.get(namespace, {}).get(key)

    def get(self, namespace: str, key: str) -> str | None:
        message = self.message(namespace, key)
        if message is None:
            return None
        value = message["values"].get("value")
        return None if value is None else str(value)

    def put(self, namespace: str, key: str, value: str) -> None:
        self.put_all(namespace, {key: value})

    def delete(self, namespace: str, key: str) -> None:
        self.put_all(namespace, {key: None})

    def put_all(self, namespace: str, entries: Mapping[str, str | None]) -> None:
        for key, value in entries.items():
            if value is None:
                self._producer.send(self.stream, 0, Record("", encode_key(namespace, key), None, 0))
                self._data.get(namespace, {}).pop(key, None)
            else:
                raw = encode_value({"value": value}, self._source)
                ts = int(time.time() * 1000)
                self._producer.send(self.stream, 0, Record("", encode_key(namespace, key), raw, ts))
                self._data.setdefault(namespace, {})[key] = json.loads(raw)
        self.flush()

    def all(self, namespace: str) -> dict[str, str]:
        return {
            k: str(m["values"].get("value"))
            for k, m in self._data.get(namespace, {}).items()
            if m["values"].get("value") is not None
        }

    def namespaces(self) -> list[str]:
        return sorted(ns for ns, entries in self._data.items() if entries)

    def flush(self) -> None:
        """Make our writes durable, then catch up with every writer (ours included)."""
        self._producer.flush()
        self.refresh()

    def close(self) -> None:
        self._producer.close()
