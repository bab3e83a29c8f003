"""Job-level helpers over the configured systems, for the driver and the tools alike: the job
model (which task reads which partitions), how a stream is created (its spec, with the job's
configured properties) or checked, creating an output stream, and a stream's serdes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkpoint.config import Config
from sparkpoint.model import JobModel, SystemStream, group_by_partition
from sparkpoint.serde import Serde, load_serde
from sparkpoint.system.base import StreamSpec, SystemAdmin
from sparkpoint.system.registry import Systems


def job_model(config: Config, systems: Systems) -> JobModel:
    """The job's tasks: one per input partition number, each also reading broadcast inputs.
    An intermediate stream the job has not created yet (it never ran) has no partitions."""
    later = [
        s
        for s in config.intermediate_streams
        if s.stream not in systems.admin(s.system).list_streams()
    ]
    streams = [s for s in config.inputs if s not in later]
    inputs, shared = systems.job_inputs(streams, config.broadcast_inputs)
    return group_by_partition(config.job_name, config.job_id, inputs, shared)


def stream_spec(
    config: Config,
    stream: SystemStream,
    partitions: int,
    *,
    compacted: bool = False,
    properties: Mapping[str, str] | None = None,
) -> StreamSpec:
    """The spec to create ``stream`` with: the configured properties of its system and of the
    stream (:meth:`Config.stream_properties`), then ``properties``, which the caller needs."""
    merged = {**config.stream_properties(stream), **(properties or {})}
    return StreamSpec(stream.stream, partitions, compacted, merged)


def create_or_validate(admin: SystemAdmin, spec: StreamSpec) -> None:
    """Create the stream ``spec`` describes, or check the one already there against it."""
    if not admin.create_stream(spec):
        admin.validate_stream(spec)


def stream_serdes(config: Config, stream: SystemStream) -> tuple[Serde[Any], Serde[Any]]:
    """The key and message serdes of ``stream`` (string keys, JSON values by default; a
    store's changelog: the store's serdes)."""
    logged = f"{stream.system}.{stream.stream}"
    dead = config.get_str("task.dlq.stream") == logged
    # a dead letter's key is the record's, as it was: bytes (its value is a JSON object)
    if dead and not _set_for(config, stream, "samza.key.serde"):
        k = "bytes"
    else:
        k = config.stream_key(stream, "samza.key.serde") or "string"
    m = config.stream_key(stream, "samza.msg.serde") or "json"
    for store in config.stores:
        if config.get_str(f"stores.{store}.changelog") == logged:  # unless set for the stream
            if not _set_for(config, stream, "samza.key.serde"):
                k = config.get_str(f"stores.{store}.key.serde") or k
            if not _set_for(config, stream, "samza.msg.serde"):
                m = config.get_str(f"stores.{store}.msg.serde") or m
                if m == "avro":  # the store's values, read with its current schema
                    key = f"stores.{store}.msg.serde"
                    msg = load_serde(m, config, key=key, store=store)
                    return load_serde(k, config, key=f"stores.{store}.key.serde"), msg
            break
    return (
        load_serde(
            k,
            config,
            key=f"streams.{stream.stream}.samza.key.serde",
            stream=(stream.system, stream.stream),
            for_keys=True,
        ),
        load_serde(
            m,
            config,
            key=f"streams.{stream.stream}.samza.msg.serde",
            stream=(stream.system, stream.stream),
        ),
    )


def _set_for(config: Config, stream: SystemStream, suffix: str) -> bool:
    keys = (f"streams.{stream.stream}.{suffix}", f"systems.{stream.system}.default.stream.{suffix}")
    return any(config.get(key) for key in keys)


def ensure_stream(
    config: Config, systems: Systems, stream: SystemStream, *, like_inputs: bool = False
) -> int:
    """Create ``stream`` if absent (with its configured partition count, else 1, or with
    ``like_inputs`` as many as the job's inputs have: a task's output); return its count."""
    admin = systems.admin(stream.system)
    if stream.stream not in admin.list_streams():
        configured = config.stream_key(stream, "partitions")
        partitions = int(configured or (input_partitions(config, systems) if like_inputs else 1))
        admin.create_stream(stream_spec(config, stream, partitions))
    return admin.partition_count(stream.stream)


def input_partitions(config: Config, systems: Systems) -> int:
    """The most partitions an existing input of the job has (1 when none exists yet)."""
    counts = [
        systems.admin(s.system).partition_count(s.stream)
        for s in config.inputs
        if s.stream in systems.admin(s.system).list_streams()
    ]
    return max(counts, default=1)
