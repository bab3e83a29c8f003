"""Job-level helpers over the configured systems, for the driver and the tools alike: the job
model (which task reads which partitions), creating an output stream, and key partitioning."""

from __future__ import annotations

from sparkpoint.config import Config
from sparkpoint.model import JobModel, SystemStream, group_by_partition
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems


def job_model(config: Config, systems: Systems) -> JobModel:
    """The job's tasks: one per input partition number, each also reading broadcast inputs."""
    inputs, shared = systems.job_inputs(config.inputs, config.broadcast_inputs)
    return group_by_partition(config.job_name, config.job_id, inputs, shared)


def ensure_stream(config: Config, systems: Systems, stream: SystemStream) -> int:
    """Create ``stream`` if absent (with its configured partition count); return its count."""
    admin = systems.admin(stream.system)
    if stream.stream not in admin.list_streams():
        partitions = int(config.stream_key(stream, "partitions") or "1")
        admin.create_stream(StreamSpec(stream.stream, partitions))
    return admin.partition_count(stream.stream)
