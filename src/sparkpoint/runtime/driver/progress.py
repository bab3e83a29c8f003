"""Progress of a running job: a live table on a terminal, one log line per batch otherwise
(:class:`ProgressDisplay`), or one JSON object per line (:class:`JsonProgress`,
``--log-format json``).

Shows the batch number, messages/s, lag per task, commit time and any state restores, then a
summary at the end. Writes to stderr so that stdout stays free for data.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from sparkpoint.model import JobModel, SystemStreamPartition
from sparkpoint.runtime.driver.logs import json_line
from sparkpoint.runtime.driver.reports import BatchReport, RunSummary
from sparkpoint.storage.restore import LOCAL, PROMOTED

log = logging.getLogger(__name__)


class ProgressDisplay:
    """A :class:`~sparkpoint.runtime.driver.coordinator.Listener` that shows progress."""

    def __init__(self, console: Console | None = None, *, live: bool | None = None) -> None:
        # one line per batch in logs, never wrapped at 80 columns (greppable)
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.live_enabled = self.console.is_terminal if live is None else live
        self._live: Live | None = None
        self._last: BatchReport | None = None
        self._rate = 0.0
        self._started = time.monotonic()
        self._restores: list[str] = []
        self.model: JobModel | None = None

    def on_start(self, model: JobModel) -> None:
        self.model = model
        self._started = time.monotonic()
        self.console.print(
            f"[bold]{model.job_name}[/] ({model.job_id}): {len(model.tasks)} tasks, "
            f"{sum(len(t.ssps) for t in model.tasks.values())} input partitions"
        )
        if self.live_enabled:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4)
            self._live.start()

    def _table(self) -> Table:
        table = Table(title="sparkpoint", expand=False)
        for col in ("batch", "msgs/s", "batch s", "commit ms", "total lag", "restored", "away"):
            table.add_column(col, justify="right")
        table.add_column("lag per task")
        r = self._last
        if r is not None:
            lag = " ".join(f"{t.split()[-1]}:{n}" for t, n in sorted(r.lag.items()))
            table.add_row(
                str(r.batch),
                f"{self._rate:,.0f}",
                f"{r.seconds:.2f}",
                f"{r.commit_seconds * 1000:.0f}" if r.committed else "-",
                f"{sum(r.lag.values()):,}",
                str(r.restored_tasks),
                str(len(r.away)),
                lag,
            )
        for line in self._restores[-4:]:
            table.caption = line
        return table

    def on_startpoint(self, task: str, ssp: SystemStreamPartition, offset: str, what: str) -> None:
        self.console.print(
            f"startpoint: {task} reads {ssp} from offset {offset} ({what})", highlight=False
        )

    def on_batch(self, report: BatchReport) -> None:
        self._last = report
        self._rate = report.processed / report.seconds if report.seconds > 0 else 0.0
        for task, info in report.restored:
            if not info.brought_state and info.source != PROMOTED:
                continue  # a fresh start: nothing was restored
            how = " hard-linked" if info.source == LOCAL else ""
            line = (
                f"restore {task} store {info.store}: {info.source}, {info.entries:,} {info.unit}, "
                f"{info.bytes:,} bytes{how}, {info.seconds:.2f}s"
            )
            if info.source == PROMOTED:
                line = (
                    f"promote {task} store {info.store}: its standby copy, replayed "
                    f"{info.entries:,} changelog records after it, {info.seconds:.2f}s"
                )
            self._restores.append(line)
            log.info(line)
            if self._live is None:
                self.console.print(line, highlight=False)
        if report.ahead:  # no batch: the tasks' state, ready before the first one
            self._last = None
            self.console.print(state_ready(report), highlight=False)
        elif self._live is not None:
            self._live.update(self._table())
        else:
            lag = sum(report.lag.values())
            commit = f" commit {report.commit_seconds * 1000:.0f} ms" if report.committed else ""
            up = report.uploads
            if "files-uploaded" in up:
                commit += (
                    f" (uploaded {up['files-uploaded']} files,"
                    f" {up.get('bytes-uploaded', 0):,} bytes,"
                    f" kept {up.get('bytes-retained', 0):,} bytes)"
                )
            self.console.print(
                f"batch {report.batch}: {report.processed} msgs in {report.seconds:.2f}s "
                f"({self._rate:,.0f}/s), lag {lag}{stages_note(report)}{commit}"
                f"{placement_note(report)}{dead_letters_note(report)}",
                highlight=False,
            )

    def on_end(self, summary: RunSummary) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        rate = summary.processed / summary.seconds if summary.seconds > 0 else 0.0
        self.console.print(
            f"[bold]done[/] ({summary.stopped_by or 'finished'}): {summary.batches} batches, "
            f"{summary.processed:,} messages in {summary.seconds:.1f}s ({rate:,.0f}/s), "
            f"{summary.sent:,} sent, {summary.commits} commits, "
            f"lag {sum(summary.lag.values()):,}; {summary.restores} task restores "
            f"({summary.restore_bytes:,} bytes, {summary.restore_seconds:.1f}s), "
            f"{summary.away} ran away from their state"
        )


class JsonProgress:
    """A :class:`~sparkpoint.runtime.driver.coordinator.Listener` that writes each event as a
    JSON line on stderr (:func:`~sparkpoint.runtime.driver.logs.json_line`)."""

    def __init__(self, job: str) -> None:
        self.job = job

    def say(self, message: str, **fields: Any) -> None:
        """One line: ``message`` with ``fields``."""
        print(
            json_line("INFO", message, logger="sparkpoint.progress", job=self.job, **fields),
            file=sys.stderr,
            flush=True,
        )

    def on_start(self, model: JobModel) -> None:
        inputs = sum(len(t.ssps) for t in model.tasks.values())
        self.say(
            f"{model.job_name} ({model.job_id}): {len(model.tasks)} tasks, {inputs} input "
            "partitions",
            event="start",
            tasks=len(model.tasks),
        )

    def on_startpoint(self, task: str, ssp: SystemStreamPartition, offset: str, what: str) -> None:
        self.say(
            f"startpoint: {task} reads {ssp} from offset {offset} ({what})",
            event="startpoint",
            task=task,
        )

    def on_batch(self, report: BatchReport) -> None:
        for task, info in report.restored:
            if info.brought_state or info.source == PROMOTED:
                self.say(
                    f"restore {task} store {info.store}: {info.source}",
                    event="promote" if info.source == PROMOTED else "restore",
                    task=task,
                    batch=report.batch,
                    bytes=info.bytes,
                    seconds=round(info.seconds, 3),
                )
        if report.ahead:
            self.say(state_ready(report), event="state-ready", seconds=round(report.seconds, 3))
            return
        self.say(
            f"batch {report.batch}: {report.processed} msgs in {report.seconds:.2f}s",
            event="batch",
            batch=report.batch,
            processed=report.processed,
            seconds=round(report.seconds, 3),
            lag=sum(report.lag.values()),
            committed=report.committed,
            **({"dead_letters": report.dead_letters} if report.dead_letters else {}),
            **(
                {"stages": [{"role": r, "stream": s, "lag": n} for r, s, n in report.stages]}
                if report.stages
                else {}
            ),
        )

    def on_end(self, summary: RunSummary) -> None:
        self.say(
            f"done ({summary.stopped_by or 'finished'}): {summary.batches} batches, "
            f"{summary.processed:,} messages",
            event="done",
            batches=summary.batches,
            processed=summary.processed,
            commits=summary.commits,
            seconds=round(summary.seconds, 3),
        )


def placement_note(report: BatchReport) -> str:
    """``; 2 restored (1,024 bytes, 0.31s), 1 away from its state`` (empty when neither)."""
    parts = []
    if report.promoted_tasks:
        records, seconds = report.promotion_cost()
        parts.append(
            f"{report.promoted_tasks} promoted (replayed {records:,} changelog records, "
            f"{seconds:.2f}s)"
        )
    if report.restored_tasks:
        restored_bytes, seconds = report.restore_cost()
        parts.append(f"{report.restored_tasks} restored ({restored_bytes:,} bytes, {seconds:.2f}s)")
    standby = report.standby
    if standby.seeded or standby.caught_up:
        parts.append(
            f"standbys: {standby.seeded} seeded, {standby.caught_up} caught up "
            f"({standby.records:,} records, {standby.seconds:.2f}s)"
        )
    if report.away:
        parts.append(f"{len(report.away)} away from their state")
    return "; " + ", ".join(parts) if parts else ""


def stages_note(report: BatchReport) -> str:
    """`` (input filelog.in 0, intermediate filelog.by-user 120; staged parts: 2 to commit, 4
    to publish)`` for a job of stages (intermediate streams): each input's messages not read
    yet, and the staged parts no written checkpoint names yet (to commit) or that the next
    batch publishes; empty for any other job."""
    if not report.stages:
        return ""
    lags = ", ".join(f"{role} {stream} {lag:,}" for role, stream, lag in report.stages)
    open_ = sum(report.parts_open.values())
    return f" ({lags}; staged parts: {open_} to commit, {report.parts_to_publish} to publish)"


def state_ready(report: BatchReport) -> str:
    """The line of the restore ahead's pass: each task's state established before the first
    batch (restored, or kept on disk)."""
    restored = len({task for task, info in report.restored if info.brought_state})
    how = f", {restored} restored" if restored else ""
    return f"state ready: {len(report.tasks)} tasks{how}, in {report.seconds:.2f}s"


def dead_letters_note(report: BatchReport) -> str:
    """``; 3 dead letters (2 decode, 1 process)``, or nothing."""
    dead = report.dead_letters
    if not dead:
        return ""
    total = sum(dead.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(dead.items()))
    return f"; {total} dead letter{'s' if total != 1 else ''} ({reasons})"
