"""Setting a stopped job's checkpointed offsets (the checkpoint tool).

The offsets file is YAML, either per task or per SSP (the task is then the one that reads it)::

    Partition 0:                      filelog.pageviews.0: 41
      filelog.pageviews.0: 41         filelog.pageviews.1: -1

Values are checkpoint offsets, like ``checkpoint show`` prints: the *last processed* offset, so
the job resumes at the one after it (``-1`` re-reads a filelog partition from its start).
Everything is validated before anything is written; the tool refuses while the job's driver is
alive (its heartbeat is fresh) unless forced. A new checkpoint keeps the task's checkpoint id and
state markers: input is rewound, state is not (it stays as committed).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.checkpoint.manager import CheckpointManager
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore
from sparkpoint.metadata.job_state import is_running
from sparkpoint.model import JobModel, SystemStreamPartition, TaskName
from sparkpoint.storage.backend import checkpoint_markers, v1_changelog_offsets
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import job_model


def parse_offsets_file(
    path: Path, model: JobModel
) -> dict[TaskName, dict[SystemStreamPartition, str]]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read offsets file {path}: {exc}") from exc
    except UnicodeDecodeError:
        raise UserError(
            f"cannot read offsets file {path}: not UTF-8 text (expected YAML: SSP: offset)"
        ) from None
    if not isinstance(data, Mapping) or not data:
        raise UserError(f"{path}: expected a mapping of task or SSP to offsets")
    owner = {ssp: t.name for t in model.tasks.values() for ssp in t.ssps}
    out: dict[TaskName, dict[SystemStreamPartition, str]] = {}

    def add(task: TaskName | None, ssp_text: str, offset: Any) -> None:
        try:
            ssp = SystemStreamPartition.parse(str(ssp_text))
        except ValueError as exc:
            raise UserError(f"{path}: {exc}") from None
        if ssp not in owner:
            valid = ", ".join(sorted(str(s) for s in owner)) or "none"
            raise UserError(
                f"{path}: {ssp} is not an input of job {model.job_name}; inputs: {valid}"
            )
        if task is not None and owner[ssp] != task:
            raise UserError(f"{path}: {ssp} is read by task {owner[ssp]}, not {task}")
        out.setdefault(owner[ssp], {})[ssp] = str(offset)

    for key, value in data.items():
        if isinstance(value, Mapping):
            task = TaskName(str(key))
            if task not in model.tasks:
                known = ", ".join(t.name.name for t in model.sorted_tasks())
                raise UserError(f"{path}: no task {task} in job {model.job_name}; tasks: {known}")
            for ssp_text, offset in value.items():
                add(task, ssp_text, offset)
        else:
            add(None, str(key), value)
    return out


def validate_offsets(
    systems: Systems, offsets: Mapping[TaskName, Mapping[SystemStreamPartition, str]]
) -> None:
    for task, ssps in offsets.items():
        for ssp, offset in ssps.items():
            admin = systems.admin(ssp.system)
            meta = admin.get_metadata([ssp])[ssp]
            try:
                after = admin.offset_after(ssp, offset)
                too_old = admin.offset_comparator(after, meta.oldest) < 0
                newest = meta.newest
                too_new = admin.offset_comparator(after, meta.upcoming) > 0
            except ValueError:
                raise UserError(
                    f"task {task}: {ssp}: offset {offset!r} is not a valid offset"
                ) from None
            if too_old or too_new:
                lo = f"one before {meta.oldest}"
                hi = newest if newest is not None else f"one before {meta.upcoming}"
                raise UserError(
                    f"task {task}: {ssp}: offset {offset} does not exist; checkpoint offsets "
                    f"of this partition go from {lo} to {hi}"
                )


def set_checkpoints(
    config: Config, path: Path, *, force: bool = False
) -> dict[TaskName, CheckpointV2]:
    """Validate, then write one checkpoint per task named in the file. Returns what was written."""
    systems = Systems(config)
    model = job_model(config, systems)
    offsets = parse_offsets_file(path, model)
    validate_offsets(systems, offsets)
    beat = is_running(CoordinatorStreamStore(config, systems, source="checkpoint-tool"))
    if beat and not force:
        raise UserError(
            f"job {config.job_name} is running (driver pid {beat['pid']} on {beat['host']}): stop "
            "it first, or use --force if that driver is gone"
        )
    manager = CheckpointManager(config, systems)
    manager.create_resources()
    current = manager.read_all()
    v2s = manager.read_version(2)
    written = {}
    for task, ssps in sorted(offsets.items()):
        last = current.get(task)
        if last is not None and v2s.get(task, last).checkpoint_id == last.checkpoint_id:
            last = v2s.get(task, last)  # the same commit's V2 form holds every backend's marker
        merged = dict(last.input_offsets) if last else {}
        merged = {s: o for s, o in merged.items() if s in model.tasks[task].ssps}
        merged.update(ssps)
        # the state stays as committed: carry every backend's markers forward
        markers = checkpoint_markers(config, last, model.tasks[task])
        checkpoint = CheckpointV2(
            last.checkpoint_id if last else CheckpointId.create(), merged, markers
        )
        manager.write_checkpoint(
            task, checkpoint, changelog_offsets=v1_changelog_offsets(config, markers)
        )
        written[task] = checkpoint
    manager.close()
    return written
