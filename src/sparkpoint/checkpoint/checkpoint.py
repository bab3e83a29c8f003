"""Checkpoints V1 and V2: what a task committed, immutable, with their JSON forms.

V2 (SEP-28) holds a checkpoint id, input offsets and state checkpoint markers.

JSON form (the reference's field names)::

    {"version": 2, "checkpoint-id": "<millis>-<nanos>",
     "input-offsets": {"<system>.<stream>.<partition>": "<offset>"},
     "state-checkpoint-markers": {"<backend factory>": {"<store>": "<marker>"}}}

Input offsets are the offsets of the *last processed* message of each SSP (Samza's convention);
reading resumes at the system admin's ``offset_after`` of it.

V1 (Samza's original) is a flat map of SSP to offset, where a changelog SSP's offset has the
form ``<checkpointId>:<changelog offset>``. sparkpoint's V1 JSON adds the checkpoint id, so a
task's local state can be matched to a V1 checkpoint even for stores without a changelog::

    {"version": 1, "checkpoint-id": "<millis>-<nanos>",
     "offsets": {"<system>.<stream>.<partition>": "<offset>"}}
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


def _json(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"checkpoint is not valid JSON: {exc}") from exc


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
        return cls.from_json(_json(text))


@dataclass(frozen=True)
class CheckpointV1:
    """A V1 checkpoint: every SSP's offset, changelog SSPs included (``<id>:<offset>``)."""

    checkpoint_id: CheckpointId
    input_offsets: Mapping[SystemStreamPartition, str]

    VERSION = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_offsets", _frozen(self.input_offsets))

    @property
    def state_checkpoint_markers(self) -> Mapping[str, Mapping[str, str]]:
        """V1 has no markers; changelog positions are among ``input_offsets``."""
        return MappingProxyType({})

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.VERSION,
            "checkpoint-id": str(self.checkpoint_id),
            "offsets": {str(s): o for s, o in sorted(self.input_offsets.items())},
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Any) -> CheckpointV1:
        if not isinstance(data, Mapping) or data.get("version") != cls.VERSION:
            raise CheckpointError("not a version 1 checkpoint")
        try:
            offsets = {SystemStreamPartition.parse(k): str(v) for k, v in data["offsets"].items()}
            return cls(CheckpointId.parse(str(data["checkpoint-id"])), offsets)
        except (KeyError, AttributeError, ValueError, TypeError) as exc:
            raise CheckpointError(f"malformed checkpoint V1: {exc}") from exc

    @classmethod
    def loads(cls, text: str | bytes) -> CheckpointV1:
        return cls.from_json(_json(text))

    @classmethod
    def from_v2(
        cls, v2: CheckpointV2, changelog_offsets: Mapping[SystemStreamPartition, str] | None = None
    ) -> CheckpointV1:
        """The V1 form of a V2 checkpoint; changelog SSPs get ``<checkpointId>:<offset>``."""
        offsets = dict(v2.input_offsets)
        for ssp, offset in (changelog_offsets or {}).items():
            offsets[ssp] = f"{v2.checkpoint_id}:{offset}"
        return cls(v2.checkpoint_id, offsets)


Checkpoint = CheckpointV1 | CheckpointV2
