"""``sparkpoint dlq ...``: list the dead-letter stream's letters and replay them
(:mod:`sparkpoint.tools.dlq`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from sparkpoint.cli.app import JobArg, SetOpt, dlq_app, err, job_config

WhereOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        "-w",
        help="Only letters with NAME=VALUE: reason (decode, process), stream, partition, "
        "error (the class, e.g. builtins.ValueError) or task (repeatable: all must hold).",
    ),
]


@dlq_app.command("show")
def dlq_show(
    job: JobArg,
    where: WhereOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per letter.")] = False,
    set_: SetOpt = None,
) -> None:
    """List the dead letters: the records the job's tasks could not decode or process
    (task.dlq.stream, task.dlq.on), with where each came from and what went wrong.

    Example: `sparkpoint dlq show job.yaml --where reason=decode`
    """
    from sparkpoint.tools.dlq import chosen, parse_where, read_dead_letters

    config = job_config(job, set_)
    letters = chosen(read_dead_letters(config), parse_where(where or []))
    for letter in letters:
        row = letter.row()
        if as_json:
            typer.echo(json.dumps(row))
        else:
            typer.echo(
                f"{row['letter']}  {row['reason']:7}  {row['source']} offset {row['offset']}: "
                f"{row['error']}" + (f" (at {row['at']})" if row["at"] else "")
            )
    n = len(letters)
    err.print(f"{n} dead letter{'' if n == 1 else 's'}", highlight=False)


@dlq_app.command("replay")
def dlq_replay(
    job: JobArg,
    to: Annotated[
        str | None,
        typer.Option(help="Write them to this stream (system.stream) instead of their source."),
    ] = None,
    where: WhereOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be written; write nothing.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Write chosen dead letters' records back, their key and value as they arrived: to the
    partition of their source stream they came from, or to --to (placed by key). Each letter
    is replayed once: a later replay skips those it wrote (recorded in the coordinator stream).
    Fix what failed first (the task, the schema), or the records fail again.

    Example: `sparkpoint dlq replay job.yaml --where reason=process`
    """
    from sparkpoint.tools.dlq import parse_where, replay

    config = job_config(job, set_)
    report = replay(config, to=to, where=parse_where(where or []), dry_run=dry_run)
    verb = "would write" if dry_run else "wrote"
    written = ", ".join(f"{n} to {s}" for s, n in report.written.items()) or "nothing"
    err.print(f"{verb} {written}; {report.skipped} replayed before, skipped", highlight=False)
