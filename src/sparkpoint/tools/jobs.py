"""``sparkpoint job show``: each task with where it runs, its last commit and its state size;
and the check every read-only tool makes first, that the job has data where it looks.

Read from the metadata store (host affinity's records, :mod:`sparkpoint.metadata.locality`)
and the checkpoint stream; nothing is written. A task's local state is *current* when the
commit recorded where it last ran is the task's last checkpoint: a restart that places it on
that executor (or host, with a per-host store directory) restores nothing.
"""

from __future__ import annotations

from typing import Any

from sparkpoint.checkpoint.manager import CheckpointManager, checkpoint_stream_name
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import is_running
from sparkpoint.metadata.locality import stored_assignment, task_locality
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
                "state-current": last is not None and record.get("checkpoint") == last,
            }
        )
    beat = is_running(store)
    return {
        "job": config.job_name,
        "id": config.job_id,
        "running": None if beat is None else f"driver pid {beat['pid']} on {beat['host']}",
        "tasks": tasks,
    }


def overview_lines(data: dict[str, Any]) -> list[str]:
    """``job show`` without ``--json``: a line per task."""
    running = f"running ({data['running']})" if data["running"] else "not running"
    lines = [f"job {data['job']} ({data['id']}): {len(data['tasks'])} tasks, {running}"]
    for t in data["tasks"]:
        where = f"executor {t['executor']} on {t['host']}" if t["executor"] else "not placed"
        sizes = ", ".join(f"{s} {n:,} bytes" for s, n in sorted(t["state-bytes"].items()))
        state = "current" if t["state-current"] else "not current (restores at its next run)"
        last = t["last-checkpoint"] or "none"
        lines.append(
            f"  {t['task']}: {where}; last checkpoint {last}; local state {state}"
            + (f"; {sizes}" if sizes else "")
        )
    return lines
