"""``sparkpoint startpoint ...``: set, list and delete startpoints
(:mod:`sparkpoint.tools.startpoints`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from sparkpoint.cli.app import JobArg, SetOpt, job_config, ran_config, startpoint_app
from sparkpoint.errors import UserError

StreamOpt = Annotated[str, typer.Option("--stream", help="Input stream name, or system.stream.")]
PartitionsOpt = Annotated[
    list[int] | None,
    typer.Option("--partition", "-p", help="Partition (repeatable; default: all)."),
]
TaskOpt = Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 2".')]


@startpoint_app.command("set")
def startpoint_set(
    job: JobArg,
    stream: StreamOpt,
    partition: PartitionsOpt = None,
    task: TaskOpt = None,
    offset: Annotated[
        str | None, typer.Option(help="Start at this offset (the next to read).")
    ] = None,
    timestamp: Annotated[
        str | None,
        typer.Option(
            help="Start at the first message at or after this time (epoch ms or ISO-8601)."
        ),
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            "--by",
            help="What --timestamp compares: event-time (the stream's event.time.field, the "
            "time its watermark and windows use; the default where the stream has one) or "
            "record-time (the record's own timestamp, as Kafka indexes it).",
        ),
    ] = None,
    oldest: Annotated[bool, typer.Option("--oldest", help="Start at the oldest message.")] = False,
    upcoming: Annotated[
        bool, typer.Option("--upcoming", help="Skip to new messages only.")
    ] = False,
    apply_now: Annotated[
        bool, typer.Option("--apply-now", help="Make a running job apply it at its next batch.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Set where an input restarts: applied at the next start (or now, with --apply-now).

    The job's checkpoints are not edited, and **state is not rewound**: stores keep what they
    hold and re-read messages are processed again on top of it. Without --partition the
    startpoint applies to every partition; with --task only to that task (broadcast inputs).
    Everything is checked against the stream before anything is written.

    Example: `sparkpoint startpoint set job.yaml --stream pageviews --timestamp 2026-11-22T10:00Z`
    """
    from sparkpoint.tools.startpoints import make_startpoint, set_startpoints

    config = job_config(job, set_)
    sp = make_startpoint(offset=offset, timestamp=timestamp, oldest=oldest, upcoming=upcoming)
    planned = set_startpoints(
        config, stream, sp, partitions=partition, task=task, apply_now=apply_now, by=by
    )
    for p in planned:
        who = f" task {p.task}" if p.task else ""
        how = f" {p.found_by}" if p.found_by else ""
        print(f"{p.ssp}{who}: {sp.describe()}{how} -> next offset {p.resolves_to} (as of now)")
    if apply_now:
        print("requested: a running job applies these at its next batch boundary")


@startpoint_app.command("list")
def startpoint_list(
    job: JobArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """List startpoints waiting for the next start, and those fanned out to tasks.

    Example: `sparkpoint startpoint list job.yaml --json`
    """
    from sparkpoint.tools.startpoints import list_startpoints

    found = list_startpoints(ran_config(job, set_))
    if as_json:
        print(
            json.dumps(
                {k: {n: sp.to_json() for n, sp in v.items()} for k, v in found.items()}, indent=2
            )
        )
        return
    for kind, entries in found.items():
        for key, sp in sorted(entries.items()):
            print(f"{kind}\t{key}\t{sp.describe()}")
    if not any(found.values()):
        print("no startpoints")


@startpoint_app.command("delete")
def startpoint_delete(
    job: JobArg,
    stream: Annotated[
        str | None, typer.Option("--stream", help="Input stream name, or system.stream.")
    ] = None,
    partition: PartitionsOpt = None,
    task: TaskOpt = None,
    all_: Annotated[
        bool,
        typer.Option("--all", help="Every startpoint and fan-out of the job, on every stream."),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Delete startpoints of a stream, or all of the job's (waiting or fanned out).

    Example: `sparkpoint startpoint delete job.yaml --stream pageviews --partition 0`

    Example: `sparkpoint startpoint delete job.yaml --all`
    """
    from sparkpoint.tools.startpoints import delete_all_startpoints, delete_startpoints

    config = job_config(job, set_)
    if all_ == (stream is not None):
        raise UserError("give either --stream (with --partition/--task) or --all")
    if all_:
        if partition or task:
            raise UserError("--all deletes every startpoint: it takes no --partition or --task")
        n = delete_all_startpoints(config)
    else:
        assert stream is not None
        n = delete_startpoints(config, stream, partitions=partition, task=task)
    print(f"deleted {n} startpoint(s)")
