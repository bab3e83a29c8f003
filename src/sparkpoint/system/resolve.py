"""Resolving a startpoint to the next offset to read, through a system's admin.

Specific: the offset itself, which must lie between the partition's oldest and upcoming
offsets. Timestamp: the first record at or after it (upcoming when every record is older, oldest
when every record is newer). Oldest / upcoming: as the partition's metadata says now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkpoint.model import SystemStreamPartition
from sparkpoint.model.startpoint import (
    InvalidStartpoint,
    StartpointOldest,
    StartpointSpecific,
    StartpointTimestamp,
    StartpointUpcoming,
    StartpointVisitor,
)

if TYPE_CHECKING:
    from sparkpoint.system.base import PartitionMetadata, SystemAdmin


class OffsetResolver(StartpointVisitor[str]):
    def __init__(self, admin: SystemAdmin, ssp: SystemStreamPartition) -> None:
        self.admin = admin
        self.ssp = ssp

    def _meta(self) -> PartitionMetadata:
        return self.admin.get_committed_metadata([self.ssp])[self.ssp]

    def specific(self, sp: StartpointSpecific) -> str:
        meta = self._meta()
        try:
            too_old = self.admin.offset_comparator(sp.offset, meta.oldest) < 0
            too_new = self.admin.offset_comparator(sp.offset, meta.upcoming) > 0
        except ValueError:
            raise InvalidStartpoint(f"{self.ssp}: {sp.offset!r} is not an offset") from None
        if too_old or too_new:
            raise InvalidStartpoint(
                f"{self.ssp}: offset {sp.offset} does not exist; valid offsets are "
                f"{meta.oldest} (oldest) to {meta.upcoming} (upcoming)"
            )
        return sp.offset

    def timestamp(self, sp: StartpointTimestamp) -> str:
        return self.admin.offset_for_timestamp(self.ssp, sp.timestamp)

    def oldest(self, sp: StartpointOldest) -> str:
        return str(self._meta().oldest)

    def upcoming(self, sp: StartpointUpcoming) -> str:
        return str(self._meta().upcoming)
