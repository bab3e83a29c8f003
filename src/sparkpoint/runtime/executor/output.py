"""Output of tasks: encode, partition and send messages to their streams' producers.

A message without an explicit partition goes where its system places its serialized key
(``SystemAdmin.partition_for_key``: crc32 on filelog, murmur2 on Kafka; a key of ``None`` goes
to partition 0), so one key always lands in one partition. An output stream that
does not exist yet is created with ``streams.<s>.partitions`` or the system's default partition
count. :meth:`OutputCollector.flush` returns only when everything sent is durable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError, MessageEncodeError, OutputError, TaskError
from sparkpoint.model import SystemStream, TaskName
from sparkpoint.serde import Serde
from sparkpoint.storage.outputs import staging_of
from sparkpoint.system.base import (
    IncomingMessageEnvelope,
    OutgoingMessageEnvelope,
    RecordFields,
    SystemProducer,
    TableProducer,
    not_rows,
)
from sparkpoint.system.registry import Systems
from sparkpoint.system.staging import StagingProducer
from sparkpoint.system.streams import ensure_stream, stream_serdes

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(slots=True)
class _Route:
    """Where a stream's messages go, looked up once per stream: its encoders, partitioner and
    producer (the per-message path does no config or registry lookups)."""

    partitions: int
    key_serde: Serde[Any]
    msg_serde: Serde[Any]
    key: Callable[[Any], bytes]
    msg: Callable[[Any], bytes]
    place: Callable[[bytes | None, int], int]
    producer: SystemProducer
    #: the producer, when the stream is a table: it takes rows, not encoded records
    rows: TableProducer | None = None
    #: the last input serde :meth:`OutputCollector.forward` compared with ``msg_serde``, and
    #: whether they encode alike (a stream's messages share one serde: compared once)
    compared: tuple[Serde[Any] | None, bool] = (None, False)


def _alike(one: Serde[Any], other: Serde[Any]) -> bool:
    """Whether two serdes encode alike: the same class with the same settings (settings that
    cannot be compared count as different). A serde's settings are fixed once it is made:
    :meth:`OutputCollector.forward` compares an input's serde with a stream's once."""
    if one is other:
        return True
    try:
        return type(one) is type(other) and bool(
            getattr(one, "__dict__", {}) == getattr(other, "__dict__", {})
        )
    except Exception:  # a plugin's setting whose == raises (an array, say)
        return False


class OutputCollector:
    """The task's :class:`MessageCollector`; buffers per producer until :meth:`flush`."""

    def __init__(
        self,
        config: Config,
        systems: Systems,
        task: TaskName,
        staging: tuple[str, str] | None = None,
        staged_streams: frozenset[SystemStream] | None = None,
    ) -> None:
        self._config = config
        self._systems = systems
        self._task = task
        #: exactly-once: (owner, part) of this batch's staged output (storage.outputs)
        self._staging = staging
        #: the streams staged with ``staging`` (``None``: every one): intermediate streams only,
        #: when the job runs at-least-once
        self._staged_streams = staged_streams
        self._producers: dict[tuple[str, bool], SystemProducer] = {}
        self._routes: dict[tuple[str, str], _Route] = {}
        self.sent = 0
        #: the message being processed, set by the executor: its envelope, its bytes as read
        #: and the serde that decoded them (:meth:`forward` sends those bytes)
        self.arrived: tuple[IncomingMessageEnvelope, bytes | None, Serde[Any]] | None = None
        #: exactly-once: the part staged per (system, stream, partition), once closed
        self.staged: dict[tuple[str, str, int], str] = {}

    def _producer(self, stream: SystemStream) -> SystemProducer:
        staged = self._staged_streams is None or stream in self._staged_streams
        staging = self._staging if staged else None
        producer = self._producers.get((stream.system, staging is not None))
        if producer is None:
            if staging is None:
                producer = self._systems.producer(stream.system)
            else:
                try:
                    producer = staging_of(self._systems, stream.system).producer(*staging)
                except ConfigError as exc:
                    raise TaskError(f"task {self._task}: {exc}") from None
            self._producers[(stream.system, staging is not None)] = producer
        return producer

    def _route(self, stream: SystemStream) -> _Route:
        partitions = ensure_stream(self._config, self._systems, stream, like_inputs=True)
        key_serde, msg_serde = stream_serdes(self._config, stream)
        producer = self._producer(stream)
        route = _Route(
            partitions,
            key_serde,
            msg_serde,
            key_serde.to_bytes,
            msg_serde.to_bytes,
            self._systems.admin(stream.system).partition_for_key,
            producer,
            producer if isinstance(producer, TableProducer) else None,
        )
        self._routes[(stream.system, stream.stream)] = route
        return route

    def send(self, envelope: OutgoingMessageEnvelope) -> None:
        stream = envelope.stream
        route = self._routes.get((stream.system, stream.stream)) or self._route(stream)
        if route.rows is not None:
            self._send_rows(route.rows, stream, [envelope.message])
            return
        try:
            key = None if envelope.key is None else route.key(envelope.key)
            value = None if envelope.message is None else route.msg(envelope.message)
        except (TypeError, ValueError) as exc:
            raise self._unencodable(stream, exc) from exc
        self._put(route, stream, key, value, envelope.partition, envelope.timestamp)

    def forward(self, envelope: IncomingMessageEnvelope, stream: SystemStream, key: Any) -> None:
        """:meth:`MessageCollector.forward`: the bytes the executor read for ``envelope``
        (:attr:`arrived`) when it is the message being processed and both serdes are alike."""
        route = self._routes.get((stream.system, stream.stream)) or self._route(stream)
        if route.rows is not None:  # a table takes the message as a row
            self._send_rows(route.rows, stream, [envelope.message])
            return
        arrived = self.arrived
        as_read = arrived is not None and arrived[0] is envelope
        if as_read:
            assert arrived is not None
            serde, alike = route.compared
            if serde is not arrived[2]:
                alike = _alike(arrived[2], route.msg_serde)
                route.compared = (arrived[2], alike)
            as_read = alike
        try:
            raw_key = None if key is None else route.key(key)
            if as_read:
                assert arrived is not None
                value = arrived[1]
            else:
                value = None if envelope.message is None else route.msg(envelope.message)
        except (TypeError, ValueError) as exc:
            raise self._unencodable(stream, exc) from exc
        # stamped when sent, as send() does: an input's old timestamp on a Kafka stream would
        # have the broker's retention delete it before the next stage reads it
        self._put(route, stream, raw_key, value, None, None)

    def _put(
        self,
        route: _Route,
        stream: SystemStream,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        ts: int | None,
    ) -> None:
        if partition is None:
            partition = route.place(key, route.partitions)
        elif not 0 <= partition < route.partitions:
            raise TaskError(
                f"task {self._task}: partition {partition} of {stream} does not exist "
                f"(it has {route.partitions})"
            )
        ts = time.time_ns() // 1_000_000 if ts is None else ts
        try:  # a plain tuple, not a Record: SystemProducer.send_fields says why
            route.producer.send_fields(stream.stream, partition, ("", key, value, ts))
        except Exception as exc:
            raise self._failed(stream, partition, exc) from exc
        self.sent += 1

    def _send_rows(
        self, producer: TableProducer, stream: SystemStream, rows: Sequence[Any]
    ) -> None:
        """Rows to a table: each message a dict of column values (the envelope's key is the
        table's key columns, when it has one: not written apart)."""
        problem = not_rows(str(stream), rows)
        if problem:
            raise MessageEncodeError(f"task {self._task}: {problem}")
        try:
            producer.send_rows(stream.stream, rows)
        except Exception as exc:
            raise self._failed(stream, 0, exc) from exc
        self.sent += len(rows)

    def _unencodable(self, stream: SystemStream, exc: Exception) -> MessageEncodeError:
        return MessageEncodeError(f"task {self._task}: cannot encode message for {stream}: {exc}")

    def _failed(self, stream: SystemStream, partition: int, exc: Exception) -> OutputError:
        return OutputError(
            f"task {self._task}: sending to {stream} partition {partition} failed: "
            f"{type(exc).__name__}: {exc}"
        )

    def send_many(
        self, stream: SystemStream, keys: Sequence[Any] | None, messages: Sequence[Any]
    ) -> None:
        """Send ``messages`` (with ``keys``, one per message, or no keys) to ``stream``, each
        placed by its key, as :meth:`send` does one by one: the route is looked up once and
        the encoders run over the whole batch."""
        if keys is not None and len(keys) != len(messages):
            raise ValueError(f"{len(keys)} keys for {len(messages)} messages")
        route = self._routes.get((stream.system, stream.stream)) or self._route(stream)
        if route.rows is not None:
            self._send_rows(route.rows, stream, messages)
            return
        key_of, msg_of = route.key, route.msg
        try:
            kbs = None if keys is None else [None if k is None else key_of(k) for k in keys]
            vbs = [None if m is None else msg_of(m) for m in messages]
        except (TypeError, ValueError) as exc:
            raise self._unencodable(stream, exc) from exc
        self._send_encoded(route, stream, kbs, vbs)

    def send_arrow(self, stream: SystemStream, keys: pa.Array | None, messages: pa.Array) -> None:
        """:meth:`send_many` for Arrow columns: encoded by Arrow where the serde and type
        allow (:func:`sparkpoint.serde.arrow.encode_array`, the same bytes), value by value
        otherwise. A row's message is a struct's fields as a dict."""
        from sparkpoint.serde.arrow import encode_array  # pyarrow: only where Arrow is sent

        route = self._routes.get((stream.system, stream.stream)) or self._route(stream)
        if route.rows is not None:  # a table: the rows' columns as they are, no encoding
            self._send_table(route.rows, stream, messages)
            return
        kbs = None if keys is None else encode_array(route.key_serde, keys)
        vbs = encode_array(route.msg_serde, messages)
        if (keys is not None and kbs is None) or vbs is None:
            self.send_many(stream, None if keys is None else keys.to_pylist(), messages.to_pylist())
            return
        self._send_encoded(route, stream, kbs, vbs)

    def _send_table(self, producer: TableProducer, stream: SystemStream, rows: pa.Array) -> None:
        import pyarrow as pa

        if not pa.types.is_struct(rows.type):
            raise MessageEncodeError(
                f"task {self._task}: rows to table {stream} are a DataFrame's columns; the "
                f"value column sent is {rows.type}, not a struct (send the whole row)"
            )
        try:
            producer.send_batch(stream.stream, pa.RecordBatch.from_struct_array(rows))
        except Exception as exc:
            raise self._failed(stream, 0, exc) from exc
        self.sent += len(rows)

    def _send_encoded(
        self,
        route: _Route,
        stream: SystemStream,
        kbs: list[bytes | None] | None,
        vbs: list[bytes | None],
    ) -> None:
        """Queue encoded messages, each in its key's partition, a partition's in one call."""
        ts = time.time_ns() // 1_000_000
        if kbs is None:  # no keys: all go where the system places a key of None
            partition = route.place(None, route.partitions)
            records: list[RecordFields] = [("", None, v, ts) for v in vbs]
            try:
                route.producer.send_fields_many(stream.stream, partition, records)
            except Exception as exc:
                raise self._failed(stream, partition, exc) from exc
            self.sent += len(vbs)
            return
        place, partitions = route.place, route.partitions
        buckets: list[list[RecordFields]] = [[] for _ in range(partitions)]
        for kb, vb in zip(kbs, vbs, strict=True):
            buckets[place(kb, partitions)].append(("", kb, vb, ts))
        for partition, fields in enumerate(buckets):
            if fields:
                try:
                    route.producer.send_fields_many(stream.stream, partition, fields)
                except Exception as exc:
                    raise self._failed(stream, partition, exc) from exc
        self.sent += len(vbs)

    @property
    def staged_parts(self) -> dict[str, str]:
        """:attr:`staged` by ``system.stream.partition`` (as a batch log records them)."""
        return {f"{sys}.{stream}.{p}": part for (sys, stream, p), part in self.staged.items()}

    def flush(self) -> None:
        for producer in self._producers.values():
            producer.flush()

    def close(self) -> None:
        """Make everything sent durable: sent, or (exactly-once) staged, in :attr:`staged`."""
        for (system, _), producer in self._producers.items():
            if isinstance(producer, StagingProducer):
                for (stream, partition), part in producer.stage().items():
                    self.staged[(system, stream, partition)] = part
            producer.close()
        self._producers.clear()
        self._routes.clear()

    def abort(self) -> None:
        """The batch failed: drop what was staged but not closed (at-least-once output that
        went out already stays out; the retry sends it again)."""
        for producer in self._producers.values():
            if isinstance(producer, StagingProducer):
                producer.close()
        self._producers.clear()
        self._routes.clear()
