"""``sparkpoint job show``: each task with where it runs, its last commit and its state size;
and the check every read-only tool makes first, that the job has data where it looks.

Read from the metadata store (host affinity's records, :mod:`sparkpoint.metadata.locality`)
and the checkpoint stream; nothing is written. A task's local state is *current* when the
commit recorded where it last ran is the task's last checkpoint: a restart that places it on
that executor (or host, with a per-host store directory) restores nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.checkpoint.manager import CheckpointManager, checkpoint_stream_name
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import is_running
from sparkpoint.metadata.locality import stored_assignment, task_locality, task_standbys
from sparkpoint.model import SystemStreamPartition, TaskName
from sparkpoint.storage.local import LocalTaskState
from sparkpoint.storage.outputs import (
    GUARANTEE,
    batch_owner,
    named_parts,
    owner_of,
    waiting_parts,
)
from sparkpoint.storage.timers import END_OF_TIME
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model


def require_job_data(config: Config) -> None:
    """Stop, saying where it looked, when the job has no checkpoint stream: it never ran with
    this config (often: run from another directory, or another ``job.data.dir``)."""
    system, stream = config.checkpoint_system, checkpoint_stream_name(config)
    systems = Systems(config)
    try:
        if stream in systems.admin(system).list_streams():
            return
    finally:
        systems.close()
    where = (
        f"under {config.get_str(f'systems.{system}.path')}"
        if config.get_str(f"systems.{system}.factory") == "filelog"
        else f"in system {system}"
    )
    raise UserError(
        f"no data of job {config.job_name} (job.id {config.job_id}) found: its checkpoint "
        f"stream {system}.{stream} does not exist {where} (job.data.dir={config.data_dir}). "
        f"Run the job first, or point at its data with --set job.data.dir=PATH (relative "
        f"paths in a job file are relative to the job file's directory)"
    )


def job_overview(config: Config) -> dict[str, Any]:
    """The job's tasks as plain data (what ``job show --json`` prints)."""
    systems = Systems(config)
    store = CoordinatorStreamStore(config, systems, source="job-tool")
    model = job_model(config, systems)
    names = [t.name.name for t in model.sorted_tasks()]
    assignment = stored_assignment(store, names)
    committed = task_locality(store)
    standbys = task_standbys(store)
    checkpoints = {t.name: c for t, c in CheckpointManager(config, systems).read_all().items()}
    tasks = []
    for name in names:
        cp = checkpoints.get(name)
        last = None if cp is None else str(cp.checkpoint_id)
        record = committed.get(name, {})
        executor = assignment.get(name)
        tasks.append(
            {
                "task": name,
                "executor": None if executor is None else executor.id,
                "host": None if executor is None else executor.host,
                "last-checkpoint": last,
                "committed-on": {
                    k: record[k] for k in ("executor", "host", "worker") if k in record
                },
                "state-bytes": record.get("state-bytes", {}),
                # its event-time watermark as of its last commit (ms; none: no event time)
                "watermark": record.get("watermark"),
                # the tasks of its Spark partition at its last commit (a group of tasks)
                "group": record.get("group", []),
                "state-current": last is not None and record.get("checkpoint") == last,
                "local": _local_directory(config, name),
                "standbys": standbys.get(name, []),
            }
        )
    beat = is_running(store)
    stages = _stages(config, systems, checkpoints, running=beat is not None)
    return {
        "job": config.job_name,
        "id": config.job_id,
        "running": None if beat is None else f"driver pid {beat['pid']} on {beat['host']}",
        # the guarantee the job last ran with (its config's, before any run)
        "processing-guarantee": store.get(GUARANTEE, "last")
        or config.get_str("job.processing.guarantee"),
        "stages": stages,
        "tasks": tasks,
    }


def _stages(
    config: Config, systems: Systems, checkpoints: Mapping[str, Checkpoint], *, running: bool
) -> list[dict[str, Any]]:
    """The job's stages: the first reads the job's inputs, the second its intermediate
    streams, each with the messages not read yet (by the last checkpoints) and the messages
    staged, which the stage reads once the checkpoints of their senders are written. When no
    driver runs, a task's parts that its last checkpoint does not name are counted apart
    (``discarded``): the commit that staged them never finished, and the next start deletes
    them (their input is read again). A DataFrame pipeline's parts are its batch log's, and
    all counted as staged."""
    intermediate = config.intermediate_streams
    first = [str(s) for s in config.inputs if s not in intermediate]
    if not intermediate:
        return [{"stage": 1, "inputs": first}]
    read = {ssp: o for c in checkpoints.values() for ssp, o in c.input_offsets.items()}
    named = {
        (owner_of(config, TaskName(task)), ssp, part)
        for task, checkpoint in checkpoints.items()
        for ssp, parts in named_parts(checkpoint).items()
        for part in parts
    }
    batches = batch_owner(config)
    unread = staged = discarded = 0
    for stream in intermediate:
        admin = systems.admin(stream.system)
        if stream.stream not in admin.list_streams():
            continue  # the job creates it when it starts
        ssps = systems.partitions_of([stream])
        for ssp, meta in admin.get_metadata(ssps).items():
            with contextlib.suppress(ValueError):  # offsets that are not numbers: not counted
                start = int(read[ssp]) + 1 if ssp in read else int(meta.oldest)
                unread += int(meta.upcoming) - start
        for part in waiting_parts(config, systems, ssps):
            where = str(SystemStreamPartition(stream.system, part.stream, part.partition))
            kept = running or part.owner == batches or (part.owner, where, part.part) in named
            if kept:
                staged += part.records
            else:
                discarded += part.records
    return [
        {"stage": 1, "inputs": first},
        {
            "stage": 2,
            "inputs": [str(s) for s in intermediate],
            "unread": unread,
            "staged": staged,
            "discarded": discarded,
        },
    ]


def _local_directory(config: Config, task: str) -> dict[str, Any] | None:
    """The task's directory on this machine (its marker's state, commit records, phase notes),
    when the job keeps task state here (local mode, or a per-host directory)."""
    if "{cwd}" in (config.get_str("job.logged.store.base.dir") or ""):
        return None  # every executor has its own: nothing to show from the driver's host
    directory = LocalTaskState(config.store_base_dir, TaskName(task))
    if not directory.dir.is_dir():
        return None
    contents = directory.contents()
    return {k: contents[k] for k in ("state", "commit-records", "notes", "commit-failures")}


def _watermark_text(ms: int | None) -> str:
    if ms is None:
        return ""
    if ms >= END_OF_TIME:
        return "; watermark at the end of input"
    at = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return f"; watermark {at.replace('+00:00', 'Z')} ({ms})"


def overview_lines(data: dict[str, Any]) -> list[str]:
    """``job show`` without ``--json``: a line per task."""
    running = f"running ({data['running']})" if data["running"] else "not running"
    lines = [
        f"job {data['job']} ({data['id']}): {len(data['tasks'])} tasks, {running}, "
        f"{data['processing-guarantee']} output"
    ]
    for stage in data.get("stages", []):
        waiting = (
            f": {stage['unread']:,} messages to read, {stage['staged']:,} staged (read once "
            "their senders' checkpoints are written)"
            if "unread" in stage
            else ""
        )
        if stage.get("discarded"):
            waiting += (
                f", {stage['discarded']:,} staged by commits that never finished (the next "
                "start deletes them and reads their input again)"
            )
        lines.append(f"  stage {stage['stage']} reads {', '.join(stage['inputs'])}{waiting}")
    for t in data["tasks"]:
        where = f"executor {t['executor']} on {t['host']}" if t["executor"] else "not placed"
        sizes = ", ".join(f"{s} {n:,} bytes" for s, n in sorted(t["state-bytes"].items()))
        state = "current" if t["state-current"] else "not current (restores at its next run)"
        last = t["last-checkpoint"] or "none"
        others = [g for g in t.get("group", []) if g != t["task"]]
        lines.append(
            f"  {t['task']}: {where}; last checkpoint {last}; local state {state}"
            + _watermark_text(t.get("watermark"))
            + (f"; {sizes}" if sizes else "")
            + (f"; runs in one Spark partition with {', '.join(others)}" if others else "")
        )
        for copy in t.get("standbys", []):
            if copy["checkpoint"] is None:
                at = "being seeded"
            else:
                behind = "" if copy["lag"] is None else f", {copy['lag']:,} records behind"
                at = f"at checkpoint {copy['checkpoint']}{behind}"
            lines.append(f"    standby on executor {copy['executor']} on {copy['host']}: {at}")
        local = t.get("local")
        if local is not None:
            records = ", ".join(local["commit-records"]) or "none"
            notes = ", ".join(local["notes"]) or "none"
            lines.append(
                f"    on this machine: state {local['state'] or 'unknown (changing or lost)'}; "
                f"commit records {records}; phase notes {notes}"
                + ("; commits failing" if local["commit-failures"] else "")
            )
    return lines
