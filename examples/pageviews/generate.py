"""Generate page views ``{user, page, ts}`` into the job's ``pageviews`` stream, keyed by user.

Deterministic for a seed. Usage: ``python generate.py JOB_FILE N [--seed S] [--users U]
[--stream NAME] [--key-field user|page]`` (the re-key example's input is keyed by page).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterable, Iterator, Sequence

from sparkpoint.config import load_config
from sparkpoint.model import SystemStream
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import ensure_stream

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup", "/login", "/about", "/careers"]


def events(
    n: int, seed: int, users: int, pages: Sequence[str] = PAGES
) -> Iterator[dict[str, object]]:
    """``n`` page views; user popularity is skewed (a few users view a lot); each view's page
    is one of ``pages``, all alike."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** 0.8 for i in range(users)]
    names = [f"user-{i:05d}" for i in range(users)]
    ts = 1_700_000_000_000
    chosen = rng.choices(names, weights=weights, k=n)
    for user in chosen:
        ts += rng.randint(0, 50)
        yield {"user": user, "page": rng.choice(pages), "ts": ts}


def write(
    job_file: str,
    n: int,
    seed: int,
    users: int,
    stream: str = "pageviews",
    source: Iterable[dict[str, object]] | None = None,
    key_field: str = "user",
    pages: Sequence[str] = PAGES,
) -> int:
    """Write ``events(n, seed, users, pages)`` (or the events of ``source``) to ``stream``,
    keyed and partitioned by ``key_field``."""
    config = load_config(job_file)
    systems = Systems(config)
    system = config.inputs[0].system if config.inputs else "filelog"  # the job's input system
    ss = SystemStream(system, stream)
    partitions = ensure_stream(config, systems, ss)
    admin = systems.admin(ss.system)
    producer = systems.producer(ss.system)
    written = 0
    for event in events(n, seed, users, pages) if source is None else source:
        key = str(event[key_field]).encode()
        value = json.dumps(event, separators=(",", ":"), sort_keys=True).encode()
        partition = admin.partition_for_key(key, partitions)
        producer.send(ss.stream, partition, Record("", key, value, int(event["ts"])))
        written += 1
        if written % 50_000 == 0:
            producer.flush()
    producer.close()
    systems.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job_file")
    parser.add_argument("n", type=int)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--stream", default="pageviews")
    parser.add_argument("--key-field", default="user", choices=["user", "page"])
    args = parser.parse_args()
    written = write(
        args.job_file, args.n, args.seed, args.users, args.stream, key_field=args.key_field
    )
    print(f"wrote {written} page views (seed {args.seed}, {args.users} users)", file=sys.stderr)


if __name__ == "__main__":
    main()
