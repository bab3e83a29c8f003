"""Where each input SSP of a task starts: its checkpoint, else the stream's policy.

Order of precedence per SSP: ``streams.<s>.samza.reset.offset=true`` ignores the checkpoint; a
checkpointed offset resumes at the offset after it; with no checkpoint (or a reset), the
stream's ``samza.offset.default`` (or the system's ``default.stream`` one): ``oldest`` or
``upcoming``. Checkpointed SSPs that are no longer inputs of the task are dropped with a log line
(changelog SSPs of V1 checkpoints are not inputs and are skipped silently).

A checkpointed offset outside what its partition holds stops the job (:class:`OffsetOutOfRange`)
rather than skip input: beyond the end (the stream was recreated, or the checkpoint names an
offset the log never reached: reading on would wait for the log to grow past it and skip every
record before), or before the start (retention removed records the job had not read). The error
names the task, SSP, offset and range, and the fix: a startpoint, or ``checkpoint set``. The
driver applies the same check to the offsets it resumes from before every batch
(:func:`check_in_range`), so a stream recreated under a running job stops it too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.errors import StreamNotFound, UserError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskModel, TaskName
from sparkpoint.model.startpoint import Startpoint
from sparkpoint.system.base import PartitionMetadata, SystemAdmin
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)


class OffsetOutOfRange(UserError, LookupError):
    """A task would resume an input outside what its partition holds: input would be skipped."""


def _inside_held_back(admin: SystemAdmin, ssp: SystemStreamPartition, resume: str) -> bool:
    """Whether ``resume``, past what read-committed readers read of ``ssp``, is inside records
    a transactional partition holds back (read before it became one): the reader waits there."""
    if not admin.transactional_records:
        return False
    try:
        if admin.committed_end(ssp) is None:
            return False
        upcoming = admin.get_metadata([ssp])[ssp].upcoming
    except StreamNotFound:
        return False  # (the caller names what the partition holds)
    return admin.offset_comparator(resume, upcoming) <= 0


def check_in_range(
    admin: SystemAdmin,
    task: TaskName,
    ssp: SystemStreamPartition,
    resume: str,
    meta: PartitionMetadata,
    *,
    last_processed: str | None = None,
) -> None:
    """Raise :class:`OffsetOutOfRange` unless ``oldest <= resume <= upcoming``.

    ``last_processed`` is the checkpointed offset ``resume`` follows (named in the message)."""
    try:
        before = admin.offset_comparator(resume, meta.oldest) < 0
        beyond = admin.offset_comparator(resume, meta.upcoming) > 0
    except ValueError:
        raise OffsetOutOfRange(
            f"task {task}: input {ssp}: offset {resume!r} is not an offset of system "
            f"{ssp.system}; {_FIX.format(ssp=ssp)}"
        ) from None
    if not (before or beyond):
        return
    if beyond and _inside_held_back(admin, ssp, resume):
        return
    held = (
        f"the partition holds offsets {meta.oldest}..{meta.newest}"
        if meta.newest is not None
        else f"the partition is empty (its next offset is {meta.upcoming})"
    )
    what = (
        f"the checkpoint's last processed offset {last_processed}"
        if last_processed is not None
        else f"the next offset to read, {resume},"
    )
    why = (
        "records the job had not read were removed (retention, or `stream` deletes)"
        if before
        else "the stream was recreated or truncated, or the offset was never written; "
        "reading on would skip every record written before the log reaches it"
    )
    raise OffsetOutOfRange(
        f"task {task}: input {ssp}: {what} is outside what the partition holds ({held}): "
        f"{why}. Nothing was read. {_FIX.format(ssp=ssp)}"
    )


_FIX = (
    "Choose where the task resumes: `sparkpoint startpoint set <job> --stream {ssp.stream} "
    "--partition {ssp.partition} --oldest` (or --upcoming, or --offset N), or set the offset "
    "with `sparkpoint checkpoint set <job> FILE` while the job is stopped"
)


class OffsetManager:
    """Computes starting offsets; the driver calls it once per task at start."""

    def __init__(self, config: Config, systems: Systems) -> None:
        self.config = config
        self.systems = systems
        self._changelogs = {
            SystemStream.parse(v)
            for s in config.stores
            if (v := config.get_str(f"stores.{s}.changelog"))
        }
        self._intermediate = set(config.intermediate_streams)

    def default_start(self, ssp: SystemStreamPartition, meta: PartitionMetadata) -> str:
        if ssp.system_stream in self._intermediate:  # every message the job sent it (Samza)
            return meta.oldest
        policy = self.config.stream_key(ssp.system_stream, "samza.offset.default") or "oldest"
        return meta.upcoming if policy == "upcoming" else meta.oldest

    def starting_offsets(
        self,
        task: TaskModel,
        checkpoint: Checkpoint | None,
        meta: Mapping[SystemStreamPartition, PartitionMetadata],
        startpoints: Mapping[SystemStreamPartition, Startpoint] | None = None,
    ) -> tuple[dict[SystemStreamPartition, str], dict[SystemStreamPartition, str]]:
        """(next offset to read, checkpointed last-processed offset) per input SSP.

        A startpoint wins over the checkpoint; its SSP then has no last-processed offset, so a
        checkpoint names the SSP again only once something after the startpoint was processed.
        """
        nxt: dict[SystemStreamPartition, str] = {}
        last: dict[SystemStreamPartition, str] = {}
        offsets = dict(checkpoint.input_offsets) if checkpoint else {}
        for ssp in sorted(set(offsets) - set(task.ssps)):
            if ssp.system_stream not in self._changelogs:
                log.info("task %s: dropping checkpointed %s, no longer an input", task.name, ssp)
        for ssp in task.sorted_ssps():
            admin = self.systems.admin(ssp.system)
            m = meta[ssp]
            sp = (startpoints or {}).get(ssp)
            if sp is not None:
                try:
                    nxt[ssp] = admin.resolve_startpoint_to_offset(ssp, sp)
                except UserError as exc:
                    raise UserError(f"task {task.name}: startpoint {sp.describe()}: {exc}") from exc
                log.info(
                    "task %s: %s starts at %s from startpoint %s (checkpoint: %s)",
                    task.name,
                    ssp,
                    nxt[ssp],
                    sp.describe(),
                    offsets.get(ssp, "none"),
                )
                continue
            reset = self.config.get_bool(f"streams.{ssp.stream}.samza.reset.offset")
            if ssp in offsets and not reset:
                try:
                    candidate = admin.offset_after(ssp, offsets[ssp])
                except ValueError:
                    candidate = offsets[ssp]  # not an offset: check_in_range names it
                check_in_range(admin, task.name, ssp, candidate, m, last_processed=offsets[ssp])
                nxt[ssp] = candidate
                last[ssp] = offsets[ssp]
            else:
                nxt[ssp] = self.default_start(ssp, m)
        return nxt, last
