"""Running through spark-submit: ``sparkpoint submit JOB --master local[2]`` runs
``spark-submit .../sparkpoint/__main__.py run JOB`` with the job file and its modules shipped,
the CLI takes spark-submit's master, and the example ends with exact state; the command for a
cluster with a shipped environment is what ``--dry-run`` prints; a missing archive fails
before spark-submit runs; ``python -m sparkpoint`` is the CLI."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.config import load_config, parse_overrides
from tests.e2e.cli import JOB, env, sp
from tests.helpers import committed_counts, generate


@pytest.mark.slow
def test_submit_runs_the_job_through_spark_submit(tmp_path: Path) -> None:
    sets = [f"job.data.dir={tmp_path / 'data'}"]
    set_args = [a for s in sets for a in ("--set", s)]
    config = load_config(JOB, parse_overrides(sets))
    sp("stream", "create", str(JOB), "pageviews", "--partitions", "4", *set_args)
    expected = generate(config, tmp_path / "job.yaml", 5_000, seed=14, users=50)
    result = sp("submit", str(JOB), "--master", "local[2]", "--until-caught-up", *set_args)
    assert "__main__.py run" in result.stderr  # the spark-submit command, shown
    run = result.stdout + result.stderr  # spark-submit merges its application's stderr
    assert "starting Spark (local[2])" in run  # spark-submit's master, taken
    assert "done (caught up)" in run
    assert committed_counts(config) == dict(expected)


@pytest.mark.parametrize("master", ["yarn", "k8s://https://k8s.example.com:6443"])
def test_dry_run_prints_the_cluster_command(tmp_path: Path, master: str) -> None:
    archive = tmp_path / "env.zip"
    archive.write_bytes(b"a packed env")
    result = sp(
        "submit",
        str(JOB),
        "--master",
        master,
        "--deploy-mode",
        "cluster",
        "--env-archive",
        str(archive),
        "--conf",
        "spark.executor.memory=2g",
        "--num-executors",  # any other option: spark-submit's
        "3",
        "--dry-run",
    )
    command = shlex.split(result.stdout)
    assert command[0].endswith("spark-submit")
    pairs = dict(zip(command[1:-3:2], command[2:-2:2], strict=False))
    assert pairs["--master"] == master and pairs["--deploy-mode"] == "cluster"
    assert pairs["--files"] == str(JOB.resolve())
    assert pairs["--py-files"].endswith("job-modules.zip")
    assert pairs["--archives"] == f"{archive}#environment"
    confs = [command[i + 1] for i, a in enumerate(command) if a == "--conf"]
    assert "spark.pyspark.python=./environment/bin/python" in confs
    assert "spark.pyspark.driver.python=./environment/bin/python" in confs
    assert "spark.executor.memory=2g" in confs
    assert pairs["--num-executors"] == "3"
    assert command[-3].endswith("sparkpoint/__main__.py")
    assert command[-2:] == ["run", "job.yaml"]  # cluster mode: the shipped file's name


def test_a_missing_archive_fails_before_spark_submit(tmp_path: Path) -> None:
    result = sp("submit", str(JOB), "--env-archive", str(tmp_path / "no.zip"), check=False)
    assert result.returncode == 2
    assert "--env-archive" in result.stderr and "does not exist" in result.stderr
    assert "spark-submit:" not in result.stderr


def test_a_module_that_cannot_be_shipped_fails_before_spark_submit(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB.read_text())
    (tmp_path / "gone.py").symlink_to(tmp_path / "nowhere" / "gone.py")
    result = sp("submit", str(job), "--dry-run", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot ship the job's module" in result.stderr and "gone.py" in result.stderr


def test_python_m_sparkpoint_is_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sparkpoint", "run", "--help"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
    )
    assert result.returncode == 0
    assert "--supervise" in result.stdout and "--log-format" in result.stdout
