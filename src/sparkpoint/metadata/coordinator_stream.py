"""The coordinator stream: a single-partition, compacted stream of the job's metadata.

Samza's wire format, so a job moved from Samza reads its existing coordinator topic:

* key: compact JSON ``[1, namespace, key]``; a delete is the key with a null value; the last
  write per key wins when the stream is bootstrapped (read from oldest to newest);
* value in the ``set-*`` namespaces (Samza's message types: ``set-config``, ``set-changelog``,
  ``set-container-host-assignment``, ...): the JSON envelope ``{"host", "source", "values",
  "username", "timestamp"}`` whose ``values`` map holds the value under the type's field
  (``value`` for config, ``Partition`` for changelog mappings; :data:`VALUE_FIELDS`);
* value in any other namespace (startpoints, sparkpoint's liveness and batch log): the raw
  UTF-8 bytes of the value, as Samza's metadata store writes them. Messages written by earlier
  sparkpoint versions, which wrapped every value in the envelope, are read too.

A message whose key is not a ``[1, namespace, key]`` triple (another tool's, a newer version's)
is skipped with a WARNING; a ``set-*`` message whose value cannot be parsed is a
:class:`CorruptMetadataError` naming the stream and offset, since skipping it could resurrect an
older value.
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from sparkpoint.config import Config
from sparkpoint.errors import SparkpointError, UserError, first_line
from sparkpoint.metadata.base import MetadataStore
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.system.retry import retry_transient
from sparkpoint.system.streams import create_or_validate, stream_spec

VERSION = 1
SET_CONFIG = "set-config"
SET_CHANGELOG = "set-changelog"
#: the field of ``values`` that holds the value, per Samza message type (others: ``value``)
VALUE_FIELDS = {
    SET_CONFIG: "value",
    SET_CHANGELOG: "Partition",
    "set-container-host-assignment": "host",
    "set-task-container-assignment": "containerId",
    "set-task-mode-assignment": "taskMode",
    "set-task-partition-assignment": "taskNames",
    "set-execution-env-container-id-mapping": "execution-env-container-id",
    "set-job-coordinator-metadata": "meta-key",
}
log = logging.getLogger(__name__)


def enveloped(namespace: str) -> bool:
    """Whether values of ``namespace`` are wrapped in Samza's message envelope."""
    return namespace.startswith("set-")


class MetadataStreamError(UserError):
    """The coordinator stream could not be read or written (after retries)."""


class CorruptMetadataError(UserError):
    """A coordinator stream message that cannot be parsed."""


def coordinator_stream_name(job_name: str, job_id: str) -> str:
    return f"__coordinator-{job_name}-{job_id}"


def encode_key(namespace: str, key: str) -> bytes:
    return json.dumps([VERSION, namespace, key], separators=(",", ":")).encode()


def encode_value(namespace: str, value: str, source: str) -> bytes:
    """The message value Samza writes for ``value`` in ``namespace``."""
    if not enveloped(namespace):
        return value.encode()
    message = {
        "host": socket.gethostname(),
        "source": source,
        "values": {VALUE_FIELDS.get(namespace, "value"): value},
        "username": getpass.getuser(),
        "timestamp": int(time.time() * 1000),
    }
    return json.dumps(message, separators=(",", ":")).encode()


def _legacy_envelope(raw: bytes) -> str | None:
    """The value of an envelope an earlier sparkpoint wrote in a raw namespace, if it is one."""
    if not raw.startswith(b"{"):
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    values = data.get("values") if isinstance(data, dict) else None
    if isinstance(values, dict) and {"host", "source", "timestamp"} <= set(data):
        value = values.get("value")
        return None if value is None else str(value)
    return None


def decode_key(rec: Record, where: str) -> tuple[str, str] | None:
    """(namespace, key) of a record, or None (with a WARNING) for a key that is not ours."""
    try:
        version, namespace, key = json.loads(rec.key or b"")
        if version != VERSION:
            raise ValueError(f"unknown key version {version!r}")
        return str(namespace), str(key)
    except (ValueError, TypeError) as exc:
        log.warning("skipping a foreign coordinator stream message at %s: %s", where, exc)
        return None


def decode_value(namespace: str, raw: bytes, where: str) -> dict[str, Any] | None:
    """The message of a record's value: the envelope (``values["value"]`` holds the value), or
    None (with a WARNING) for a raw value that is not UTF-8."""
    if not enveloped(namespace):
        legacy = _legacy_envelope(raw)
        if legacy is not None:
            return {"values": {"value": legacy}}
        try:
            return {"values": {"value": raw.decode()}}
        except UnicodeDecodeError:
            log.warning("skipping a non-UTF-8 value in namespace %s at %s", namespace, where)
            return None
    try:
        message = json.loads(raw)
        values = message.get("values")
        if not isinstance(values, dict):
            raise ValueError("value has no 'values' map")
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptMetadataError(f"corrupt coordinator stream message at {where}: {exc}") from exc
    field = VALUE_FIELDS.get(namespace, "value")
    if "value" not in values and field in values:
        values["value"] = values[field]
    return dict(message)


class CoordinatorStreamStore(MetadataStore):
    """A :class:`MetadataStore` on the job's coordinator stream (see the module docstring)."""

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
        spec = stream_spec(config, SystemStream(self._system, self.stream), 1, compacted=True)
        create_or_validate(self._admin, spec)
        self.refresh()

    def refresh(self) -> None:
        """Read what was written since the last refresh (transient faults retried)."""
        self._retried("reading", self._refresh)

    def _retried(self, doing: str, fn: Callable[[], None]) -> None:
        """``fn()`` with transient faults retried; one that persists, or any other fault of
        the system, is a :class:`MetadataStreamError` naming the stream and what to fix."""
        try:
            retry_transient(f"{doing} {self._ssp}", fn)
        except SparkpointError:
            raise
        except Exception as exc:
            raise self._failed(doing, exc) from exc

    def _send(self, record: Record) -> None:
        """Buffer one record (not retried: a second send would write it twice)."""
        try:
            self._producer.send(self.stream, 0, record)
        except SparkpointError:
            raise
        except Exception as exc:
            raise self._failed("writing", exc) from exc

    def _failed(self, doing: str, exc: Exception) -> MetadataStreamError:
        return MetadataStreamError(
            f"coordinator stream {self._ssp}: {doing} the job's metadata failed "
            f"({type(exc).__name__}: {first_line(exc)}); the job stops here, and what it "
            f"has committed is intact: fix system {self._system} (its disk, permissions "
            "or server), then run again"
        )

    def _refresh(self) -> None:
        meta = self._admin.get_metadata([self._ssp])[self._ssp]
        start = self._next or meta.oldest
        if self._admin.offset_comparator(start, meta.upcoming) < 0:
            consumer = self._systems.consumer(self._system)
            try:
                for rec in consumer.read(self._ssp, start, meta.upcoming):
                    self._apply(rec)
            finally:
                consumer.close()
        self._next = meta.upcoming

    def _apply(self, rec: Record) -> None:
        where = f"{self._ssp} offset {rec.offset}"
        decoded = decode_key(rec, where)
        if decoded is None:
            return
        namespace, key = decoded
        if rec.value is None:
            self._data.get(namespace, {}).pop(key, None)
            return
        message = decode_value(namespace, rec.value, where)
        if message is not None:
            self._data.setdefault(namespace, {})[key] = message

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
                self._send(Record("", encode_key(namespace, key), None, 0))
                self._data.get(namespace, {}).pop(key, None)
            else:
                raw = encode_value(namespace, value, self._source)
                ts = int(time.time() * 1000)
                self._send(Record("", encode_key(namespace, key), raw, ts))
                message = decode_value(namespace, raw, "a write")
                if message is not None:
                    self._data.setdefault(namespace, {})[key] = message
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
        """Make our writes durable, then catch up with every writer (ours included); transient
        faults are retried."""
        self._retried("writing", self._producer.flush)
        self.refresh()

    def close(self) -> None:
        try:
            self._retried("writing", self._producer.flush)
        finally:
            self._producer.close()
