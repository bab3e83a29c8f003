"""The slim install (issue 16): the wheel, installed alone into a fresh virtual env, runs the
example job from another directory, with none of the test tools or optional extras; packed by
its own ``sparkpoint pack`` and shipped with ``sparkpoint submit --env-archive`` (issue 36), it
runs the job on a standalone cluster whose workers' Python lacks sparkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkpoint.testing.spark_cluster import StandaloneCluster
from tests.conftest import EXAMPLE_DIR, ROOT

pytestmark = pytest.mark.slow


def run(
    *args: str | Path, cwd: Path, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=900, env=env
    )
    if check:
        assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Installed by ``docker/install.sh``: the Dockerfile's install step, run without Docker."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    install = subprocess.run(
        [str(ROOT / "docker" / "install.sh"), str(venv)],
        env={**os.environ, "PYTHON": sys.executable, "PIP_NO_COMPILE": "1"},  # .pyc: not tested
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    yield venv


def example_copy(tmp_path: Path, events: int, seed: int, venv: Path) -> Path:
    """The example copied under ``tmp_path`` with ``events`` page views written; its job."""
    example = tmp_path / "examples" / "pageviews"
    shutil.copytree(EXAMPLE_DIR, example, ignore=shutil.ignore_patterns(".sparkpoint", "__py*"))
    job = example / "job.yaml"
    cli, python = venv / "bin" / "sparkpoint", venv / "bin" / "python"
    run(cli, "stream", "create", job, "pageviews", "--partitions", "4", cwd=tmp_path)
    run(python, example / "generate.py", job, str(events), "--seed", str(seed), cwd=tmp_path)
    return job


def dumped_counts(venv: Path, job: Path, cwd: Path) -> dict[str, int]:
    cli = venv / "bin" / "sparkpoint"
    dumped = run(cli, "state", "dump", job, "--store", "user-counts", cwd=cwd).stdout
    return {r["key"]: r["value"] for r in map(json.loads, dumped.splitlines())}


def expected_counts(events: int, seed: int) -> dict[str, int]:
    from generate import events as generated  # the example's generator (tests/conftest.py)

    return dict(Counter(str(e["user"]) for e in generated(events, seed, 1000)))


def test_the_wheel_alone_runs_the_example(tmp_path: Path, venv: Path) -> None:
    pip_list = [venv / "bin" / "python", "-m", "pip", "list", "--format=freeze"]
    installed = run(*pip_list, cwd=tmp_path).stdout
    names = {line.split("==")[0].lower() for line in installed.splitlines() if "==" in line}
    assert {"sparkpoint", "pyspark", "rocksdict", "pyarrow"} <= names
    assert not names & {"confluent-kafka", "s3fs", "adlfs", "moto", "pytest", "mypy"}
    size_mb = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file()) // 2**20
    print(f"\nvenv of `pip install sparkpoint`: {size_mb} MB")  # for the closing note

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job = example_copy(tmp_path, 2000, 7, venv)
    cli = venv / "bin" / "sparkpoint"
    assert "done (caught up)" in run(cli, "run", job, "--until-caught-up", cwd=elsewhere).stderr
    assert dumped_counts(venv, job, elsewhere) == expected_counts(2000, 7)


def test_the_packed_env_runs_the_job_on_workers_without_sparkpoint(
    tmp_path: Path, venv: Path
) -> None:
    """``sparkpoint pack`` by the installed env, then ``sparkpoint submit --env-archive`` (a
    spark-submit of sparkpoint's ``__main__.py``) on a standalone cluster whose workers' own
    ``PYSPARK_PYTHON`` is a bare venv: the executors run the shipped env, and state is exact."""
    cli = venv / "bin" / "sparkpoint"
    archive = tmp_path / "env.zip"
    assert "packed" in run(cli, "pack", "-o", archive, cwd=tmp_path).stdout
    with zipfile.ZipFile(archive) as packed:
        names = set(packed.namelist())
        python = packed.getinfo("bin/python")
    assert "pyvenv.cfg" in names
    assert any(n.endswith("site-packages/sparkpoint/__init__.py") for n in names)
    assert not any("/pyspark/jars/" in n for n in names)  # the cluster has Spark's jars
    assert (python.external_attr >> 16) & 0o111 and python.file_size > 0  # a file, executable
    again = run(cli, "pack", "-o", archive, cwd=tmp_path, check=False)
    assert again.returncode == 2 and "--force" in again.stderr  # never overwritten unasked

    bare = tmp_path / "bare"  # a Python without sparkpoint or pyspark
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    job = example_copy(tmp_path, 3000, 9, venv)
    sets = ["--set", "spark.cores.max=2", "--set", "spark.executor.memory=512m"]
    with StandaloneCluster(
        tmp_path / "cluster", workers=1, cores=2, python=str(bare / "bin" / "python")
    ) as cluster:
        submit = [cli, "submit", job, "--master", cluster.master_url, "--env-archive", archive]
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
        submitted = run(*submit, "--until-caught-up", *sets, cwd=tmp_path, env=env)
    unpacked = list((tmp_path / "cluster").glob("worker-0/app-*/*/environment/pyvenv.cfg"))
    output = submitted.stdout + submitted.stderr
    assert "done (caught up)" in output, output[-3000:]
    assert "incubator" not in output  # spark-submit's start-up noise, left out
    assert unpacked  # the executor ran in the shipped env
    assert dumped_counts(venv, job, tmp_path) == expected_counts(3000, 9)
