"""The slim install (issue 16): the wheel, installed alone into a fresh virtual env, runs the
example job from another directory, with none of the test tools or optional extras."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_DIR, ROOT

pytestmark = pytest.mark.slow


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


def test_the_wheel_alone_runs_the_example(tmp_path: Path) -> None:
    """Installed by ``docker/install.sh``: the Dockerfile's install step, run without Docker."""
    venv = tmp_path / "venv"
    install = subprocess.run(
        [str(ROOT / "docker" / "install.sh"), str(venv)],
        cwd=tmp_path,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    pip_list = [venv / "bin" / "python", "-m", "pip", "list", "--format=freeze"]
    installed = run(*pip_list, cwd=tmp_path).stdout
    names = {line.split("==")[0].lower() for line in installed.splitlines() if "==" in line}
    assert {"sparkpoint", "pyspark", "rocksdict", "pyarrow"} <= names
    assert not names & {"confluent-kafka", "s3fs", "adlfs", "moto", "pytest", "mypy"}
    size_mb = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file()) // 2**20
    print(f"\nvenv of `pip install sparkpoint`: {size_mb} MB")  # for the closing note

    example = tmp_path / "examples" / "pageviews"
    shutil.copytree(EXAMPLE_DIR, example, ignore=shutil.ignore_patterns(".sparkpoint", "__py*"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cli, python, job = venv / "bin" / "sparkpoint", venv / "bin" / "python", example / "job.yaml"
    run(cli, "stream", "create", job, "pageviews", "--partitions", "4", cwd=elsewhere)
    run(python, example / "generate.py", job, "2000", "--seed", "7", cwd=elsewhere)
    assert "done (caught up)" in run(cli, "run", job, "--until-caught-up", cwd=elsewhere).stderr
    dumped = run(cli, "state", "dump", job, "--store", "user-counts", cwd=elsewhere).stdout
    counts = {r["key"]: r["value"] for r in map(json.loads, dumped.splitlines())}
    from generate import events  # the example's generator (on the path: tests/conftest.py)

    assert counts == dict(Counter(str(e["user"]) for e in events(2000, 7, 1000)))
