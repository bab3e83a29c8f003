"""State checkpoint markers as strings: ``<version>:<serde name>:<payload>``.

Splitting keeps exactly three parts (at the first two separators), so a payload that itself
contains ``:`` (a changelog marker's ``<checkpointId>:<offset>``, a URL) round-trips unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkpoint.errors import CheckpointError

SEPARATOR = ":"


@dataclass(frozen=True)
class SerializedMarker:
    version: int
    serde: str
    payload: str

    def __str__(self) -> str:
        if SEPARATOR in self.serde:
            raise CheckpointError(
                f"marker serde name {self.serde!r} must not contain {SEPARATOR!r}"
            )
        return f"{self.version}{SEPARATOR}{self.serde}{SEPARATOR}{self.payload}"

    @classmethod
    def parse(cls, text: str) -> SerializedMarker:
        parts = text.split(SEPARATOR, 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1]:
            raise CheckpointError(
                f"invalid state checkpoint marker {text!r}: expected '<version>:<serde>:<payload>'"
            )
        return cls(int(parts[0]), parts[1], parts[2])
