"""The Spark driver's class-data-sharing archive: made at install, used when present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkpoint.config import Config
from sparkpoint.runtime.spark import jvm_archive
from sparkpoint.runtime.spark import session as spark


def _driver_options(
    monkeypatch: pytest.MonkeyPatch, archive: Path, master: str = "local[2]", **config: str
) -> str:
    """The driver JVM options both spark_session and spark_context start Spark with."""
    monkeypatch.setattr(jvm_archive, "archive_path", lambda: archive)
    _master, settings = spark.spark_settings(Config({"job.name": "j", **config}), master)
    return settings["spark.driver.extraJavaOptions"]


def test_the_driver_maps_the_archive_only_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    archive = tmp_path / "spark.jsa"
    assert "SharedArchiveFile" not in _driver_options(monkeypatch, archive)
    archive.write_bytes(b"archive")
    options = _driver_options(monkeypatch, archive)
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-Dlog4j2.configurationFile=" in options  # what was there stays
    off = _driver_options(monkeypatch, archive, **{"job.spark.class.archive": "false"})
    assert "SharedArchiveFile" not in off


def test_a_local_driver_jvm_starts_with_the_quick_jit_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    archive = tmp_path / "none.jsa"
    assert spark.QUICK_JIT in _driver_options(monkeypatch, archive).split()
    off = _driver_options(monkeypatch, archive, **{"job.spark.driver.quick.jit": "false"})
    assert spark.QUICK_JIT not in off
    cluster = _driver_options(monkeypatch, archive, master="spark://127.0.0.1:7077")
    assert spark.QUICK_JIT not in cluster  # a cluster's driver keeps C2
    assert "-Dlog4j2.configurationFile=" in cluster


@pytest.mark.skipif(not os.environ.get("CI"), reason="the install check is for CI's fresh set-up")
def test_the_install_made_the_archive() -> None:
    """scripts/bootstrap.sh makes it; without it every Spark start is seconds slower."""
    path = jvm_archive.archive_path()
    assert path.is_file(), f"no JVM class archive at {path}: see .venv/jvm-archive.log"
    assert path.stat().st_size > 10_000_000
