"""Checkpoint V2: a checkpoint id, input offsets, and state checkpoint markers, immutable.

JSON form (the reference's field names)::

    {"version": 2, "checkpoint-id": "<millis>-<nanos>",
     "input-offsets": {"<system>.<stream>.<partition>": "<offset>"},
     "state-checkpoint-markers": {"<backend factory>": {"<store>": "<marker>"}}}

Input offsets are the offsets of the *last processed* message of each SSP (Samza's convention);
reading resumes at the system admin's ``offset_after`` of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.errors import CheckpointError
from sparkpoint.model import SystemStreamPartition


def _frozen(m: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class CheckpointV2:
    """One task's committed position: offsets plus the markers of every state backend."""

    checkpoint_id: CheckpointId
    input_offsets: Mapping[SystemStreamPartition, str]
    state_checkpoint_markers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    VERSION = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_offsets", _frozen(self.input_offsets))
        object.__setattr__(
            self,
            "state_checkpoint_markers",
            _frozen({k: _frozen(v) for k, v in self.state_checkpoint_markers.items()}),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.VERSION,
            "checkpoint-id": str(self.checkpoint_id),
            "input-offsets": {str(s): o for s, o in sorted(self.input_offsets.items())},
            "state-checkpoint-markers": {
                f: dict(sorted(m.items())) for f, m in sorted(self.state_checkpoint_markers.items())
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Any) -> CheckpointV2:
        if not isinstance(data, Mapping):
            raise CheckpointError("checkpoint V2 must be a JSON object")
        if data.get("version") != cls.VERSION:
            raise CheckpointError(f"not a version 2 checkpoint: version={data.get('version')!r}")
        try:
            offsets = {
                SystemStreamPartition.parse(k): str(v) for k, v in data["input-offsets"].items()
            }
            markers = {
                str(f): {str(s): str(m) for s, m in stores.items()}
                for f, stores in data.get("state-checkpoint-markers", {}).items()
            }
            return cls(CheckpointId.parse(str(data["checkpoint-id"])), offsets, markers)
        except (KeyError, AttributeError, ValueError, TypeError) as exc:
            raise CheckpointError(f"malformed checkpoint V2: {exc}") from exc

    @classmethod
    def loads(cls, text: str | bytes) -> CheckpointV2:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"checkpoint is not valid JSON: {exc}") from exc
        return cls.from_json(data)
