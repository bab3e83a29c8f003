"""Run the windows example: generate page views, run the job to the end of its input, and show
some of the minutes and sessions that closed. ``API=dataframe`` runs the DataFrame version
(``windows_pipeline.py``) instead of the task (``windows_task.py``). Each step is a plain
``sparkpoint`` command, printed before it runs. Data goes to ``.sparkpoint/pageview-windows``
next to the job file (removed first)."""

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


def step(*args: str, env: dict[str, str] | None = None) -> str:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    print(f"\n$ {prefix}{shlex.join(args)}", flush=True)
    full = {**os.environ, **(env or {})}
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True, env=full).stdout


def main() -> None:
    events = os.environ.get("EVENTS", "100000")
    data = HERE / ".sparkpoint" / "pageview-windows"
    if data.exists():
        shutil.rmtree(data)
    sp = str(BIN / "sparkpoint")
    step(sp, "stream", "create", str(JOB), "pageviews", "--partitions", "4")
    step(sys.executable, str(GENERATE), str(JOB), events, "--seed", "7", "--users", "200")
    if os.environ.get("API", "task") == "dataframe":
        step(sp, "run", "windows_pipeline:job", "--until-caught-up", env={"PYTHONPATH": str(HERE)})
    else:
        step(sp, "run", str(JOB), "--until-caught-up")
    for stream in ("user-minute-counts", "user-sessions"):
        rows = [
            json.loads(line) for line in step(sp, "stream", "read", str(JOB), stream).splitlines()
        ]
        values = [r["value"] for r in rows]
        print(f"{len(values)} closed; the first 3:")
        start = "window_start" if stream == "user-minute-counts" else "session_start"
        for value in sorted(values, key=lambda v: (v["user"], v[start]))[:3]:
            print(f"  {value}")


if __name__ == "__main__":
    main()
