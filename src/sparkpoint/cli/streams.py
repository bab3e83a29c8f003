"""``sparkpoint stream ...``: create, list, grow, write, read, trim and repair streams
(:mod:`sparkpoint.tools.streams`)."""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated

import typer

from sparkpoint.cli.app import JobArg, SetOpt, err, job_config, stream_app
from sparkpoint.errors import UserError


@stream_app.command("trim")
def stream_trim(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    force: Annotated[
        bool,
        typer.Option(help="Also delete records the job has not committed (logged as an ERROR)."),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Apply a stream's retention now: drop its records older than retention.ms and those past
    the newest retention.bytes (per partition), never past what the job has committed.

    A running job does this itself for its inputs after a commit (job.retention.check.ms);
    this command is for the other streams, or for now. Kafka's broker applies its own.

    Example: `sparkpoint stream trim job.yaml pageviews --set
    streams.pageviews.retention.bytes=100000000`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import resolve_stream, trim_stream

    config = job_config(job, set_)
    ss = resolve_stream(config, stream)
    trimmed = trim_stream(config, Systems(config), ss, force=force)
    for t in trimmed:
        held = (
            f"; kept {t.held_back} offsets past retention that job {config.job_label} has not "
            "committed"
            if t.held_back
            else ""
        )
        print(f"{t.ssp}: dropped {t.dropped} records, oldest offset now {t.oldest}{held}")
    if not trimmed:
        print(f"{ss}: nothing past its retention")


@stream_app.command("create")
def stream_create(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partitions: Annotated[int, typer.Option(min=1, help="Number of partitions.")] = 1,
    compacted: Annotated[bool, typer.Option(help="Keep only the newest record per key.")] = False,
    set_: SetOpt = None,
) -> None:
    """Create a stream.

    Example: `sparkpoint stream create job.yaml pageviews --partitions 4`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.system.streams import stream_spec
    from sparkpoint.tools.streams import resolve_stream

    config = job_config(job, set_)
    ss = resolve_stream(config, stream)
    systems = Systems(config)
    spec = stream_spec(config, ss, partitions, compacted=compacted)
    created = systems.admin(ss.system).create_stream(spec)
    n = systems.admin(ss.system).partition_count(ss.stream)
    print(f"{'created' if created else 'exists'}: {ss} ({n} partitions)")


@stream_app.command("add-partitions")
def stream_add_partitions(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partitions: Annotated[int, typer.Option(min=1, help="The new partition count (more).")],
    force: Annotated[
        bool,
        typer.Option(help="Grow an input of the job even though the job has not read all of it."),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Grow a stream to more partitions (Kafka: CreatePartitions); never shrinks one.

    Keys are placed by a hash modulo the partition count, so most keys move to another
    partition. For an input of a job with state: stop the producers and run the job to the end
    of its input first (refused while the job runs or has unread input); after the grow the job
    refuses to start until `sparkpoint state reshard JOB` has moved its state to the new
    tasks: it never runs with a key's state split between tasks.

    Example: `sparkpoint stream add-partitions job.yaml pageviews --partitions 8`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import add_partitions, resolve_stream

    config = job_config(job, set_)
    ss = resolve_stream(config, stream)
    systems = Systems(config)
    try:
        before = add_partitions(config, systems, ss, partitions, force=force)
    finally:
        systems.close()
    print(f"grown: {ss} ({before} -> {partitions} partitions)")
    if ss in config.inputs and config.stores:
        from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
        from sparkpoint.storage.reshard import growth_of

        store = CoordinatorStreamStore(config, source="add-partitions")
        try:
            recorded = growth_of(store, str(ss)) is not None
        finally:
            store.close()
        if recorded:
            print(
                f"note: {ss} is an input of job {config.job_name}, which has state: it refuses "
                f"to start until its state is moved to the new tasks: sparkpoint state reshard "
                f"{job}"
            )
        else:  # a job that never ran, with nothing to read: no state to move
            print(f"note: job {config.job_name} has no state yet: it runs on {partitions} tasks")


@stream_app.command("list")
def stream_list(job: JobArg, set_: SetOpt = None) -> None:
    """List every stream of the job's systems with partitions and message counts.

    Example: `sparkpoint stream list job.yaml`
    """
    from sparkpoint.model import SystemStreamPartition
    from sparkpoint.system.registry import Systems

    config = job_config(job, set_)
    systems = Systems(config)
    for system in config.systems:
        admin = systems.admin(system)
        for name in admin.list_streams():
            n = admin.partition_count(name)
            ssps = [SystemStreamPartition(system, name, p) for p in range(n)]
            meta = admin.get_metadata(ssps)
            total = 0
            for m in meta.values():
                with contextlib.suppress(ValueError):
                    total += int(m.upcoming) - int(m.oldest)
            print(f"{system}.{name}\tpartitions={n}\tmessages={total}")


@stream_app.command("repair")
def stream_repair(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream (a filelog one).")],
    partition: Annotated[int | None, typer.Option(help="Only this partition.")] = None,
    set_: SetOpt = None,
) -> None:
    """Remove damaged records from a filelog stream, after an error named them.

    A record the log had listed may have been read, so it is never cut silently: this command
    removes each damaged record, records its offset range in the partition's `LOST` file (every
    later read over it logs the loss), and the next append continues after the highest offset
    the log ever handed out, so no reader's checkpoint can skip a new record. Run it with the
    job stopped; readers whose checkpoint lies in a removed tail resume when new records arrive.

    Example: `sparkpoint stream repair job.yaml pageviews --partition 2`
    """
    from sparkpoint.system.filelog.system import FileLogAdmin
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import resolve_stream

    config = job_config(job, set_)
    ss = resolve_stream(config, stream)
    admin = Systems(config).admin(ss.system)
    if not isinstance(admin, FileLogAdmin):
        raise UserError(f"stream repair works on filelog streams; {ss.system} is not one")
    n = admin.partition_count(ss.stream)
    partitions = range(n) if partition is None else [partition]
    removed = 0
    for p in partitions:
        for first, last in admin.repair(ss.stream, p):
            print(f"{ss}.{p}: removed damaged records {first}..{last} (offsets not reused)")
            removed += last - first + 1
    err.print(f"{ss}: {removed} damaged records removed" if removed else f"{ss}: nothing damaged")


@stream_app.command("write")
def stream_write(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partition: Annotated[
        int | None, typer.Option(help="Write every record to this partition (default: by key).")
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Append JSON lines `{"key", "value", "timestamp"}` from stdin to a stream.

    The stream is created with the job's configured partition count if it does not exist.

    Example: `echo '{"key": "u1", "value": {"n": 1}}' | sparkpoint stream write job.yaml pageviews`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import resolve_stream, write_json_lines

    config = job_config(job, set_)
    ss = resolve_stream(config, stream)
    n = write_json_lines(config, Systems(config), ss, sys.stdin, partition=partition)
    err.print(f"wrote {n} records to {ss}")


@stream_app.command("read")
def stream_read(
    job: JobArg,
    stream: Annotated[str, typer.Argument(help="Stream name, or system.stream.")],
    partition: Annotated[int | None, typer.Option(help="Only this partition.")] = None,
    from_: Annotated[str | None, typer.Option("--from", help="Start at this offset.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many records.")] = None,
    staged: Annotated[
        bool,
        typer.Option(
            "--staged",
            help="Print the staged output instead: records of exactly-once jobs waiting for "
            "the checkpoint that covers their input (each with state, owner and part).",
        ),
    ] = False,
    uncommitted: Annotated[
        bool,
        typer.Option(
            "--uncommitted",
            help="Print every record, each with its state: committed, open (an exactly-once "
            "job's changelog record that no written checkpoint covers yet) or aborted (one a "
            "restore discarded: its input was read again).",
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Print a stream's records as JSON lines (partition, offset, key, value, timestamp).

    These are the committed records: output a job with `job.processing.guarantee:
    exactly-once` staged is not in the stream until the checkpoint covering its input is
    written (`--staged` shows it), and such a job's changelog records are read once the
    checkpoint covering them is written (`--uncommitted` shows them all).

    Example: `sparkpoint stream read job.yaml user-counts --partition 0 --from 10`
    """
    from sparkpoint.system.registry import Systems
    from sparkpoint.tools.streams import (
        dump_json_lines,
        read_json_lines,
        read_staged_json_lines,
        resolve_stream,
    )

    config = job_config(job, set_)
    ss = resolve_stream(config, stream)
    if staged:
        dump_json_lines(
            read_staged_json_lines(config, Systems(config), ss, partition=partition), sys.stdout
        )
        return
    rows = read_json_lines(
        config,
        Systems(config),
        ss,
        partition=partition,
        start=from_,
        limit=limit,
        uncommitted=uncommitted,
    )
    dump_json_lines(rows, sys.stdout)
