"""Benchmark: the embedded filelog's append and read throughput.

Appends N records (20-byte keys, 60-byte values) to one partition in one durable flush, then
reads them back in one call and in 1,000-record pages; best of three reads.
Usage: ``make bench-filelog`` or ``.venv/bin/python bench/filelog.py [--records N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import Record, StreamSpec
from sparkpoint.system.filelog import FileLogSystemFactory


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


if __name__ == "__main__":
    main()
