"""The serde protocol: a value of one type to bytes and back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

T = TypeVar("T")


class Serde(ABC, Generic[T]):
    """Converts values of one type to bytes and back; ``from_bytes(to_bytes(x)) == x``."""

    name: str = ""

    @abstractmethod
    def to_bytes(self, value: T) -> bytes: ...

    @abstractmethod
    def from_bytes(self, data: bytes) -> T: ...
