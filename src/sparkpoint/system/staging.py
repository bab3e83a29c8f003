"""The interfaces of exactly-once output (``job.processing.guarantee: exactly-once``).

A system that can give it hands out an :class:`OutputStaging` (``SystemAdmin.output_staging``):
a task attempt's batch output goes to a :class:`StagingProducer`, which keeps it where no
reader sees it; the parts it staged are named in the task's next checkpoint, and published
(made visible, once and whole) after that checkpoint is written. A part no checkpoint names is
discarded. How a system keeps staged output is its own: the filelog stages it beside each
partition (:mod:`sparkpoint.system.filelog.staging`).

Owns these interfaces, and the rules every system shares: what may name an owner or a part
(:func:`check_name`), and which owners a sweep names (:func:`swept_by`); imports nothing of
sparkpoint's but the errors and the system base.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sparkpoint.errors import UserError
from sparkpoint.system.base import Record, SystemProducer

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def check_name(kind: str, name: str) -> str:
    """``name`` if it can name a staged owner or part (a file name), else :class:`UserError`."""
    if not _NAME.match(name):
        raise UserError(f"invalid staged output {kind} {name!r}: use letters, digits, _ . -")
    return name


def swept_by(owner: str, owner_prefix: str) -> bool:
    """Whether a sweep of ``owner_prefix`` names ``owner``: a prefix ending in ``.`` names
    every owner under it (a job's tasks), any other name that one owner."""
    return owner.startswith(owner_prefix) if owner_prefix.endswith(".") else owner == owner_prefix


@dataclass(frozen=True)
class StagedPart:
    """One staged part: the output of one task attempt's batch for one partition."""

    stream: str
    partition: int
    owner: str
    part: str
    records: int


class StagingProducer(SystemProducer):
    """A producer whose records nobody reads until they are published. ``flush`` makes what
    was sent durable where it waits; :meth:`stage` ends the part (once, at the end of the
    batch): it returns the part staged per ``(stream, partition)`` that got records."""

    @abstractmethod
    def stage(self) -> dict[tuple[str, int], str]:
        """Make everything sent a staged part; returns the part name per partition."""


class OutputStaging(ABC):
    """A system's exactly-once output: staging, publishing, discarding."""

    @abstractmethod
    def producer(self, owner: str, part: str) -> StagingProducer:
        """A producer staging ``owner``'s part ``part`` (one task attempt's batch)."""

    @abstractmethod
    def publish(
        self,
        stream: str,
        partition: int,
        owner: str,
        key: int,
        parts: Sequence[str],
        failpoints: Mapping[str, str] | None = None,
    ) -> int:
        """Make ``owner``'s staged ``parts`` of commit ``key`` visible, in order, once and
        whole; a commit whose key is not above the owner's last published one was published
        already (returns 0). Returns the records published."""

    @abstractmethod
    def streams(self) -> list[str]:
        """The streams that may have staged output (every stream a sweep must visit)."""

    @abstractmethod
    def staged(self, stream: str) -> list[StagedPart]:
        """Every staged part of ``stream`` still waiting (or never to be published)."""

    @abstractmethod
    def read_part(self, stream: str, partition: int, owner: str, part: str) -> list[Record]:
        """The records of a staged part, in order (offsets from 0: none is assigned yet)."""

    @abstractmethod
    def publishers(self, stream: str, partition: int) -> list[str]:
        """Every owner that published to this partition (the jobs' tasks writing it)."""

    @abstractmethod
    def sweep(self, stream: str, owner_prefix: str, keep: Collection[str] = ()) -> Counter[str]:
        """Delete every staged part (and part being written) of the owners ``owner_prefix``
        names (a name ending in ``.``: every owner whose name starts with it; otherwise that
        one owner), but the parts named in ``keep``: at a job's start, once what its
        checkpoints name is published. Returns the parts deleted, by owner."""
