"""``sparkpoint state ...``: dump, show, check and reshard committed state
(:mod:`sparkpoint.tools.state`, :mod:`sparkpoint.tools.reshard`)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from sparkpoint.cli.app import JobArg, SetOpt, err, ran_config, state_app
from sparkpoint.storage.layouts import Layout


@state_app.command("dump")
def state_dump(
    job: JobArg,
    store: Annotated[str, typer.Option(help="The store to dump.")],
    task: Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 0".')] = None,
    layout: Annotated[
        Layout,
        typer.Option(
            help="How entries read: auto (recognised from the store's first entry), plain "
            "(the store's serdes), window (window and session stores), join (a join's "
            "buffers) or timers (task.timers.store: timers, event time, watermarks).",
            case_sensitive=False,
        ),
    ] = Layout.AUTO,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="Print keys and values as escaped bytes, not decoded in a layout."
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Print a store's committed contents as JSON lines.

    A plain store prints `{"key", "value"}`; a window or session store `{"task", "key",
    "window_start", "window_end", "value"}`; a join's buffer `{"task", "key", "time",
    "values"}`; the timer store a line per timer `{"task", "entry": "timer", "kind", "time",
    "key"}` (a window's timer names its `store` and `window_start`), each input partition's
    event time and each task's `watermark`.

    Example: `sparkpoint state dump job.yaml --store user-counts --task "Partition 1"`
    """
    from sparkpoint.tools.state import committed_raw_entries, committed_rows

    config = ran_config(job, set_)
    out = sys.stdout
    if raw:
        for _task, key, value in committed_raw_entries(config, store, task):
            line = {"key": _escaped(key), "value": _escaped(value)}
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
        return
    for name, found, row in committed_rows(config, store, task, layout):
        line = row if found is Layout.PLAIN else {"task": name, **row}
        out.write(json.dumps(line, separators=(",", ":"), default=str) + "\n")


def _escaped(data: bytes) -> str:
    """Bytes as text with Python's escapes (``\\x00``) for what is not printable ASCII."""
    return repr(data)[2:-1]


@state_app.command("get")
def state_get(
    job: JobArg,
    keys: Annotated[list[str], typer.Argument(help="The keys to look up.")],
    store: Annotated[str, typer.Option(help="The store to look in.")],
    set_: SetOpt = None,
) -> None:
    """Look keys up in a store's committed state, with no Spark: a JSON line per key,
    `{"key", "value", "found", "task", "checkpoint"}`, from the last checkpoint of the task
    its input partitioner places it in (never a running task's uncommitted writes).

    A key is typed as the store's key serde takes it (an integer for `integer`, JSON for
    `json`). Example: `sparkpoint state get job.yaml --store user-counts user-00001 user-00002`
    """
    from sparkpoint.state.lookup import key_from_text, lookup

    config = ran_config(job, set_)
    parsed = [key_from_text(config, store, k) for k in keys]
    for answer in lookup(config, store, parsed):
        line = {
            "key": answer.key,
            "value": answer.value,
            "found": answer.found,
            "task": answer.task,
            "checkpoint": answer.checkpoint,
        }
        sys.stdout.write(json.dumps(line, separators=(",", ":"), default=str) + "\n")


@state_app.command("show")
def state_show(
    job: JobArg,
    task: Annotated[str | None, typer.Option(help='Only this task, e.g. "Partition 0".')] = None,
    store: Annotated[str | None, typer.Option(help="Only this store.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    set_: SetOpt = None,
) -> None:
    """Show where each store's committed state is: the local checkpoint on this machine, the
    changelog up to its checkpointed offset, the blob-store snapshot (files, bytes).

    Example: `sparkpoint state show job.yaml --store user-counts --json`
    """
    from sparkpoint.tools.state import state_locations

    rows = [
        r
        for r in state_locations(ran_config(job, set_))
        if (task is None or r["task"] == task) and (store is None or r["store"] == store)
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print("no committed state (no checkpoints yet, or no stores)")
    for r in rows:
        where = []
        if r["local"]:
            where.append(f"local checkpoint {r['local']}")
        if "changelog" in r:
            c = r["changelog"]
            where.append(f"changelog {c['ssp']} up to offset {c['offset']}")
        if "blobstore" in r:
            b = r["blobstore"]
            where.append(
                f"blob store snapshot {b['snapshot-index']} ({b['files']} files, "
                f"{b['bytes']:,} bytes) in {b['url']}"
            )
        found = "; ".join(where) or "NOWHERE readable from here (no backend, no local copy)"
        print(f"{r['task']} / {r['store']}: checkpoint {r['checkpoint-id']}: {found}")


@state_app.command("check")
def state_check(
    job: JobArg,
    quick: Annotated[
        bool, typer.Option("--quick", help="Only check that blobs exist (no download).")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Check every blob every checkpoint references: present, right size and checksum (it
    downloads them; --quick only checks they exist). Exit 1 naming each problem.

    Example: `sparkpoint state check job.yaml`
    """
    from sparkpoint.tools.state import blob_check

    result = blob_check(ran_config(job, set_), checksums=not quick)
    for line in result.problems:
        print(line)
    if result.problems:
        raise typer.Exit(1)
    if result.snapshots == 0:
        print(
            f"nothing to check: none of the job's {result.checkpoints} checkpoints (V2) names a "
            f"blob-store snapshot (no store lists blobstore in stores.<s>.backup.factories, or "
            f"no commit has uploaded one yet)"
        )
        return
    what = "exists" if quick else "exists and matches its size and checksum"
    print(
        f"ok: {result.snapshots} snapshots of {result.checkpoints} checkpoints, "
        f"{result.files} files: every blob {what}"
    )


@state_app.command("reshard")
def state_reshard(
    job: JobArg,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check every key and say what would move; change nothing."),
    ] = False,
    unread_after_growth: Annotated[
        bool,
        typer.Option(
            "--unread-after-growth",
            help="The job's unread input in the old partitions of a stream grown without "
            "`stream add-partitions` was written after the growth (keyed by the new count).",
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Move the job's state to the tasks of its inputs' new partition counts (after `stream
    add-partitions`), offline; refused while the job runs.

    Every key's committed state goes to the task its input partition now maps it to (the
    producers' partitioner: crc32 on the filelog, murmur2 on Kafka), through the stores'
    changelogs and blob-store snapshots, with new checkpoints that adopt it. All or nothing: a
    crash leaves the old state and checkpoints, and running the command again finishes or
    redoes it. A store whose keys are not the input key needs `stores.<s>.reshard.key`
    (window, or a function); the reshard says which and changes nothing without it.

    Example: `sparkpoint stream add-partitions job.yaml pageviews --partitions 8 &&
    sparkpoint state reshard job.yaml`
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkpoint.tools.reshard import reshard

    config = ran_config(job, set_)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        tasks: dict[str, Any] = {}

        def progress(phase: str, done: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        result = reshard(
            config, dry_run=dry_run, unread_after_growth=unread_after_growth, progress=progress
        )
    if result.finished_earlier:
        print(f"finished reshard {result.finished_earlier}, which an earlier run had committed")
    if result.nothing:
        print(f"nothing to do: {result.nothing}")
        return
    for stream, (old, new) in sorted(result.streams.items()):
        print(f"{stream}: {old} -> {new} partitions")
    verb = "would move" if dry_run else "moved"
    for store, moved in sorted(result.moved.items()):
        print(
            f"store {store}: {verb} {moved.keys:,} of {moved.entries:,} entries "
            f"({moved.bytes:,} bytes)"
        )
    done = "checked in" if dry_run else "re-sharded and adopted in"
    print(f"{done} {result.seconds:.1f} s")
