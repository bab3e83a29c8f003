"""Startpoint values: where an input SSP should (re)start, whatever its checkpoint says.

Four kinds, each immutable with the time it was created (epoch ms): a specific offset (the next
offset to read), a timestamp (the first record at or after it), the oldest record, or the next
record to arrive (upcoming). A :class:`StartpointVisitor` turns one into something else, e.g. a
system's offset.

JSON is Samza's (``StartpointObjectMapper``): ``{"@type": "StartpointSpecific", "creationTimestamp":
ms, "specificOffset": "42"}``, ``StartpointTimestamp`` with ``timestampOffset``, and
``StartpointOldest`` / ``StartpointUpcoming``. The form earlier sparkpoint versions wrote
(``{"type": "specific", "offset": ...}``) is read too.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sparkpoint.errors import UserError

R = TypeVar("R")


def _now() -> int:
    return int(time.time() * 1000)


class StartpointVisitor(ABC, Generic[R]):
    @abstractmethod
    def specific(self, sp: StartpointSpecific) -> R: ...

    @abstractmethod
    def timestamp(self, sp: StartpointTimestamp) -> R: ...

    @abstractmethod
    def oldest(self, sp: StartpointOldest) -> R: ...

    @abstractmethod
    def upcoming(self, sp: StartpointUpcoming) -> R: ...


class InvalidStartpoint(UserError, ValueError):
    """A startpoint that cannot be parsed or applied."""


@dataclass(frozen=True)
class Startpoint(ABC):
    creation_timestamp: int = field(default_factory=_now, kw_only=True)

    TYPE = ""  # the short name the CLI uses
    SAMZA_TYPE = ""  # the ``@type`` of Samza's JSON
    SAMZA_FIELD = ""  # Samza's JSON name of the one value field, if any

    @abstractmethod
    def apply(self, visitor: StartpointVisitor[R]) -> R: ...

    def _fields(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "@type": self.SAMZA_TYPE,
            "creationTimestamp": self.creation_timestamp,
        }
        for value in self._fields().values():
            out[self.SAMZA_FIELD] = value
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    def describe(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in self._fields().items())
        return f"{self.TYPE}({fields})" if fields else self.TYPE

    @staticmethod
    def loads(text: str) -> Startpoint:
        try:
            return Startpoint.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidStartpoint(f"invalid startpoint {text!r}: {exc}") from exc

    @staticmethod
    def from_json(data: Any) -> Startpoint:
        """Samza's form, or the one earlier sparkpoint versions wrote."""
        created = int(data["creationTimestamp"])
        samza = "@type" in data
        kind = data["@type"] if samza else data["type"]
        for cls in KINDS:
            if kind == (cls.SAMZA_TYPE if samza else cls.TYPE):
                if cls is StartpointSpecific:
                    field_name = cls.SAMZA_FIELD if samza else "offset"
                    return StartpointSpecific(str(data[field_name]), creation_timestamp=created)
                if cls is StartpointTimestamp:
                    field_name = cls.SAMZA_FIELD if samza else "timestamp"
                    return StartpointTimestamp(int(data[field_name]), creation_timestamp=created)
                return cls(creation_timestamp=created)
        raise ValueError(f"unknown startpoint type {kind!r}")


@dataclass(frozen=True)
class StartpointSpecific(Startpoint):
    offset: str = ""
    TYPE = "specific"
    SAMZA_TYPE = "StartpointSpecific"
    SAMZA_FIELD = "specificOffset"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.specific(self)

    def _fields(self) -> dict[str, Any]:
        return {"offset": self.offset}


@dataclass(frozen=True)
class StartpointTimestamp(Startpoint):
    timestamp: int = 0
    TYPE = "timestamp"
    SAMZA_TYPE = "StartpointTimestamp"
    SAMZA_FIELD = "timestampOffset"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.timestamp(self)

    def _fields(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp}


@dataclass(frozen=True)
class StartpointOldest(Startpoint):
    TYPE = "oldest"
    SAMZA_TYPE = "StartpointOldest"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.oldest(self)


@dataclass(frozen=True)
class StartpointUpcoming(Startpoint):
    TYPE = "upcoming"
    SAMZA_TYPE = "StartpointUpcoming"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.upcoming(self)


KINDS: tuple[type[Startpoint], ...] = (
    StartpointSpecific,
    StartpointTimestamp,
    StartpointOldest,
    StartpointUpcoming,
)
