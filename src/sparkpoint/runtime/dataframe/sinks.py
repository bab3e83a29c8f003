"""Where a DataFrame pipeline's rows go besides sparkpoint streams: the sink contract
(:class:`Sink`, and :class:`StagingSink` for exactly-once output), a sink made of a function
(:class:`FunctionSink`) and the Parquet sink with its commit protocol (:class:`ParquetSink`).

A user-facing module: it imports no runtime implementation (no Spark either: a sink is given
the DataFrame to write).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sparkpoint.errors import SparkpointError
from sparkpoint.fsutil import atomic_write, fsync_dir, fsync_tree

log = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    """Where a DataFrame output goes; called once per batch with its durable id. A sink that
    also has ``begin(epoch)`` is told, before each batch it writes, the epoch of the job's
    batch log (when it began): batch ids start at 1 again after ``sparkpoint job reset``, so
    a sink that skips the ids it wrote must tell a new epoch's from the old ones
    (:class:`ParquetSink` refuses to write over an earlier epoch's batches)."""

    def write(self, df: Any, batch_id: int) -> None: ...


@runtime_checkable
class StagingSink(Sink, Protocol):
    """A sink that can give exactly-once output (``job.processing.guarantee: exactly-once``):
    :meth:`stage` writes a batch where no reader sees it and returns a token; once every task's
    checkpoint covers the batch, the driver calls :meth:`publish` with that token (also after a
    restart, on the sink unpickled from the batch log), or :meth:`discard` when the batch's
    output is not to be published. Both must be idempotent."""

    def stage(self, df: Any, batch_id: int) -> str: ...

    def publish(self, batch_id: int, token: str) -> None: ...

    def discard(self, batch_id: int, token: str) -> None: ...


class FunctionSink:
    """A sink made of a function ``fn(df, batch_id)``."""

    def __init__(self, fn: Callable[[Any, int], None]) -> None:
        self.fn = fn

    def write(self, df: Any, batch_id: int) -> None:
        self.fn(df, batch_id)


class ParquetSink:
    """Parquet files under ``path/batch_id=<id>/``; a batch id it has committed is skipped.

    Each batch overwrites its own directory (a retry of an unfinished batch replaces its
    partial files) and then records its id in ``path/_sparkpoint/last-batch``; reading ``path``
    with Spark gives every batch once, with a ``batch_id`` column. A relative ``path`` is
    relative to the module that creates the sink (the pipeline's, next to its job file), as a
    pipeline's job file is, not to the current directory.

    With exactly-once (a :class:`StagingSink`) a batch is written under
    ``path/_sparkpoint/staged/batch_id=<id>-<random>/`` (Spark's own commit protocol keeps only
    the files of the task attempts that succeeded), and renamed to ``path/batch_id=<id>`` when
    the batch's checkpoints are written: readers never see a batch whose state was not
    committed, and an executor lost mid-batch leaves nothing behind but a staged directory that
    the next publish deletes.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._epoch: int | None = None  # the batch log's (:meth:`begin`)
        if not self.path.is_absolute():
            creator = sys._getframe(1).f_globals.get("__file__")  # the module calling us
            base = Path(creator).resolve().parent if creator else Path.cwd()
            self.path = base / self.path

    @property
    def _commit_file(self) -> Path:
        return self.path / "_sparkpoint" / "last-batch"

    def last_committed(self) -> int | None:
        return self._last()[0]

    def _last(self) -> tuple[int | None, int | None]:
        """The last batch id recorded and its batch log's epoch (None: not recorded)."""
        try:
            data = json.loads(self._commit_file.read_text())
        except FileNotFoundError:
            return None, None
        epoch = data.get("epoch")
        return int(data["batch"]), None if epoch is None else int(epoch)

    def begin(self, epoch: int) -> None:
        """The job's batch log epoch for the batches to come (:class:`Sink`). Batches recorded
        under another epoch are an earlier run's (before a ``job reset``, ids from 1 again):
        skipped as written, the new run's output would be lost, so this refuses, naming the
        directory to move away."""
        last, recorded = self._last()
        if last is not None and recorded is not None and recorded != epoch:
            raise SparkpointError(
                f"parquet sink {self.path} holds batches up to {last} of another run of the "
                f"job (batch log epoch {recorded}; this run's is {epoch}: the job was reset, or "
                f"another job writes here), which this run's batches would be skipped as. Move "
                f"or delete {self.path}, or give the sink another path, and run again"
            )
        self._epoch = epoch

    def _written(self, batch_id: int) -> bool:
        last = self.last_committed()
        if last is not None and batch_id <= last:
            log.info("parquet sink %s: batch %d already written; skipped", self.path, batch_id)
            return True
        return False

    def _record(self, batch_id: int) -> None:
        self._commit_file.parent.mkdir(parents=True, exist_ok=True)
        record: dict[str, int] = {"batch": batch_id}
        epoch = getattr(self, "_epoch", None)  # (a sink pickled before begin() existed)
        if epoch is not None:
            record["epoch"] = epoch
        atomic_write(self._commit_file, json.dumps(record).encode())

    def write(self, df: Any, batch_id: int) -> None:
        if self._written(batch_id):
            return
        df.write.mode("overwrite").parquet(str(self.path / f"batch_id={batch_id}"))
        self._record(batch_id)

    @property
    def _staged(self) -> Path:
        return self.path / "_sparkpoint" / "staged"

    def stage(self, df: Any, batch_id: int) -> str:
        """Write batch ``batch_id`` where no reader looks; its token ('' if written already)."""
        if self._written(batch_id):
            return ""
        token = f"batch_id={batch_id}-{uuid.uuid4().hex[:8]}"
        df.write.parquet(str(self._staged / token))
        fsync_tree(self._staged / token)  # durable before the batch log names it
        return token

    def publish(self, batch_id: int, token: str) -> None:
        """Rename the staged batch into place and record it; then delete older staged dirs."""
        if token and not self._written(batch_id):
            staged, final = self._staged / token, self.path / f"batch_id={batch_id}"
            if staged.is_dir():
                if final.exists():  # the partial files of an at-least-once run's crashed write
                    shutil.rmtree(final)
                os.replace(staged, final)
                fsync_dir(self.path)
            elif not final.is_dir():
                raise SparkpointError(
                    f"parquet sink {self.path}: batch {batch_id}'s staged files ({staged}) are "
                    "gone and the batch is not in place: its output is lost; restore the "
                    "directory, or reset the job's checkpoints to replay that input"
                )
            self._record(batch_id)
        for old in self._staged.glob("batch_id=*"):  # never recorded, discarded, or skipped
            if _staged_batch(old.name) <= batch_id:
                shutil.rmtree(old, ignore_errors=True)

    def discard(self, batch_id: int, token: str) -> None:
        if token:
            shutil.rmtree(self._staged / token, ignore_errors=True)

    def __repr__(self) -> str:
        return f"ParquetSink({str(self.path)!r})"


def _staged_batch(name: str) -> int:
    """The batch id of a staged directory ``batch_id=<id>-<random>``."""
    try:
        return int(name.removeprefix("batch_id=").partition("-")[0])
    except ValueError:
        return -1
