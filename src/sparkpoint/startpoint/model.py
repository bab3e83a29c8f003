"""Startpoint values: where an input SSP should (re)start, whatever its checkpoint says.

Four kinds, each immutable with the time it was created (epoch ms): a specific offset (the next
offset to read), a timestamp (the first record at or after it), the oldest record, or the next
record to arrive (upcoming). A :class:`StartpointVisitor` turns one into something else, e.g. a
system's offset. JSON: ``{"type": "specific"|"timestamp"|"oldest"|"upcoming", ...,
"creationTimestamp": ms}``.
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

    TYPE = ""

    @abstractmethod
    def apply(self, visitor: StartpointVisitor[R]) -> R: ...

    def _fields(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, **self._fields(), "creationTimestamp": self.creation_timestamp}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    def describe(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in self._fields().items())
        return f"{self.TYPE}({fields})" if fields else self.TYPE

    @staticmethod
    def loads(text: str) -> Startpoint:
        try:
            data = json.loads(text)
            kind = data["type"]
            created = int(data["creationTimestamp"])
            if kind == "specific":
                return StartpointSpecific(str(data["offset"]), creation_timestamp=created)
            if kind == "timestamp":
                return StartpointTimestamp(int(data["timestamp"]), creation_timestamp=created)
            if kind == "oldest":
                return StartpointOldest(creation_timestamp=created)
            if kind == "upcoming":
                return StartpointUpcoming(creation_timestamp=created)
            raise ValueError(f"unknown startpoint type {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidStartpoint(f"invalid startpoint {text!r}: {exc}") from exc


@dataclass(frozen=True)
class StartpointSpecific(Startpoint):
    offset: str = ""
    TYPE = "specific"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.specific(self)

    def _fields(self) -> dict[str, Any]:
        return {"offset": self.offset}


@dataclass(frozen=True)
class StartpointTimestamp(Startpoint):
    timestamp: int = 0
    TYPE = "timestamp"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.timestamp(self)

    def _fields(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp}


@dataclass(frozen=True)
class StartpointOldest(Startpoint):
    TYPE = "oldest"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.oldest(self)


@dataclass(frozen=True)
class StartpointUpcoming(Startpoint):
    TYPE = "upcoming"

    def apply(self, visitor: StartpointVisitor[R]) -> R:
        return visitor.upcoming(self)
