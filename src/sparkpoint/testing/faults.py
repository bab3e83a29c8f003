"""Fault injection for tests and the soak: a blob store and a system that fail on purpose.

Nothing in the product imports this module; a job opts in through its config:

* ``blob.store.manager.factory: sparkpoint.testing.faults:flaky_blob_store`` makes the blob
  store fail ``testing.blob.fail.ratio`` of its operations (an ``OSError``, retried like any
  transient error), stop ``testing.blob.partial.ratio`` of its uploads half-way (half the bytes
  written, then an error) and delay every operation by ``testing.blob.delay.ms``;
* ``systems.<s>.factory: sparkpoint.testing.faults:FlakyFileLogSystemFactory`` is the filelog
  system whose consumers and producers fail ``testing.system.fail.ratio`` of their ``read``,
  ``send`` and ``flush`` calls (the batch fails and Spark retries it).

``testing.faults.seed`` makes the failures repeatable. The named crash points of the commit and
restore sequences are the product's own: see :mod:`sparkpoint.failpoints`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkpoint.model import SystemStreamPartition
from sparkpoint.storage.blobstore.manager import BlobStoreManager, manager_from_config
from sparkpoint.system.base import (
    Record,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
)
from sparkpoint.system.filelog.system import FileLogSystemFactory


class InjectedFault(OSError):
    """A failure injected by the fault kit: transient, as the driver's retries see it."""

    transient = True


class _Dice:
    """Thread-safe random decisions with an optional seed."""

    def __init__(self, config: Mapping[str, str]) -> None:
        seed = config.get("testing.faults.seed")
        self._random = random.Random(None if seed is None else int(seed))
        self._lock = threading.Lock()

    def roll(self, ratio: float) -> bool:
        if ratio <= 0:
            return False
        with self._lock:
            return self._random.random() < ratio


class _FlakyFilesystem:
    """An fsspec filesystem proxy whose data operations fail, stall or stop half-way."""

    def __init__(self, fs: Any, config: Mapping[str, str]) -> None:
        self._fs = fs
        self._dice = _Dice(config)
        self.fail_ratio = float(config.get("testing.blob.fail.ratio", "0"))
        self.partial_ratio = float(config.get("testing.blob.partial.ratio", "0"))
        self.delay = int(config.get("testing.blob.delay.ms", "0")) / 1000
        self.injected = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def _maybe_fail(self, what: str) -> None:
        if self.delay:
            time.sleep(self.delay)
        if self._dice.roll(self.fail_ratio):
            self.injected += 1
            raise InjectedFault(f"injected blob store failure in {what}")

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        self._maybe_fail("put_file")
        if self._dice.roll(self.partial_ratio):
            self.injected += 1
            data = Path(lpath).read_bytes()
            self._fs.pipe_file(rpath, data[: len(data) // 2])
            raise InjectedFault(f"injected partial upload of {lpath}")
        self._fs.put_file(lpath, rpath, **kwargs)

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self._maybe_fail("pipe_file")
        self._fs.pipe_file(path, value, **kwargs)

    def get_file(self, rpath: str, lpath: str, **kwargs: Any) -> None:
        self._maybe_fail("get_file")
        self._fs.get_file(rpath, lpath, **kwargs)

    def cat_file(self, path: str, **kwargs: Any) -> bytes:
        self._maybe_fail("cat_file")
        data: bytes = self._fs.cat_file(path, **kwargs)
        return data

    def exists(self, path: str, **kwargs: Any) -> bool:
        self._maybe_fail("exists")
        return bool(self._fs.exists(path, **kwargs))

    def rm_file(self, path: str) -> None:
        self._maybe_fail("rm_file")
        self._fs.rm_file(path)


def flaky_blob_store(config: Mapping[str, str], default_url: str) -> BlobStoreManager:
    """A blob store manager (``blob.store.manager.factory``) whose operations fail on purpose."""
    manager = manager_from_config({**config, "blob.store.manager.factory": "fsspec"}, default_url)
    manager.fs = _FlakyFilesystem(manager.fs, config)
    return manager


class _FlakyConsumer(SystemConsumer):
    def __init__(self, inner: SystemConsumer, dice: _Dice, ratio: float) -> None:
        self._inner, self._dice, self._ratio = inner, dice, ratio

    def register(self, ssp: SystemStreamPartition, offset: str) -> None:
        self._inner.register(ssp, offset)

    def read(
        self, ssp: SystemStreamPartition, start: str, end: str, max_records: int | None = None
    ) -> Sequence[Record]:
        if self._dice.roll(self._ratio):
            raise InjectedFault(f"injected fetch failure reading {ssp} from offset {start}")
        return self._inner.read(ssp, start, end, max_records)

    def skipped_through(self, ssp: SystemStreamPartition) -> str | None:
        return self._inner.skipped_through(ssp)

    def close(self) -> None:
        self._inner.close()


class _FlakyProducer(SystemProducer):
    def __init__(self, inner: SystemProducer, dice: _Dice, ratio: float) -> None:
        self._inner, self._dice, self._ratio = inner, dice, ratio

    def send(self, stream: str, partition: int, record: Record) -> None:
        if self._dice.roll(self._ratio):
            raise InjectedFault(f"injected produce failure to {stream}.{partition}")
        self._inner.send(stream, partition, record)

    def send_many(self, stream: str, partition: int, records: Iterable[Record]) -> None:
        if self._dice.roll(self._ratio):
            raise InjectedFault(f"injected produce failure to {stream}.{partition}")
        self._inner.send_many(stream, partition, records)

    def flush(self) -> None:
        if self._dice.roll(self._ratio):
            raise InjectedFault("injected flush failure")
        self._inner.flush()

    def close(self) -> None:
        self._inner.close()


class FlakyFileLogSystemFactory(SystemFactory):
    """The filelog system, with consumers and producers that fail on purpose."""

    def __init__(self) -> None:
        self._inner = FileLogSystemFactory()

    def _dice(self, config: Mapping[str, str]) -> tuple[_Dice, float]:
        return _Dice(config), float(config.get("testing.system.fail.ratio", "0"))

    def get_admin(self, system: str, config: Mapping[str, str]) -> SystemAdmin:
        return self._inner.get_admin(system, config)

    def get_consumer(self, system: str, config: Mapping[str, str]) -> SystemConsumer:
        return _FlakyConsumer(self._inner.get_consumer(system, config), *self._dice(config))

    def get_producer(self, system: str, config: Mapping[str, str]) -> SystemProducer:
        return _FlakyProducer(self._inner.get_producer(system, config), *self._dice(config))
