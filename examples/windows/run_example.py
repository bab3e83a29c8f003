"""Run the windows example: generate page views, run the job to the end of its input, and show
some of the minutes and sessions that closed. Each step is a plain ``sparkpoint`` command,
printed before it runs. Data goes to ``.sparkpoint/pageview-windows`` next to the job file
(removed first)."""

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
GENERATE = HERE.parent / "pageviews" / "generate.py"  # the same page views, timestamped


def step(*args: str) -> str:
    print(f"\n$ {shlex.join(args)}", flush=True)
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True).stdout


def main() -> None:
    events = os.environ.get("EVENTS", "100000")
    data = HERE / ".sparkpoint" / "pageview-windows"
    if data.exists():
        shutil.rmtree(data)
    sp = str(BIN / "sparkpoint")
    step(sp, "stream", "create", str(JOB), "pageviews", "--partitions", "4")
    step(sys.executable, str(GENERATE), str(JOB), events, "--seed", "7", "--users", "200")
    step(sp, "run", str(JOB), "--until-caught-up")
    for stream in ("user-minute-counts", "user-sessions"):
        rows = [
            json.loads(line) for line in step(sp, "stream", "read", str(JOB), stream).splitlines()
        ]
        values = [r["value"] for r in rows]
        print(f"{len(values)} closed; the first 3:")
        for value in sorted(values, key=lambda v: (v["user"], *v.values()))[:3]:
            print(f"  {value}")


if __name__ == "__main__":
    main()
