"""A notebook's session (issue 72): ``sparkpoint.run(job, spark=...)`` on a session the user
built. Without ``PYSPARK_PYTHON`` its workers run a Python that lacks sparkpoint: one line
says what to set. A task module edited between two runs in one session runs as edited (it
used to run the first version silently: Spark keeps the first file of a name), and only the
modules the job imports ship.

One process of its own (a session built as a notebook builds it, with no PYSPARK_PYTHON and
the system's python3 first on the PATH), one JVM for both sessions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = r"""
import json, os, sys, zipfile
from pathlib import Path
from pyspark.sql import SparkSession
import sparkpoint
from sparkpoint.tools.state import committed_entries
from sparkpoint.config import load_config

job = Path(sys.argv[1])
out = {}
spark = SparkSession.builder.master("local[1]").getOrCreate()  # workers: python3 of the PATH
try:
    sparkpoint.run(job, spark=spark, until_caught_up=True)
    out["no_python"] = None
except Exception as exc:
    out["no_python"] = f"{type(exc).__name__}: {exc}"
spark.stop()

os.environ["PYSPARK_PYTHON"] = sys.executable
spark = SparkSession.builder.master("local[1]").getOrCreate()
out["first"] = sparkpoint.run(job, spark=spark, until_caught_up=True).processed
task = job.parent / "pageviews_task.py"
task.write_text(task.read_text().replace("or 0) + 1", "or 0) + 1000"))  # edited in the notebook
os.system(f"{sys.executable} {job.parent / 'generate.py'} {job} 300 --seed 9 > /dev/null")
out["second"] = sparkpoint.run(job, spark=spark, until_caught_up=True).processed
out["total"] = sum(v for _t, _k, v in committed_entries(load_config(job), "user-counts"))
from pyspark import SparkFiles
root = Path(SparkFiles.getRootDirectory())
out["shipped"] = {
    z.name: sorted(zipfile.ZipFile(z).namelist()) for z in sorted(root.glob("sparkpoint-job-*.zip"))
}
spark.stop()
print("RESULT " + json.dumps(out))
"""


def test_a_notebook_session_says_what_to_set_and_runs_an_edited_task(tmp_path: Path) -> None:
    job_dir = tmp_path / "pageviews"
    shutil.copytree(
        ROOT / "examples" / "pageviews",
        job_dir,
        ignore=shutil.ignore_patterns("*.pyc", "__pycache__", ".sparkpoint"),
    )
    job = job_dir / "job.yaml"  # its data under its directory: a copy of its own
    subprocess.run(
        [sys.executable, str(job_dir / "generate.py"), str(job), "400", "--seed", "8"],
        check=True,
        capture_output=True,
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    env["PATH"] = "/usr/bin:/bin"  # a python3 without sparkpoint first, as a notebook host has
    script = tmp_path / "notebook.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and results, proc.stderr[-3000:]
    out = json.loads(results[0][len("RESULT ") :])
    message = out["no_python"]
    assert message is not None and message.startswith(
        "UserError: the Spark session's Python workers run python3"
    )
    assert f"set PYSPARK_PYTHON={sys.executable}" in message and "\n" not in message
    assert (out["first"], out["second"]) == (400, 300)
    assert out["total"] == 400 + 300 * 1000  # the second run ran the edited task
    # two versions shipped, each the one module the job imports (not generate.py & co.)
    assert len(out["shipped"]) == 2, out["shipped"]
    assert all(names == ["pageviews_task.py"] for names in out["shipped"].values())
