"""Benchmark: the embedded filelog's append and read throughput.

Appends N records (20-byte keys, 60-byte values) to one partition in one durable flush, then
reads them back in one call and in 1,000-record pages; best of three reads.

Then the memory a batch of large messages takes: 500 records of 1 MB, read as a task reads its
batch (at most 1,000 records, read on until done), with the default
``systems.<s>.read.max.bytes`` (64 MiB) and with no byte bound; peak Python memory
(``tracemalloc``) and time of each, side by side.
Usage: ``make bench-filelog`` or ``.venv/bin/python bench/filelog.py [--records N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc

from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec, SystemConsumer
from sparkpoint.system.filelog import FileLogSystemFactory

LARGE = 500  # records of 1 MB


def read_batch(consumer: SystemConsumer, ssp: SystemStreamPartition, end: int) -> int:
    """Read ``[0, end)`` as a task reads its batch; the records are dropped as they are used."""
    start = read = 0
    while start < end:
        records = consumer.read(ssp, str(start), str(end), 1000)
        read += len(records)
        start = int(records[-1].offset) + 1
    return read


def large_messages(tmp: str) -> None:
    factory, config = FileLogSystemFactory(), {"systems.fl.path": tmp}
    factory.get_admin("fl", config).create_stream(StreamSpec("big", 1))
    producer = factory.get_producer("fl", config)
    payload = b"x" * (1 << 20)
    for i in range(LARGE):
        producer.send("big", 0, Record("", b"k%d" % i, payload, i))
    producer.flush()
    ssp = SystemStreamPartition("fl", "big", 0)
    peaks = {}
    for name, limit in (("default 64 MiB", None), ("no byte bound", str(1 << 50))):
        settings = config if limit is None else {**config, "systems.fl.read.max.bytes": limit}
        consumer = factory.get_consumer("fl", settings)
        tracemalloc.start()
        t0 = time.perf_counter()
        assert read_batch(consumer, ssp, LARGE) == LARGE
        seconds = time.perf_counter() - t0
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        peak = peaks[name] / 2**20
        print(f"read {LARGE} x 1 MB, {name + ':':<16} peak {peak:,.0f} MiB, {seconds:.2f} s")
    ratio = peaks["default 64 MiB"] / peaks["no byte bound"]
    print(f"peak memory, bounded / unbounded:  {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    n = parser.parse_args().records
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        factory, config = FileLogSystemFactory(), {"systems.fl.path": tmp}
        factory.get_admin("fl", config).create_stream(StreamSpec("s", 1))
        producer = factory.get_producer("fl", config)
        t0 = time.perf_counter()
        for i in range(n):
            producer.send("s", 0, Record("", b"k" * 20, b"v" * 60, i))
        producer.flush()
        write_s = time.perf_counter() - t0
        consumer = factory.get_consumer("fl", config)
        ssp = SystemStreamPartition("fl", "s", 0)
        whole = paged = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            assert len(consumer.read(ssp, "0", str(n))) == n
            whole = min(whole, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for start in range(0, n, 1000):
                consumer.read(ssp, str(start), str(min(n, start + 1000)))
            paged = min(paged, time.perf_counter() - t0)
    print(f"append (send + one fsync'd flush): {n / write_s:,.0f} records/s")
    print(f"read, one call:                    {n / whole:,.0f} records/s")
    print(f"read, 1,000-record pages:          {n / paged:,.0f} records/s")
    with tempfile.TemporaryDirectory(prefix="sp-bench-") as tmp:
        large_messages(tmp)


if __name__ == "__main__":
    main()
