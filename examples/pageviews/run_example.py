"""The README's first command: generate page views, run the job to the end, show the top users.

``API=dataframe`` runs the DataFrame version of the job (``pageviews_pipeline.py``) instead of
the task (``pageviews_task.py``). Each step is a plain ``sparkpoint`` command, printed before it
runs, so you can repeat any of them by hand. Data goes to ``.sparkpoint/pageviews`` next to the
job file (removed first), from whatever directory it is run.
"""

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


def step(*args: str, env: dict[str, str] | None = None) -> str:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    print(f"\n$ {prefix}{shlex.join(args)}", flush=True)
    proc = subprocess.run(
        args, check=True, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    return proc.stdout


def main() -> None:
    events = os.environ.get("EVENTS", "200000")
    data = HERE / ".sparkpoint" / "pageviews"  # job.data.dir's default: next to the job file
    if data.exists():
        shutil.rmtree(data)
    sp = str(BIN / "sparkpoint")
    step(sp, "stream", "create", str(JOB), "pageviews", "--partitions", "4")
    step(sys.executable, str(HERE / "generate.py"), str(JOB), events, "--seed", "7")
    if os.environ.get("API", "task") == "dataframe":
        # the same job with the DataFrame API (pageviews_pipeline.py): same state and output
        pipeline = "pageviews_pipeline:job"
        step(sp, "run", pipeline, "--until-caught-up", env={"PYTHONPATH": str(HERE)})
    else:
        step(sp, "run", str(JOB), "--until-caught-up")
    out = step(sp, "state", "dump", str(JOB), "--store", "user-counts")
    counts = [json.loads(line) for line in out.splitlines()]
    counts.sort(key=lambda r: (-r["value"], r["key"]))
    total = sum(r["value"] for r in counts)
    print(f"\n{len(counts)} users, {total} page views counted. Top 10 users:")
    for row in counts[:10]:
        print(f"  {row['key']:<12} {row['value']:>8}")


if __name__ == "__main__":
    main()
