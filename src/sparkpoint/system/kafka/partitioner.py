"""Kafka's default partitioner for keyed records: ``murmur2(key) & 0x7fffffff % partitions``.

The same function as the Java client's ``Utils.murmur2`` (and librdkafka's ``murmur2``
partitioner), so a key lands in the partition a Kafka Streams or Samza job would put it in.
Written here because it is a dozen lines and no maintained Python package exposes it alone.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` as an unsigned 32-bit integer."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def kafka_partition(key: bytes | None, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (a key of ``None`` goes to 0, as in
    sparkpoint's other systems: Kafka's own choice for it is random)."""
    if key is None:
        return 0
    return (murmur2(key) & 0x7FFFFFFF) % partitions
