"""``sparkpoint job reset``: start a job over, as if it had never run.

What a job has made is deleted: its checkpoint and coordinator streams (checkpoints, stored
config, startpoints, changelog mappings), its stores' changelogs, its local state directory,
the default blob store under ``job.data.dir`` and, on the embedded filelog under
``job.data.dir``, every other stream too (outputs); its inputs are kept unless
``keep_input=False`` (the CLI's ``--delete-input``). ``dry_run`` says what would go.
Refused while a driver runs the job. Only the embedded filelog's streams are deleted: a job
whose metadata lives on another system (Kafka) is refused with the topics to delete by hand,
and a filelog directory outside ``job.data.dir`` (shared by jobs) keeps every stream that is
not the job's own. The checkpoint and coordinator streams go last: a reset that dies half-way
leaves a job that still resumes from its checkpoints (run the reset again to finish it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sparkpoint.checkpoint.manager import checkpoint_stream_name
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.metadata.coordinator_stream import CoordinatorStreamStore, coordinator_stream_name
from sparkpoint.metadata.job_state import RESET, DriverConflict, refuse_if_running
from sparkpoint.model import SystemStream
from sparkpoint.system.filelog.system import FileLogAdmin, root_for
from sparkpoint.system.registry import Systems


def _own_streams(config: Config) -> set[SystemStream]:
    """The streams only this job uses: metadata streams, its stores' changelogs and its
    intermediate streams (inputs it writes itself: deleted even when inputs are kept)."""
    own = {
        SystemStream(config.checkpoint_system, checkpoint_stream_name(config)),
        SystemStream(
            config.coordinator_system, coordinator_stream_name(config.job_name, config.job_id)
        ),
    }
    for store in config.stores:
        changelog = config.get_str(f"stores.{store}.changelog")
        if changelog:
            own.add(SystemStream.parse(changelog))
    return own | set(config.intermediate_streams)


def reset_job(
    config: Config, *, keep_input: bool = True, force: bool = False, dry_run: bool = False
) -> list[str]:
    """Delete what the job has made (see the module docstring); what was deleted, a line
    each. ``dry_run``: what would be deleted, a line each, and nothing deleted."""
    systems = Systems(config)
    try:
        doomed = _doomed_streams(config, systems, keep_input)
        paths = [
            (what, path)
            for what, path in (
                ("local state", config.store_base_dir),
                (
                    "blob store",
                    None if config.get_str("blob.store.url") else config.data_dir / "blobs",
                ),
            )
            if path is not None and path.is_dir()
        ]
        if dry_run:
            return [f"would delete stream {ss}" for _a, ss in doomed] + [
                f"would delete {what} {path}" for what, path in paths
            ]
        _claim_the_reset(config, systems, force)
        # the checkpoints and the metadata go last: a reset that dies half-way leaves a job
        # that resumes from its checkpoints, never one that starts over on what it made (its
        # intermediate streams' records would be counted again)
        coordinator = coordinator_stream_name(config.job_name, config.job_id)
        last = {checkpoint_stream_name(config), coordinator}
        done: list[str] = []
        for admin, ss in doomed:
            if ss.stream not in last and admin.delete_stream(ss.stream):
                done.append(f"deleted stream {ss}")
        for what, path in paths:
            shutil.rmtree(path)
            done.append(f"deleted {what} {path}")
        # the checkpoints, then the metadata with its pending record: the reset's last step
        metadata_last = sorted(
            (d for d in doomed if d[1].stream in last), key=lambda d: d[1].stream == coordinator
        )
        for admin, ss in metadata_last:
            if admin.delete_stream(ss.stream):
                done.append(f"deleted stream {ss}")
        if config.get_str("blob.store.url"):
            done.append(
                f"kept blob store {config.get_str('blob.store.url')}: its snapshots are no longer "
                f"referenced (delete them there if you need the space)"
            )
        return done
    finally:
        systems.close()


def _doomed_streams(
    config: Config, systems: Systems, keep_input: bool
) -> list[tuple[FileLogAdmin, SystemStream]]:
    """The streams a reset deletes: the job's own, and those on the embedded filelog under
    ``job.data.dir`` (inputs only without ``keep_input``); a job whose own streams live on
    another system is refused."""
    own = _own_streams(config)
    elsewhere = sorted(str(s) for s in own if not isinstance(systems.admin(s.system), FileLogAdmin))
    if elsewhere:
        raise UserError(
            f"job reset deletes the embedded filelog's streams only; job {config.job_name} "
            f"keeps {', '.join(elsewhere)} elsewhere: delete them with that system's tools "
            f"(e.g. kafka-topics.sh --delete), then run job reset again"
        )
    inputs = set(config.inputs) | {ss for ss, _p in config.broadcast_inputs}
    doomed: list[tuple[FileLogAdmin, SystemStream]] = []
    for system in config.systems:
        admin = systems.admin(system)
        if not isinstance(admin, FileLogAdmin):
            continue
        job_dir = _under(root_for(system, config), config.data_dir)
        for name in admin.list_streams():
            ss = SystemStream(system, name)
            if ss in inputs and keep_input and ss not in own:
                continue
            if ss in own or ss in inputs or job_dir:
                doomed.append((admin, ss))
    return doomed


def _claim_the_reset(config: Config, systems: Systems, force: bool) -> None:
    """Refused while a driver runs the job; else a pending reset is recorded (until the
    coordinator stream goes, last), which a driver that starts meanwhile refuses to run on."""
    if config.coordinator_system not in config.systems:
        return
    probe = CoordinatorStreamStore(config, systems, source="job-reset")
    try:
        refuse_if_running(probe, config.job_name, "job-reset", force=force)
        probe.put(RESET, "pending", "1")  # until the coordinator stream goes, last
        # a driver that claimed the job between the check and the record read no
        # pending reset (it reads it after its claim): it runs, and nothing is deleted
        try:
            refuse_if_running(probe, config.job_name, "job-reset", force=force)
        except DriverConflict:
            probe.delete(RESET, "pending")
            raise
    finally:
        probe.close()


def _under(path: Path, parent: Path) -> bool:
    return path.resolve().is_relative_to(parent.resolve())
