"""Startpoints: rewind or fast-forward any input without touching checkpoints (SEP-18)."""

from __future__ import annotations

from sparkpoint.model.startpoint import (
    Startpoint,
    StartpointOldest,
    StartpointSpecific,
    StartpointTimestamp,
    StartpointUpcoming,
    StartpointVisitor,
)

__all__ = [
    "Startpoint",
    "StartpointOldest",
    "StartpointSpecific",
    "StartpointTimestamp",
    "StartpointUpcoming",
    "StartpointVisitor",
]
