"""Checkpoints V1 and V2: what a task committed, immutable, with their JSON forms.

V2 (SEP-28) holds a checkpoint id, input offsets and state checkpoint markers.

JSON form, Samza's (``CheckpointV2Serde``), field for field::

    {"checkpoint-id": "<millis>-<nanos>",
     "input-offsets": {"<system>.<stream>.<partition>": "<offset>"},
     "state-checkpoint-markers": {"<backend factory>": {"<store>": "<marker>"}},
     "version": 2}

The built-in backends are written under Samza's factory class names (:data:`SAMZA_FACTORIES`)
and read under those or their sparkpoint names (``changelog``, ``blobstore``); in memory they are
always the sparkpoint names. ``version`` may be absent on read.

Input offsets are the offsets of the *last processed* message of each SSP (Samza's convention);
reading resumes at the system admin's ``offset_after`` of it.

V1 (Samza's original) is a flat map of SSP to offset, where a changelog SSP's offset has the
form ``<checkpointId>:<changelog offset>``. sparkpoint writes its own V1 JSON, which adds the
checkpoint id so a task's local state can be matched to a V1 checkpoint even for stores without
a changelog (a deliberate difference, see docs/samza-compatibility.md)::

    {"version": 1, "checkpoint-id": "<millis>-<nanos>",
     "offsets": {"<system>.<stream>.<partition>": "<offset>"}}

and also reads Samza's (``CheckpointV1Serde``)::

    {"SystemStreamPartition [<system>, <stream>, <partition>]":
        {"system": ..., "partition": "<n>", "offset": ..., "stream": ...}}

whose checkpoint id is taken from a changelog offset when it has one (else it is ``0-0``, which
matches no local state and sorts before any sparkpoint checkpoint).
"""

from __future__ import annotations

import contextlib
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


#: Samza's class names of the built-in state backend factories, by sparkpoint name
SAMZA_FACTORIES = {
    "changelog": "org.apache.samza.storage.KafkaChangelogStateBackendFactory",
    "blobstore": "org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory",
}
FROM_SAMZA = {v: k for k, v in SAMZA_FACTORIES.items()}


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
            "checkpoint-id": str(self.checkpoint_id),
            "input-offsets": {str(s): o for s, o in sorted(self.input_offsets.items())},
            "state-checkpoint-markers": {
                SAMZA_FACTORIES.get(f, f): dict(sorted(m.items()))
                for f, m in sorted(self.state_checkpoint_markers.items())
            },
            "version": self.VERSION,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Any) -> CheckpointV2:
        if not isinstance(data, Mapping):
            raise CheckpointError("checkpoint V2 must be a JSON object")
        if data.get("version", cls.VERSION) != cls.VERSION:
            raise CheckpointError(f"not a version 2 checkpoint: version={data.get('version')!r}")
        try:
            offsets = {
                SystemStreamPartition.parse(k): str(v) for k, v in data["input-offsets"].items()
            }
            markers = {
                FROM_SAMZA.get(str(f), str(f)): {str(s): str(m) for s, m in stores.items()}
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
        if isinstance(data, Mapping) and "version" not in data:
            return cls._from_samza(data)
        if not isinstance(data, Mapping) or data.get("version") != cls.VERSION:
            raise CheckpointError("not a version 1 checkpoint")
        try:
            offsets = {SystemStreamPartition.parse(k): str(v) for k, v in data["offsets"].items()}
            return cls(CheckpointId.parse(str(data["checkpoint-id"])), offsets)
        except (KeyError, AttributeError, ValueError, TypeError) as exc:
            raise CheckpointError(f"malformed checkpoint V1: {exc}") from exc

    @classmethod
    def _from_samza(cls, data: Mapping[str, Any]) -> CheckpointV1:
        """Samza's V1 form: ``{"SystemStreamPartition [...]": {system, stream, partition,
        offset}}``; the checkpoint id comes from a changelog offset ``<id>:<offset>``."""
        offsets: dict[SystemStreamPartition, str] = {}
        ids: list[CheckpointId] = []
        try:
            for entry in data.values():
                ssp = SystemStreamPartition(
                    str(entry["system"]), str(entry["stream"]), int(entry["partition"])
                )
                offset = entry.get("offset")
                if offset is None:
                    continue
                offsets[ssp] = str(offset)
                head, sep, _ = str(offset).partition(":")
                if sep:
                    with contextlib.suppress(ValueError, CheckpointError):
                        ids.append(CheckpointId.parse(head))
        except (KeyError, AttributeError, ValueError, TypeError) as exc:
            raise CheckpointError(f"malformed Samza checkpoint V1: {exc}") from exc
        return cls(max(ids) if ids else CheckpointId(0, 0), offsets)

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
