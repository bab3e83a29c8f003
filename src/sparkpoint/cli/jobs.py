"""``sparkpoint job ...``: show where a job's tasks run and what it holds, or reset it
(:mod:`sparkpoint.tools.jobs`, :mod:`sparkpoint.tools.reset`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from sparkpoint.cli.app import JobArg, SetOpt, err, job_app, job_config, ran_config


@job_app.command("show")
def job_show(
    job: JobArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """Show each task: the executor and host it is assigned to (host affinity), its last
    checkpoint, where it committed it, its stores' size then, and whether that local state is
    current (a restart on that executor restores nothing).

    Example: `sparkpoint job show job.yaml --json`
    """
    from sparkpoint.tools.jobs import job_overview, overview_lines

    data = job_overview(ran_config(job, set_))
    if as_json:
        print(json.dumps(data, indent=2))
        return
    print("\n".join(overview_lines(data)))


@job_app.command("reset")
def job_reset(
    job: JobArg,
    keep_input: Annotated[
        bool,
        typer.Option(
            "--keep-input/--delete-input",
            help="Keep the job's input streams (task.inputs) to rerun on them (the default), "
            "or delete them too.",
        ),
    ] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be deleted; delete nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option(help="Reset although the job's heartbeat names a live driver.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Start a job over: delete its checkpoints, stored config, startpoints, changelogs, local
    state and, on the embedded filelog under job.data.dir, its other streams (outputs, dead
    letters). Its input streams are kept (--delete-input deletes them too). The next run
    starts from the inputs' oldest (or upcoming) offsets with empty state. Refused while the
    job runs.

    Example: `sparkpoint job reset job.yaml --dry-run`, then `sparkpoint job reset job.yaml`
    """
    from sparkpoint.tools.reset import reset_job

    config = job_config(job, set_)
    done = reset_job(config, keep_input=keep_input, force=force, dry_run=dry_run)
    for line in done:
        print(line)
    if dry_run:
        err.print(f"job {config.job_name}: nothing deleted (--dry-run)")
        return
    err.print(
        f"job {config.job_name} reset" if done else f"job {config.job_name}: nothing to reset"
    )
