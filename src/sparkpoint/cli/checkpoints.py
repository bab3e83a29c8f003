"""``sparkpoint checkpoint ...``: show or set a job's checkpoints
(:mod:`sparkpoint.tools.checkpoints`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from sparkpoint.cli.app import JobArg, SetOpt, checkpoint_app, ran_config
from sparkpoint.errors import UserError


@checkpoint_app.command("show")
def checkpoint_show(
    job: JobArg,
    task: Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 0".')] = None,
    version: Annotated[
        int | None,
        typer.Option(help="Show this version (1 or 2) instead of the one the job reads."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """Show the last checkpoint of each task: id, input offsets and state markers.

    Without --version it shows what the job would read (task.checkpoint.read.versions).

    Example: `sparkpoint checkpoint show job.yaml --task "Partition 0" --version 2 --json`
    """
    from sparkpoint.checkpoint.manager import TYPES, CheckpointManager

    config = ran_config(job, set_)
    manager = CheckpointManager(config)
    if version is not None and version not in TYPES:
        raise UserError(f"--version {version}: known versions are {', '.join(map(str, TYPES))}")
    checkpoints = manager.read_all() if version is None else manager.read_version(version)
    items = sorted(checkpoints.items(), key=lambda kv: (len(kv[0].name), kv[0].name))
    if task is not None:
        items = [(t, c) for t, c in items if t.name == task]
        if not items:
            known = ", ".join(t.name for t, _ in sorted(checkpoints.items())) or "none"
            raise UserError(f"task {task!r} has no checkpoint; tasks with checkpoints: {known}")
    if as_json:
        print(json.dumps({t.name: c.to_json() for t, c in items}, indent=2))
        return
    if not items:
        print("no checkpoints yet")
    for t, c in items:
        print(f"{t.name}: checkpoint {c.checkpoint_id} (V{c.VERSION})")
        for ssp, offset in sorted(c.input_offsets.items()):
            print(f"  {ssp}: {offset}")
        for factory, stores in sorted(c.state_checkpoint_markers.items()):
            for store, marker in sorted(stores.items()):
                print(f"  state {factory}/{store}: {marker}")


@checkpoint_app.command("set")
def checkpoint_set(
    job: JobArg,
    file: Annotated[Path, typer.Option("--file", "-f", help="YAML of task or SSP to offset.")],
    force: Annotated[
        bool, typer.Option(help="Write even though the job's driver looks alive.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Set a stopped job's checkpointed offsets (the last processed offset per SSP).

    Every SSP and offset is checked against the streams before anything is written. State is
    kept as committed: only where the job reads from changes.

    File, per SSP or per task: `filelog.pageviews.0: 41` or
    `Partition 0: {filelog.pageviews.0: 41}`

    Example: `sparkpoint checkpoint set job.yaml --file offsets.yaml`
    """
    from sparkpoint.tools.checkpoints import set_checkpoints

    config = ran_config(job, set_)
    written = set_checkpoints(config, file, force=force)
    for task, checkpoint in sorted(written.items()):
        offsets = ", ".join(f"{s}={o}" for s, o in sorted(checkpoint.input_offsets.items()))
        print(f"{task}: {offsets}")
