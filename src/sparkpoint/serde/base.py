"""The serde protocol: a value of one type to bytes and back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Serde(ABC, Generic[T]):
    """Converts values of one type to bytes and back; ``from_bytes(to_bytes(x)) == x``."""

    name: str = ""

    @abstractmethod
    def to_bytes(self, value: T) -> bytes: ...

    @abstractmethod
    def from_bytes(self, data: bytes) -> T: ...

    def from_bytes_many(self, values: Sequence[bytes]) -> list[T]:
        """Each of ``values`` decoded, as ``from_bytes`` does; a serde may decode them in one
        go (the avro serde: a run of one schema's records in one fastavro block)."""
        return [self.from_bytes(v) for v in values]


#: the serdes of records framed for a Schema Registry (:mod:`sparkpoint.serde.registry`)
REGISTRY_SERDES = ("avro", "protobuf", "json-schema")


def is_registry_serde(name: str | None, config: Mapping[str, str]) -> bool:
    """Whether serde ``name`` is a registry serde: one of :data:`REGISTRY_SERDES`, or a
    named one (``serializers.registry.<name>.type``)."""
    return name in REGISTRY_SERDES or f"serializers.registry.{name}.type" in config
