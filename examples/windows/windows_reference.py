"""What the windows example must emit, computed in plain Python from its input: the closed
minutes and sessions of each user, given each partition's watermark (its largest event time
minus the lateness). Tests and the soak hold the job to it."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from windows_task import MINUTE_MS, SESSION_GAP_MS

LATENESS_MS = 5_000  # task.watermark.lateness.ms of job.yaml

#: ``(user, start, end, count)`` of a minute or a session
Closed = tuple[str, int, int, int]


def closed_windows(
    views: Iterable[tuple[str, int]], partition_of: Callable[[str], int], *, at_end: bool = False
) -> tuple[set[Closed], set[Closed], int]:
    """The closed minutes and sessions of ``views`` (``(user, event time)`` in the order each
    partition holds them, no view late), and how many windows are still open. ``at_end``:
    every window closed, as a job closes them at the end of a bounded input."""
    by_user: dict[str, list[int]] = defaultdict(list)
    top: dict[int, int] = {}
    for user, at in views:
        by_user[user].append(at)
        p = partition_of(user)
        top[p] = max(top.get(p, at), at)
    minutes: set[Closed] = set()
    sessions: set[Closed] = set()
    still_open = 0
    for user, times in by_user.items():
        mark = math.inf if at_end else top[partition_of(user)] - LATENESS_MS
        for start, n in Counter(t - t % MINUTE_MS for t in times).items():
            if start + MINUTE_MS <= mark:
                minutes.add((user, start, start + MINUTE_MS, n))
            else:
                still_open += 1
        first, last, n = times[0], times[0], 0
        for t in [*times, None]:
            if t is not None and t - last <= SESSION_GAP_MS:
                last, n = t, n + 1
                continue
            if last + SESSION_GAP_MS < mark:
                sessions.add((user, first, last, n))
            else:
                still_open += 1
            if t is not None:
                first, last, n = t, t, 1
    return minutes, sessions, still_open
