"""Run the re-key example: generate page views keyed by page, run the job to the end of its
input (intermediate stream included), and print the busiest users' counts from the
``user-counts`` store. Each step is a plain ``sparkpoint`` command, printed before it runs.
Data goes to ``.sparkpoint/rekey`` next to the job file (removed first)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "job.yaml"
BIN = Path(sys.executable).parent
GENERATE = HERE.parent / "pageviews" / "generate.py"  # the same page views, keyed by page


def step(*args: str) -> str:
    print(f"\n$ {shlex.join(args)}", flush=True)
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True).stdout


def main() -> None:
    events = os.environ.get("EVENTS", "100000")
    data = HERE / ".sparkpoint" / "rekey"
    if data.exists():
        shutil.rmtree(data)
    sp = str(BIN / "sparkpoint")
    step(sp, "stream", "create", str(JOB), "pageviews-by-page", "--partitions", "4")
    step(
        sys.executable,
        str(GENERATE),
        str(JOB),
        events,
        "--seed",
        "7",
        "--users",
        "200",
        "--stream",
        "pageviews-by-page",
        "--key-field",
        "page",
    )
    step(sp, "run", str(JOB), "--until-caught-up")
    out = step(sp, "state", "dump", str(JOB), "--store", "user-counts")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    total = sum(int(r["value"]) for r in rows)
    print(f"{len(rows)} users, {total} views counted; the busiest 3:")
    for row in sorted(rows, key=lambda r: -int(r["value"]))[:3]:
        print(f"  {row['key']}: {row['value']}")


if __name__ == "__main__":
    main()
