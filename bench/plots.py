"""What the benchmarks' ``--plot FILE`` options share: a figure of one set of axes, written
as a PNG with matplotlib when it is installed (it is in the project's ``[dev]`` extra), and
a line saying so when it is not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def figure(path: str) -> Iterator[Any]:
    """Axes to draw on (``None`` without matplotlib), saved to ``path`` at the end."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed; no plot written")
        yield None
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    yield ax
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"plot: {path}")
