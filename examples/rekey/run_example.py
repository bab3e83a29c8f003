"""Run the re-key example: generate page views keyed by page, run the job to the end of its
input (intermediate stream included), and print the busiest users' counts from the
``user-counts`` store. ``API=dataframe`` runs the DataFrame version (``rekey_pipeline.py``)
instead of the task (``rekey_task.py``). Each step is a plain ``sparkpoint`` command, printed
before it runs. Data goes to ``.sparkpoint/rekey`` next to the job file (removed first)."""

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


def step(*args: str, env: dict[str, str] | None = None) -> str:
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    print(f"\n$ {prefix}{shlex.join(args)}", flush=True)
    full = {**os.environ, **(env or {})}
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, text=True, env=full).stdout


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
    if os.environ.get("API", "task") == "dataframe":
        step(sp, "run", "rekey_pipeline:job", "--until-caught-up", env={"PYTHONPATH": str(HERE)})
    else:
        step(sp, "run", str(JOB), "--until-caught-up")
    out = step(sp, "state", "dump", str(JOB), "--store", "user-counts")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    total = sum(int(r["value"]) for r in rows)
    print(f"{len(rows)} users, {total} views counted; the busiest 3:")
    for row in sorted(rows, key=lambda r: -int(r["value"]))[:3]:
        print(f"  {row['key']}: {row['value']}")


if __name__ == "__main__":
    main()
