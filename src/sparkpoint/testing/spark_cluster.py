"""A Spark standalone cluster on loopback: one master and N workers from the pyspark package.

For tests: ``with StandaloneCluster(tmp_dir, workers=2) as cluster: cluster.master_url``.
Start-up waits, by polling the master's JSON status, until every worker has registered (never a
fixed sleep); stopping terminates every process it started, also when start-up fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any


def spark_home() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed")
    return Path(spec.origin).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneCluster:
    """A master and ``workers`` workers (each with ``cores`` cores), all on 127.0.0.1."""

    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        python: str | None = None,
    ) -> None:
        """``python``: the ``PYSPARK_PYTHON`` of the workers' environment (default: this
        interpreter)."""
        self.work_dir = work_dir
        self.python = python or sys.executable
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.worker_procs: list[subprocess.Popen[bytes]] = []

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(self.work_dir / "local"),
            PYSPARK_PYTHON=self.python,
            SPARK_NO_DAEMONIZE="1",
        )
        return env

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.work_dir / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env())
        self.procs.append(proc)
        return proc

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
            data: dict[str, Any] = json.loads(r.read())
            return data

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except (OSError, ValueError):  # not listening yet, or an empty answer while starting
            return 0

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for i in range(self.workers):
            self.worker_procs.append(self._spawn_worker(i))
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            for proc in self.procs:
                if proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"a Spark daemon exited early; logs in {self.work_dir}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"Spark workers did not register in {timeout}s; logs in {self.work_dir}"
                )
            time.sleep(0.2)
        return self

    def _spawn_worker(self, i: int) -> subprocess.Popen[bytes]:
        wdir = self.work_dir / f"worker-{i}"
        wdir.mkdir(exist_ok=True)
        return self._spawn(
            f"worker-{i}",
            "org.apache.spark.deploy.worker.Worker",
            self.master_url,
            "--host",
            "127.0.0.1",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--webui-port",
            "0",
            "--work-dir",
            str(wdir),
        )

    def restart_worker(self, index: int, timeout: float = 90.0) -> None:
        """Start worker ``index`` again (same work directory, so its disk is kept) and wait
        until every running worker is registered."""
        self.worker_procs[index] = self._spawn_worker(index)
        deadline = time.monotonic() + timeout
        while self.alive_workers() < sum(p.poll() is None for p in self.worker_procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {index} did not register again in {timeout}s")
            time.sleep(0.2)

    def add_worker(self, timeout: float = 90.0) -> int:
        """Start one more worker (like a host joining the cluster, also after one was killed);
        its index, once it has registered."""
        index = self.workers
        self.workers += 1
        want = self.alive_workers() + 1
        proc = self._spawn_worker(index)
        self.worker_procs.append(proc)
        deadline = time.monotonic() + timeout
        while self.alive_workers() < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {index} did not register in {timeout}s")
            time.sleep(0.2)
        return index

    def kill_worker(self, index: int, *, executors: bool = False) -> None:
        """Kill worker ``index`` at once, like a lost host. Its executors notice within
        seconds and exit; ``executors`` kills them at the same moment too (SIGKILL, found by
        their working directory under the worker's, on Linux)."""
        doomed = self.executor_pids(index) if executors else []
        proc = self.worker_procs[index]
        proc.kill()
        proc.wait()
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def executor_pids(self, index: int) -> list[int]:
        """The processes whose working directory is under worker ``index``'s (its executors)."""
        root = str((self.work_dir / f"worker-{index}").resolve())
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "cwd").startswith(root + os.sep):
                        out.append(int(entry.name))
        return out

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
