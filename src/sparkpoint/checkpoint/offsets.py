"""Where each input SSP of a task starts: its checkpoint, else the stream's policy.

Order of precedence per SSP: ``streams.<s>.samza.reset.offset=true`` ignores the checkpoint; a
checkpointed offset resumes at the offset after it; with no checkpoint (or a reset), the
stream's ``samza.offset.default`` (or the system's ``default.stream`` one): ``oldest`` or
``upcoming``. A checkpointed offset that is no longer in the stream (retention removed it)
follows the default policy, with a WARN naming the SSP and both offsets. Checkpointed SSPs that
are no longer inputs of the task are dropped with a log line (changelog SSPs of V1 checkpoints
are not inputs and are skipped silently).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sparkpoint.checkpoint.checkpoint import Checkpoint
from sparkpoint.config import Config
from sparkpoint.errors import UserError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskModel
from sparkpoint.startpoint.model import Startpoint
from sparkpoint.system.base import PartitionMetadata
from sparkpoint.system.registry import Systems

log = logging.getLogger(__name__)


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

    def default_start(self, ssp: SystemStreamPartition, meta: PartitionMetadata) -> str:
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
                candidate = admin.offset_after(ssp, offsets[ssp])
                if admin.offset_comparator(candidate, m.oldest) < 0:
                    nxt[ssp] = self.default_start(ssp, m)
                    log.warning(
                        "task %s: %s checkpointed offset %s is no longer in the stream "
                        "(oldest is %s); following the default policy: start at %s",
                        task.name,
                        ssp,
                        offsets[ssp],
                        m.oldest,
                        nxt[ssp],
                    )
                else:
                    nxt[ssp] = candidate
                    last[ssp] = offsets[ssp]
            else:
                nxt[ssp] = self.default_start(ssp, m)
        return nxt, last
