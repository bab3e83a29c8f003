"""Exactly-once output in the commit protocol (``job.processing.guarantee: exactly-once``).

With exactly-once, a task's output joins its commits like a state backend does:

* **stage**: each batch's output is staged (:mod:`sparkpoint.system.staging`), one *part* per
  partition written to, named ``<run>-<batch>-<random>`` (one task attempt's; two attempts of
  a batch never share a part). The batch reports the parts it staged; the driver keeps, per
  task, the parts staged since the last written checkpoint, in batch order (*pending*), and
  hands them to the next batch, which adds its own, when it keeps its live state. A batch that
  restores the last checkpoint starts again from it: parts staged after it belong to a lineage
  nobody continues, and are dropped.
* **snapshot**: a commit names the pending parts in its checkpoint, under the marker
  :data:`OUTPUTS` (per SSP: ``<key>:<part>,<part>``, where the key orders the task's commits;
  it is the checkpoint id the parts were first committed under, so a tool that copies markers
  into a new checkpoint never publishes them twice). A commit built on a finished commit the
  driver has not written yet carries that one's groups before its own (``;``-joined).
* **clean_up** (after the checkpoint is written): the parts it names are published, once and
  whole. The driver does it too when it starts (:func:`settle`), then discards every staged
  part of the job no checkpoint names: output of input the restarted job reads again.

So output is visible exactly when, and only if, the checkpoint covering its input is written.

Owns the :data:`OUTPUTS` markers and the staged parts' names; imports the checkpoint, config,
model and system layers only.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV1
from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream, SystemStreamPartition, TaskName
from sparkpoint.system.registry import Systems
from sparkpoint.system.staging import OutputStaging, StagedPart

log = logging.getLogger(__name__)

#: the marker name of a commit's staged output in ``state-checkpoint-markers``
OUTPUTS = "sparkpoint.outputs"
EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
#: the metadata namespace keeping the guarantee a job last ran with (key ``last``)
GUARANTEE = "processing-guarantee"


def guarantee(config: Mapping[str, str]) -> str:
    """``job.processing.guarantee``: at-least-once (the default) or exactly-once."""
    return config.get("job.processing.guarantee") or AT_LEAST_ONCE


def exactly_once(config: Mapping[str, str]) -> bool:
    """Whether the job runs with ``job.processing.guarantee: exactly-once``."""
    return guarantee(config) == EXACTLY_ONCE


def stages_output(config: Config) -> bool:
    """Whether the job's tasks stage output: all of it with exactly-once, else only what they
    send to intermediate streams (``streams.<s>.samza.intermediate``), so a replayed input
    never reaches the stage that reads them twice."""
    return exactly_once(config) or bool(config.intermediate_streams)


def staged_streams(config: Config) -> frozenset[SystemStream] | None:
    """The streams a task stages its messages to: ``None`` for every one (exactly-once)."""
    return None if exactly_once(config) else frozenset(config.intermediate_streams)


def staged_stream(config: Config, stream: SystemStream) -> bool:
    """Whether what a task sends to ``stream`` is staged (:func:`staged_streams`)."""
    streams = staged_streams(config)
    return streams is None or stream in streams


def owner_of(config: Config, task: TaskName) -> str:
    """The name a task's staged output goes under: ``<job.name>-<job.id>.<task>``."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", f"{config.job_label}.{task.name}")


def batch_owner(config: Config) -> str:
    """The name a DataFrame pipeline's staged stream output goes under: its unit is the batch
    (``<job.name>-<job.id>-batches``; outside the tasks' ``<job.name>-<job.id>.`` prefix, which
    :func:`settle` sweeps before the batch log is read)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", f"{config.job_label}-batches")


def new_part(run_id: str, batch: int) -> str:
    """The name of one task attempt's batch output."""
    return f"{run_id}-{batch}-{uuid.uuid4().hex[:8]}"


def key_of(checkpoint_id: CheckpointId) -> int:
    """The publish key of a commit: grows with its checkpoint id."""
    return checkpoint_id.millis * 1_000_000 + checkpoint_id.nanos


def staging_of(systems: Systems, system: str) -> OutputStaging:
    """``system``'s output staging, or a :class:`ConfigError` naming it."""
    staging = systems.admin(system).output_staging()
    if staging is None:
        raise ConfigError(
            f"job.processing.guarantee=exactly-once or an intermediate stream "
            f"(streams.<s>.samza.intermediate), but system {system!r} cannot stage output "
            f"(the filelog, Kafka and the table systems can): send that output to one, or run "
            f"with job.processing.guarantee=at-least-once"
        )
    return staging


@dataclass(frozen=True)
class CommittedParts:
    """The parts one commit staged for one SSP, and the key they are published under."""

    key: int
    parts: tuple[str, ...]


def committed_parts(
    checkpoint: Checkpoint | None,
) -> dict[SystemStreamPartition, list[CommittedParts]]:
    """The staged parts a checkpoint names, per SSP, oldest commit first (none for V1
    checkpoints and before any). A marker is ``<key>:<part>,<part>``, or several of those
    joined by ``;`` when the commit built on an unwritten one: publishing the checkpoint
    publishes that one's parts first (a no-op if they went out already)."""
    if checkpoint is None or isinstance(checkpoint, CheckpointV1):
        return {}
    out = {}
    for ssp, marker in checkpoint.state_checkpoint_markers.get(OUTPUTS, {}).items():
        groups = []
        for group in marker.split(";"):
            key, _, parts = group.partition(":")
            groups.append(CommittedParts(int(key), tuple(p for p in parts.split(",") if p)))
        out[SystemStreamPartition.parse(ssp)] = sorted(groups, key=lambda g: g.key)
    return out


def named_parts(checkpoint: Checkpoint | None, *, own_only: bool = False) -> dict[str, set[str]]:
    """The parts a checkpoint names per SSP (``own_only``: of its own commit, not of the
    unwritten commits it built on)."""
    own = None if checkpoint is None else key_of(checkpoint.checkpoint_id)
    return {
        str(ssp): {p for g in groups if not own_only or g.key == own for p in g.parts}
        for ssp, groups in committed_parts(checkpoint).items()
    }


def _marker(groups: Sequence[CommittedParts]) -> str:
    return ";".join(f"{g.key}:{','.join(g.parts)}" for g in groups)


class TaskOutputs:
    """A task's staged output since its last written checkpoint (in one batch)."""

    def __init__(self, pending: Mapping[str, Sequence[str]]) -> None:
        self.pending: dict[str, list[str]] = {s: list(p) for s, p in pending.items()}

    def add(self, staged: Mapping[tuple[str, str, int], str]) -> None:
        """The parts this batch staged, by (system, stream, partition)."""
        for (system, stream, partition), part in staged.items():
            self.pending.setdefault(f"{system}.{stream}.{partition}", []).append(part)

    def markers(self, checkpoint_id: CheckpointId, base: Checkpoint | None) -> dict[str, str]:
        """The :data:`OUTPUTS` markers of a commit: the groups of ``base`` (an unwritten commit
        this one builds on: the driver writes both at once, and only this one's clean-up
        runs), then this commit's own group, every pending part ``base`` does not name."""
        carried = {str(ssp): groups for ssp, groups in committed_parts(base).items()}
        key = key_of(checkpoint_id)
        out = {ssp: _marker(groups) for ssp, groups in carried.items()}
        for ssp, left in uncovered(self.pending, base).items():
            out[ssp] = _marker([*carried.get(ssp, []), CommittedParts(key, tuple(left))])
        return out


def uncovered(
    pending: Mapping[str, Sequence[str]], checkpoint: Checkpoint | None
) -> dict[str, list[str]]:
    """``pending`` without the parts ``checkpoint`` names (the driver, once it wrote it; a
    commit, those of the unwritten commit it builds on)."""
    named = named_parts(checkpoint)
    out = {}
    for ssp, parts in pending.items():
        left = [p for p in parts if p not in named.get(ssp, set())]
        if left:
            out[ssp] = left
    return out


def foreign_parts(checkpoint: Checkpoint, staged: Mapping[str, Sequence[str]]) -> list[str]:
    """Parts a finished commit names as its own that the task's lineage (``staged``: what it
    staged since its last written checkpoint) does not hold: the commit was made by a lineage
    the task left (it restored since). Writing it would publish that output twice."""
    have = {p for parts in staged.values() for p in parts}
    return sorted(
        p for parts in named_parts(checkpoint, own_only=True).values() for p in parts - have
    )


def publish(
    config: Config,
    systems: Systems,
    task: TaskName,
    checkpoint: Checkpoint | None,
    failpoints: Mapping[str, str] | None = None,
) -> int:
    """Publish the parts ``checkpoint`` names (idempotent); returns the records published now."""
    owner = owner_of(config, task)
    total = 0
    for ssp, groups in sorted(committed_parts(checkpoint).items()):
        for group in groups:  # oldest first: a commit's, then the one built on it
            total += publish_parts(systems, owner, group.key, {ssp: group.parts}, failpoints)
    return total


def publish_parts(
    systems: Systems,
    owner: str,
    key: int,
    parts: Mapping[SystemStreamPartition, Sequence[str]],
    failpoints: Mapping[str, str] | None = None,
) -> int:
    """Publish ``owner``'s staged ``parts`` of commit ``key`` per SSP (idempotent: a key the
    owner published already is a no-op); returns the records published now."""
    total = 0
    for ssp, names in sorted(parts.items()):
        staging = staging_of(systems, ssp.system)
        total += staging.publish(ssp.stream, ssp.partition, owner, key, names, failpoints)
    return total


def discard_staged(
    config: Config, systems: Systems, owner_prefix: str, keep: Collection[str] = ()
) -> Counter[str]:
    """Delete every staged part of the owners named ``owner_prefix...`` in every stream of the
    job's systems, but those in ``keep``; returns the parts deleted, by owner."""
    discarded: Counter[str] = Counter()
    for system in sorted(config.systems):
        admin = systems.admin(system)
        staging = admin.output_staging()
        if staging is None:
            continue
        for stream in staging.streams():
            discarded.update(staging.sweep(stream, owner_prefix, keep))
    return discarded


def waiting_parts(
    config: Config, systems: Systems, ssps: Collection[SystemStreamPartition]
) -> list[StagedPart]:
    """The staged parts of ``ssps`` of the job's tasks and batches, waiting to be published
    (or, a dead attempt's, never to be)."""
    prefix, batches = owner_of(config, TaskName("")), batch_owner(config)
    wanted = set(ssps)
    return [
        part
        for stream in sorted({s.system_stream for s in wanted})
        for part in staging_of(systems, stream.system).staged(stream.stream)
        if (part.owner.startswith(prefix) or part.owner == batches)
        and SystemStreamPartition(stream.system, stream.stream, part.partition) in wanted
    ]


@dataclass
class Settled:
    """What :func:`settle` did."""

    published: int = 0  # records of written checkpoints a crash left unpublished
    discarded: int = 0  # staged parts no checkpoint names
    aborted: int = 0  # the owners (tasks) of those parts: their open transactions, aborted


def settle(config: Config, systems: Systems, checkpoints: Mapping[TaskName, Checkpoint]) -> Settled:
    """At a job's start, before any task runs: publish what the last checkpoints name and a
    crash left unpublished, then discard every other staged part of this job's tasks (their
    input is read again from the checkpoints). Runs whatever the guarantee is now, so a job
    switched back to at-least-once still publishes what its last exactly-once commit named."""
    done = Settled()
    for task, checkpoint in sorted(checkpoints.items()):
        done.published += publish(config, systems, task, checkpoint)
    prefix = owner_of(config, TaskName(""))  # "<job.name>-<job.id>.": every task's owner
    discarded = discard_staged(config, systems, prefix)
    done.discarded, done.aborted = discarded.total(), len(discarded)
    if done.published or done.discarded:
        log.info(
            "exactly-once output: published %d records of written checkpoints, discarded %d "
            "staged parts no checkpoint names (the open transactions of %d tasks, aborted)",
            done.published,
            done.discarded,
            done.aborted,
        )
    return done
