"""Checkpoints: which input offsets a task has processed and where its state's backups are."""

from __future__ import annotations

from sparkpoint.checkpoint.checkpoint import CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId

__all__ = ["CheckpointId", "CheckpointV2"]
