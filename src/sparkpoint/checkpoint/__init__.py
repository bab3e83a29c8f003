"""Checkpoints: which input offsets a task has processed and where its state's backups are."""

from __future__ import annotations

from sparkpoint.checkpoint.checkpoint import Checkpoint, CheckpointV1, CheckpointV2
from sparkpoint.checkpoint.id import CheckpointId

__all__ = ["Checkpoint", "CheckpointId", "CheckpointV1", "CheckpointV2"]
