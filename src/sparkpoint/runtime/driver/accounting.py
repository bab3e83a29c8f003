"""A run's accounting: each batch counted in the run's :class:`RunSummary`, shown to the
listener (the CLI's progress display) and recorded by the metrics reporters."""

from __future__ import annotations

from sparkpoint.runtime.driver.metrics import MetricsReporters
from sparkpoint.runtime.driver.reports import BatchReport, Listener, RunSummary


def count_batch(summary: RunSummary, report: BatchReport) -> None:
    """Add one batch to the run's summary."""
    summary.batches += 1
    summary.processed += report.processed
    summary.sent += report.sent
    summary.commits += int(report.committed)
    summary.batch_seconds += report.seconds
    summary.task_seconds += report.task_seconds
    summary.lag = report.lag
    count_restores(summary, report)
    summary.away += len(report.away)


def count_restores(summary: RunSummary, report: BatchReport) -> None:
    """Add a pass's restores to the run's summary (the restore ahead's is no batch)."""
    summary.restores += report.restored_tasks
    restored_bytes, restored_seconds = report.restore_cost()
    summary.restore_bytes += restored_bytes
    summary.restore_seconds += restored_seconds


def report_batch(
    summary: RunSummary,
    report: BatchReport,
    listener: Listener | None,
    reporters: MetricsReporters | None,
) -> None:
    """Count a batch in the run's summary, show it, and record its metrics."""
    count_batch(summary, report)
    if listener:
        listener.on_batch(report)
    if reporters is not None:
        reporters.on_batch(report)
