"""A stream partition's record, the one value every system reads and writes (below
:mod:`.base`, which declares the systems' interfaces, and :mod:`.columns`, their Arrow form)."""

from __future__ import annotations

from typing import NamedTuple

#: a record's fields as a plain tuple, ``("", key, value, timestamp)`` (the offset unset)
RecordFields = tuple[str, bytes | None, bytes | None, int]


class Record(NamedTuple):
    """A raw record as stored in a stream partition: bytes in, bytes out.

    A named tuple rather than a dataclass: readers create one per record on the hot path, and a
    tuple is built several times faster.
    """

    offset: str
    key: bytes | None
    value: bytes | None
    timestamp: int
