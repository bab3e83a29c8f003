"""The changelog backend's marker: which changelog partition, and its newest offset at a commit.

V2 form (the marker string in ``state-checkpoint-markers``), Samza's KafkaStateCheckpointMarker::

    {"version": 1, "changelog-ssp": {"system", "partition", "stream", "keyBucket": -1},
     "changelog-offset": "N"}

``changelog-offset`` is ``null`` when the partition was empty. V1 form, stored as the changelog
SSP's offset in a V1 checkpoint: ``<checkpointId>:<offset>``, with ``null`` for an empty
partition as Samza writes it (``<checkpointId>:`` from older sparkpoint versions reads the same).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkpoint.checkpoint.id import CheckpointId
from sparkpoint.errors import CheckpointError
from sparkpoint.model import SystemStreamPartition


@dataclass(frozen=True)
class ChangelogMarker:
    ssp: SystemStreamPartition
    offset: str | None

    def dumps(self) -> str:
        ssp = {
            "system": self.ssp.system,
            "partition": self.ssp.partition,
            "stream": self.ssp.stream,
            "keyBucket": -1,
        }
        return json.dumps(
            {"version": 1, "changelog-ssp": ssp, "changelog-offset": self.offset},
            separators=(",", ":"),
        )

    @classmethod
    def loads(cls, text: str) -> ChangelogMarker:
        try:
            data = json.loads(text)
            if data.get("version") != 1:
                raise ValueError(f"unknown marker version {data.get('version')!r}")
            offset = data["changelog-offset"]
            ssp = SystemStreamPartition.from_json(data["changelog-ssp"])
            return cls(ssp, None if offset is None else str(offset))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"invalid changelog marker {text!r}: {exc}") from exc

    def v1_offset(self, checkpoint_id: CheckpointId) -> str:
        return f"{checkpoint_id}:{'null' if self.offset is None else self.offset}"

    @classmethod
    def from_v1(cls, ssp: SystemStreamPartition, text: str) -> ChangelogMarker:
        cid, sep, offset = text.rpartition(":")
        if not sep:
            raise CheckpointError(
                f"invalid V1 changelog offset {text!r} for {ssp}: expected '<id>:<offset>'"
            )
        CheckpointId.parse(cid)
        return cls(ssp, None if offset in ("", "null") else offset)
