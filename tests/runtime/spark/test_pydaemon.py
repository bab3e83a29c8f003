"""sparkpoint's Python worker daemon: workers import pyspark from the installed package (with
its cached bytecode), not from the copy Spark zips into the same package."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyspark

from sparkpoint.runtime.spark.pydaemon import installed_package_zips

PACKAGE = Path(pyspark.__file__).resolve().parent


def test_only_zips_inside_the_installed_package_leave_the_path(tmp_path: Path) -> None:
    inside = [str(PACKAGE / "python" / "lib" / "pyspark.zip"), str(PACKAGE / "lib" / "py4j.zip")]
    elsewhere = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")  # SPARK_HOME
    path = [inside[0], elsewhere, "/usr/lib/python311.zip", str(PACKAGE.parent), inside[1]]
    assert installed_package_zips(path) == inside


def _worker(_: int) -> tuple[str, int, list[str]]:
    import sys

    import pyspark.worker

    return pyspark.worker.__file__ or "", threading.active_count(), list(sys.modules)


def test_spark_workers_import_pyspark_from_the_installed_package(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.python.daemon.module") == "sparkpoint.runtime.spark.pydaemon"
    workers = spark.sparkContext.parallelize(range(2), 2).map(_worker).collect()
    for file, threads, modules in workers:
        assert ".zip" not in file, file
        assert Path(file).resolve().is_relative_to(PACKAGE)
        assert threads == 1  # nothing imported before the fork started a thread
        assert "sparkpoint.runtime.executor.task_batch" in modules  # imported once, by the daemon
