"""Writing and reading streams as JSON lines (``{"key", "value", "timestamp"}``).

Keys and values go through the stream's serdes (``streams.<s>.samza.key.serde`` /
``samza.msg.serde``, default string keys and JSON values). A bad input line is an error naming
its line number; nothing after it is written, and everything before it is flushed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from sparkpoint.config import Config
from sparkpoint.errors import SparkpointError, StreamNotFound, UserError
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.system.base import Record, SystemAdmin
from sparkpoint.system.registry import Systems
from sparkpoint.system.retention import Trimmed, earliest, protected, retention_of, trim
from sparkpoint.system.streams import ensure_stream, stream_serdes


def _serde_error(
    what: str, stream: SystemStream, key_serde: Any, msg_serde: Any, exc: Exception
) -> UserError:
    """``what`` failed in the stream's serdes: a user error naming them and their keys."""
    return UserError(
        f"{what} with the stream's serdes ({type(key_serde).__name__} keys, "
        f"{type(msg_serde).__name__} values; streams.{stream.stream}.samza.key.serde / "
        f"msg.serde): {exc}"
    )


def resolve_stream(config: Config, name: str) -> SystemStream:
    """``system.stream``, or a bare stream name in the first input's (or coordinator's) system."""
    if "." in name:
        head = name.split(".", 1)[0]
        if head in config.systems:
            return SystemStream.parse(name)
    inputs = config.inputs
    system = inputs[0].system if inputs else config.coordinator_system
    return SystemStream(system, name)


def add_partitions(
    config: Config, systems: Systems, stream: SystemStream, partitions: int, *, force: bool = False
) -> int:
    """Grow ``stream`` to ``partitions`` partitions; the count it had. Shrinking (or keeping the
    count) is refused: a partition's records and offsets cannot be taken back.

    An input of a job with state is the job's keyed state's partitioning, whether the job ran
    or not: the grow is refused while the job runs (its tasks would go on reading the old
    partitions with the keys of the new count; the grow holds the job's heartbeat until it is
    recorded, so no driver starts in between), while it has unread input (keyed by the old
    count: once grown, no task can read it with its keys' state), unless ``force``, and while
    any job has output staged for the stream and not published (placed by the old count).
    Where each old partition ends is recorded for ``state reshard``, which moves the state to
    the new tasks, and the old count is kept for the job's next start to compare with."""
    import uuid

    from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
    from sparkpoint.metadata.job_state import INPUT_PARTITIONS, Heartbeat
    from sparkpoint.storage.reshard import growth_of, record_growth

    admin = systems.admin(stream.system)
    before = admin.partition_count(stream.stream)
    if partitions <= before:
        raise UserError(
            f"stream {stream} has {before} partitions; --partitions {partitions} would not grow "
            "it (a stream never shrinks: its partitions' records and offsets stay)"
        )
    metadata = heartbeat = None
    if stream in config.inputs and config.stores:
        heartbeat = Heartbeat(config, f"add-partitions-{uuid.uuid4().hex[:8]}")
        heartbeat.start()  # refused while a driver runs the job; no driver starts until done
    try:
        if heartbeat is not None:
            metadata = CoordinatorStreamStore(config, systems, source="add-partitions")
            if growth_of(metadata, str(stream)) is not None:
                raise UserError(
                    f"stream {stream} grew already since job {config.job_name} last ran: move "
                    f"its state to the tasks of that count first (sparkpoint state reshard "
                    f"JOB), then grow it again (records written between two growths would be "
                    f"keyed by a count no task follows)"
                )
            unread = unread_ranges(config, systems, stream)
            if unread and not force:
                raise UserError(
                    f"job {config.job_name} has not read all of {stream} yet "
                    f"({'; '.join(unread[:3])}): those records are keyed by {before} partitions, "
                    f"and once the stream grows no task could read them with their keys' state. "
                    f"Stop the producers, run the job to the end of its input (sparkpoint run "
                    f"JOB --until-caught-up), then grow it. --force grows it anyway: the job "
                    f"can then never process those records (state reshard refuses until its "
                    f"offsets are moved past them with sparkpoint checkpoint set)"
                )
            refuse_unpublished(config, systems, stream)
        refuse_staged(systems, stream, before)
        admin.add_partitions(stream.stream, partitions)
        if metadata is not None:
            ssps = [SystemStreamPartition(stream.system, stream.stream, p) for p in range(before)]
            metas = admin.get_metadata(ssps)
            ran = metadata.get(INPUT_PARTITIONS, str(stream)) is not None
            # a job that never ran has state to move only if records of the old count are
            # there, read after the grow (records sent since the check above count too)
            held = any(admin.offset_comparator(m.oldest, m.upcoming) < 0 for m in metas.values())
            if ran or held:
                upcoming = {ssp.partition: m.upcoming for ssp, m in metas.items()}
                record_growth(metadata, str(stream), before, upcoming)
                if not ran:  # its first start refuses too, as a job's that ran on the old count
                    metadata.put(INPUT_PARTITIONS, str(stream), str(before))
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        if metadata is not None:
            metadata.close()
    return before


def refuse_staged(systems: Systems, stream: SystemStream, partitions: int) -> None:
    """Refuse while any job has output staged for ``stream`` and not published (exactly-once
    output, or re-keyed records): it was placed by the stream's ``partitions``, its count
    before a growth."""
    staging = systems.admin(stream.system).output_staging()
    parts = [] if staging is None else staging.staged(stream.stream)
    if parts:
        owners = sorted({p.owner for p in parts})
        raise UserError(
            f"stream {stream} has {sum(p.records for p in parts)} records staged and not "
            f"published yet (by {', '.join(owners[:3])}{' ...' if len(owners) > 3 else ''}): "
            f"they are placed by its {partitions} partitions, and published after a growth "
            f"they would reach tasks that do not hold their keys' state. Nothing was changed. "
            f"Run the jobs that write it until their output is published (a job's next start "
            f"publishes what its last checkpoint names and discards the rest), then try again"
        )


def refuse_unpublished(
    config: Config, systems: Systems, stream: SystemStream, below: int | None = None
) -> None:
    """Refuse when the job has records staged for its intermediate ``stream`` (partitions
    numbered below ``below``, when given) that are not published yet: they were placed by the
    stream's old partition count, and published after a growth they would reach tasks that do
    not hold their keys' state."""
    if stream not in config.intermediate_streams:
        return
    from sparkpoint.storage.outputs import waiting_parts

    ssps = [s for s in systems.partitions_of([stream]) if below is None or s.partition < below]
    waiting = waiting_parts(config, systems, ssps)
    if waiting:
        listed = "; ".join(
            f"{p.records} records for partition {p.partition} staged by {p.owner}"
            for p in waiting[:3]
        )
        raise UserError(
            f"job {config.job_name} has re-keyed records waiting to be published to its "
            f"intermediate stream {stream} ({listed}{' ...' if len(waiting) > 3 else ''}): "
            f"they are placed by its old partition count. Nothing was changed. Run the job to "
            f"the end of its input first (sparkpoint run JOB --until-caught-up: it publishes "
            f"them and reads them), then try again"
        )


def unread_ranges(
    config: Config,
    systems: Systems,
    stream: SystemStream,
    *,
    below: int | None = None,
    ends: Mapping[int, str] | None = None,
) -> list[str]:
    """``SSP from offset O to E`` for each partition of ``stream`` (only those numbered below
    ``below``, when given) that the job has not read up to ``E``: the partition's end in
    ``ends``, else its upcoming offset now."""
    admin = systems.admin(stream.system)
    nxt = {
        ssp: offset
        for ssp, offset in committed_read_offsets(config, systems, stream).items()
        if below is None or ssp.partition < below
    }
    metas = admin.get_metadata(list(nxt))
    out = []
    for ssp, offset in sorted(nxt.items()):
        end = (ends or {}).get(ssp.partition) or metas[ssp].upcoming
        if admin.offset_comparator(offset, end) < 0:
            out.append(f"{ssp} from offset {offset} to {end}")
    return out


def committed_read_offsets(
    config: Config, systems: Systems, stream: SystemStream
) -> dict[SystemStreamPartition, str]:
    """For a stream the job reads (``task.inputs`` or ``task.broadcast.inputs``): each
    partition's offset the job reads next after its last checkpoint (the smallest over its
    tasks), and the oldest offset of a partition no checkpoint covers (the job has not read it
    yet); empty for a stream the job does not read."""
    from sparkpoint.checkpoint.manager import CheckpointManager

    read = {*config.inputs, *(s for s, _ in config.broadcast_inputs)}
    if stream not in read:
        return {}
    admin = systems.admin(stream.system)
    try:
        checkpoints = CheckpointManager(config, systems).read_all()
    except StreamNotFound:  # the job never ran: it has read nothing
        checkpoints = {}
    reads = [
        {
            ssp: admin.offset_after(ssp, offset)
            for ssp, offset in checkpoint.input_offsets.items()
            if ssp.system_stream == stream
        }
        for checkpoint in checkpoints.values()
    ]
    committed = earliest(reads, lambda _ssp, a, b: admin.offset_comparator(a, b))
    return protected(admin, stream, committed)


def trim_stream(
    config: Config, systems: Systems, stream: SystemStream, *, force: bool = False
) -> list[Trimmed]:
    """``sparkpoint stream trim``: apply ``stream``'s configured retention now, never past the
    job's committed offsets unless ``force`` (:mod:`sparkpoint.system.retention`)."""
    if retention_of(config, stream) is None:
        raise UserError(
            f"stream {stream} has no retention: set streams.{stream.stream}.retention.ms or "
            f"streams.{stream.stream}.retention.bytes (or systems.{stream.system}.default."
            "stream.*) in the job file, or with --set"
        )
    if systems.admin(stream.system).compacted(stream.stream):
        raise UserError(f"stream {stream} is compacted: compaction, not retention, bounds it")
    protect = committed_read_offsets(config, systems, stream)
    return trim(config, systems, [stream], protect, job=config.job_label, force=force)


def write_json_lines(
    config: Config,
    systems: Systems,
    stream: SystemStream,
    lines: Iterable[str],
    *,
    partition: int | None = None,
    batch: int = 10_000,
) -> int:
    """Append JSON-lines records to ``stream``; returns how many were written."""

    def parsed() -> Iterator[Message]:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("expected a JSON object")
                ts = int(obj.get("timestamp", time.time() * 1000))
            except (ValueError, TypeError) as exc:
                raise UserError(
                    f"stdin line {lineno}: {exc}; nothing from this line on was written"
                ) from exc
            yield Message(obj.get("value"), obj.get("key"), partition, ts)

    return send_messages(config, systems, stream, parsed(), batch=batch)


@dataclass(frozen=True)
class Message:
    """A message to write: its value and key (encoded by the stream's serdes), the partition
    (``None``: by key, as the job's output would place it) and a timestamp (ms; ``None``:
    now)."""

    value: Any
    key: Any = None
    partition: int | None = None
    timestamp: int | None = None


def send_messages(
    config: Config,
    systems: Systems,
    stream: SystemStream,
    messages: Iterable[Message],
    *,
    batch: int = 10_000,
) -> int:
    """Append ``messages`` to ``stream`` (created with its configured partition count if
    absent), encoded with the stream's serdes; returns how many were written. A write that
    fails part-way says exactly what it wrote before (per partition: how many, which
    offsets), so that a retry does not write those twice."""
    partitions = ensure_stream(config, systems, stream)
    admin = systems.admin(stream.system)
    ssps = [SystemStreamPartition(stream.system, stream.stream, p) for p in range(partitions)]
    before = {s: m.upcoming for s, m in admin.get_metadata(ssps).items()}
    try:
        return _send(config, systems, stream, messages, partitions, batch)
    except SparkpointError as exc:
        after = {s: m.upcoming for s, m in admin.get_metadata(ssps).items()}
        exc.args = (f"{exc}; {_written(before, after)}",)  # the same error, told in full
        raise


def _written(
    before: Mapping[SystemStreamPartition, str], after: Mapping[SystemStreamPartition, str]
) -> str:
    """What a failed write wrote, per partition (from the partitions' ends before and after)."""
    done = {
        s: (int(before[s]), int(after[s]))
        for s in sorted(after, key=lambda s: s.partition)
        if after[s] != before[s] and before[s].isdigit() and after[s].isdigit()
    }
    if not done:
        return "nothing was written to any partition: the same input can be written again"
    parts = ", ".join(
        f"partition {s.partition}: {b - a} (offsets {a}..{b - 1})" for s, (a, b) in done.items()
    )
    total = sum(b - a for a, b in done.values())
    return (
        f"before it stopped, {total} records were written ({parts}): a retry of the same "
        "input writes those again"
    )


def _send(
    config: Config,
    systems: Systems,
    stream: SystemStream,
    messages: Iterable[Message],
    partitions: int,
    batch: int,
) -> int:
    key_serde, msg_serde = stream_serdes(config, stream)
    admin = systems.admin(stream.system)
    producer = systems.producer(stream.system)
    count = 0
    try:
        for m in messages:
            if m.partition is not None and not 0 <= m.partition < partitions:
                raise UserError(
                    f"partition {m.partition}: {stream} has partitions 0..{partitions - 1}"
                )
            try:
                kb = None if m.key is None else key_serde.to_bytes(m.key)
                vb = None if m.value is None else msg_serde.to_bytes(m.value)
            except (ValueError, TypeError) as exc:
                what = f"message {count + 1} for {stream}: cannot encode it"
                raise _serde_error(what, stream, key_serde, msg_serde, exc) from None
            ts = int(time.time() * 1000) if m.timestamp is None else m.timestamp
            p = m.partition if m.partition is not None else admin.partition_for_key(kb, partitions)
            producer.send(stream.stream, p, Record("", kb, vb, ts))
            count += 1
            if count % batch == 0:
                producer.flush()
    finally:
        producer.close()
    return count


def _decoded(
    rec: Record, stream: SystemStream, key_serde: Any, msg_serde: Any, where: str
) -> tuple[Any, Any]:
    """A record's key and value, or an error naming ``where`` and the serdes to fix."""
    try:
        key = None if rec.key is None else key_serde.from_bytes(rec.key)
        value = None if rec.value is None else msg_serde.from_bytes(rec.value)
    except (ValueError, TypeError) as exc:
        what = f"{where}: cannot decode it"
        raise _serde_error(what, stream, key_serde, msg_serde, exc) from None
    return key, value


def read_staged_json_lines(
    config: Config, systems: Systems, stream: SystemStream, *, partition: int | None = None
) -> Iterator[dict[str, Any]]:
    """The staged output of ``stream`` (exactly-once): records no reader sees yet, each with
    its ``state`` ("staged"), ``owner`` (job and task) and ``part`` (run, batch, attempt). A
    part is published when the checkpoint naming it is written, or discarded at the job's next
    start if none does."""
    staging = systems.admin(stream.system).output_staging()
    if staging is None:
        raise UserError(f"{stream.system} cannot stage output: {stream} has no staged records")
    key_serde, msg_serde = stream_serdes(config, stream)
    for part in staging.staged(stream.stream):
        if partition is not None and part.partition != partition:
            continue
        where = f"staged part {part.owner}/{part.part} of {stream}"
        for rec in staging.read_part(stream.stream, part.partition, part.owner, part.part):
            key, value = _decoded(rec, stream, key_serde, msg_serde, where)
            yield {
                "partition": part.partition,
                "state": "staged",
                "owner": part.owner,
                "part": part.part,
                "key": key,
                "value": value,
                "timestamp": rec.timestamp,
            }


def read_json_lines(
    config: Config,
    systems: Systems,
    stream: SystemStream,
    *,
    partition: int | None = None,
    start: str | None = None,
    limit: int | None = None,
    uncommitted: bool = False,
) -> Iterator[dict[str, Any]]:
    """Records of ``stream`` (one partition or all, in partition then offset order): those
    read-committed readers read, or with ``uncommitted`` every record, with its ``state``
    (committed, open: not committed by a checkpoint yet, or aborted)."""
    admin = systems.admin(stream.system)
    if stream.stream not in admin.list_streams():
        known = ", ".join(admin.list_streams()) or "none"
        raise StreamNotFound(f"stream {stream} does not exist; streams in {stream.system}: {known}")
    n = admin.partition_count(stream.stream)
    if partition is not None and not 0 <= partition < n:
        raise UserError(f"--partition {partition}: {stream} has partitions 0..{n - 1}")
    parts = [partition] if partition is not None else list(range(n))
    key_serde, msg_serde = stream_serdes(config, stream)
    consumer = systems.consumer(stream.system, uncommitted=uncommitted)
    emitted = 0
    try:
        for p in parts:
            ssp = SystemStreamPartition(stream.system, stream.stream, p)
            if uncommitted:
                meta = admin.get_metadata([ssp])[ssp]
                state = _record_states(admin, ssp)
            else:
                meta = admin.get_committed_metadata([ssp])[ssp]
            offset = start if start is not None else meta.oldest
            while admin.offset_comparator(offset, meta.upcoming) < 0:
                records = consumer.read(ssp, offset, meta.upcoming, 10_000)
                if not records:
                    skipped = consumer.skipped_through(ssp)  # an aborted range
                    if skipped is None:
                        break
                    offset = admin.offset_after(ssp, skipped)
                    continue
                for rec in records:
                    where = f"{ssp} offset {rec.offset}"
                    key, value = _decoded(rec, stream, key_serde, msg_serde, where)
                    row = {
                        "partition": p,
                        "offset": rec.offset,
                        "key": key,
                        "value": value,
                        "timestamp": rec.timestamp,
                    }
                    if uncommitted:
                        row["state"] = state(int(rec.offset))
                    yield row
                    emitted += 1
                    if limit is not None and emitted >= limit:
                        return
                offset = admin.offset_after(ssp, records[-1].offset)
    finally:
        consumer.close()


def _record_states(admin: SystemAdmin, ssp: SystemStreamPartition) -> Callable[[int], str]:
    """Each offset's transaction state in ``ssp`` (committed, open or aborted)."""
    end = admin.committed_end(ssp)
    aborted = [(int(a), int(b)) for a, b in admin.aborted_ranges(ssp)]

    def state(offset: int) -> str:
        if any(a <= offset < b for a, b in aborted):
            return "aborted"
        return "open" if end is not None and offset >= int(end) else "committed"

    return state


def dump_json_lines(rows: Iterable[dict[str, Any]], out: TextIO) -> int:
    n = 0
    for row in rows:
        out.write(json.dumps(row, separators=(",", ":"), default=repr) + "\n")
        n += 1
    return n
