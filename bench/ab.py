"""Run one benchmark on two commits, interleaved, and print their figures side by side.

A refactoring must not cost speed, and this machine is too noisy for figures taken an hour
apart; so this runs the same benchmark script alternately on ``BASE`` (a git worktree made for
the run, removed after) and on this checkout, ``--runs`` times each, and prints every line of
their output that matches ``--match`` (by default every line that is not blank), run
by run. Each run uses its own tree's benchmark script and its own tree's ``src`` (first on
``PYTHONPATH``, which Spark's Python workers inherit), with this checkout's virtual env.

Usage::

    .venv/bin/python bench/ab.py c9946b5 --runs 2 -- bench/dataframe.py --events 300000
    .venv/bin/python bench/ab.py c9946b5 --this HEAD -- bench/run.py
    .venv/bin/python bench/ab.py HEAD~3 -- bench/tight_loop.py --runs 1
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(tree: Path, script: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src")])}
    env["PYSPARK_PYTHON"] = sys.executable
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, *script], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{script[0]} failed in {tree} (exit {done.returncode})")
    return time.monotonic() - started, done.stdout


def commit(parser: argparse.ArgumentParser, rev: str) -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if not found:
        parser.error(f"{rev!r} is not a commit of {ROOT}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("base", help="the commit to compare this checkout with (e.g. HEAD~1)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each, interleaved")
    parser.add_argument(
        "--this",
        metavar="REV",
        help="compare with this commit (its own worktree) instead of this checkout as it is",
    )
    parser.add_argument(
        "--match",
        default=r"\S",
        help="a regex: the output lines to print",
    )
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("name the benchmark after --, e.g. -- bench/dataframe.py")
    cut = argv.index("--")
    args = parser.parse_args(argv[:cut])
    script = argv[cut + 1 :]
    base = commit(parser, args.base)
    this = None if args.this is None else commit(parser, args.this)
    head = (
        this
        or subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    pattern = re.compile(args.match)
    with tempfile.TemporaryDirectory(prefix="sparkpoint-ab-") as tmp:
        trees = [Path(tmp) / rev for rev in (base, this) if rev is not None]
        for tree in trees:
            subprocess.run(
                ["git", "worktree", "add", "--detach", "--quiet", str(tree), tree.name],
                cwd=ROOT,
                check=True,
            )
        here = ROOT if this is None else trees[1]
        try:
            for i in range(args.runs):
                for label, where in ((f"base {base}", trees[0]), (f"this {head}", here)):
                    seconds, out = run(where, script)
                    print(f"-- run {i + 1}, {label} ({seconds:.0f} s in all)", flush=True)
                    for line in out.splitlines():
                        if pattern.search(line):
                            print(f"   {line}", flush=True)
        finally:
            for tree in trees:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)


if __name__ == "__main__":
    main()
