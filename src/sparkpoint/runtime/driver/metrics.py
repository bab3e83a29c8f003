"""Job and task metrics, kept by the driver from each batch's task results, and their reporters.

``metrics.reporters`` names the reporters (Samza's key), comma-separated:

* ``prometheus``: a Prometheus text endpoint at
  ``http://<metrics.reporter.prometheus.host>:<...port>/metrics`` (127.0.0.1:9464 by default),
  served by ``prometheus_client`` for as long as the driver runs;
* ``snapshot``: Samza-style metrics snapshots, JSON ``{"header": {...}, "metrics": {group:
  {name: value}}}``, written to ``metrics.reporter.snapshot.stream`` (default
  ``<coordinator system>.metrics``) every ``metrics.reporter.snapshot.interval.ms`` and when
  the job stops.

Every value lives in one ``prometheus_client`` registry per job (counters, gauges, and
summaries for timers); the snapshot reporter reads the same samples. Labels: ``job`` on every
metric, ``task`` on task metrics, ``store`` on state sizes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary, start_http_server

from sparkpoint.config import Config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream
from sparkpoint.runtime.driver.reports import Transactions
from sparkpoint.runtime.driver.supervise import RESTARTS_ENV
from sparkpoint.storage.restore import PROMOTED
from sparkpoint.system.base import Record
from sparkpoint.system.registry import Systems
from sparkpoint.system.streams import ensure_stream

if TYPE_CHECKING:
    from sparkpoint.runtime.driver.reports import BatchReport
    from sparkpoint.runtime.plan import TaskBatchResult

log = logging.getLogger(__name__)

REPORTERS = ("prometheus", "snapshot")
PREFIX = "sparkpoint_"


class JobMetrics:
    """The job's metrics, updated from every batch report (driver side)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.registry = CollectorRegistry(auto_describe=True)

        def task(kind: Any, name: str, what: str, labels: tuple[str, ...] = ("task",)) -> Any:
            return kind(f"{PREFIX}{name}", what, ["job", *labels], registry=self.registry)

        self.batches = task(Counter, "batches", "Batches run", ())
        self.batch_time = task(Summary, "batch_seconds", "Wall time of a batch on the driver", ())
        self.processed = task(Counter, "task_messages_processed", "Messages processed")
        self.sent = task(Counter, "task_messages_sent", "Messages sent")
        self.late = task(
            Counter, "task_late_messages", "Messages behind the task's watermark (event time)"
        )
        self.window_late = task(
            Counter,
            "task_window_late_records",
            "Window adds refused as late: every window they would join had closed (sent to "
            "the store's late_stream if it has one, else dropped)",
        )
        self.timers_fired = task(Counter, "task_timers_fired", "Timers that fired (on_timer)")
        self.dead_letters = task(
            Counter,
            "task_dead_letters",
            "Records sent to the dead-letter stream (task.dlq.stream), by reason",
            ("task", "reason"),
        )
        self.parts_staged = task(
            Counter,
            "task_output_parts_staged",
            "Exactly-once: output parts staged (one per batch and partition sent to)",
        )
        self.parts_open = task(
            Gauge,
            "task_output_parts_open",
            "Exactly-once: staged parts no written checkpoint names yet (open)",
        )
        self.published = task(
            Counter,
            "task_output_records_published",
            "Exactly-once: staged records published (committed)",
        )
        self.discarded = task(
            Counter,
            "output_parts_discarded",
            "Exactly-once: staged parts a start discarded (aborted: no checkpoint named them)",
            (),
        )
        self.tx_committed = task(
            Counter,
            "transactions_committed",
            "Staged output's transactions committed (a task's output between two commits, "
            "named by a written checkpoint; a DataFrame batch's, published)",
            (),
        )
        self.tx_aborted = task(
            Counter,
            "transactions_aborted",
            "Staged output's transactions aborted (dropped by a restore or a rewind; a "
            "DataFrame batch's output discarded)",
            (),
        )
        self.tx_open = task(
            Gauge,
            "transactions_open",
            "Staged output's transactions open (tasks with output no written checkpoint names "
            "yet, DataFrame batches not published yet)",
            (),
        )
        self._tx_seen = Transactions()  # the totals the counters hold (report.transactions)
        self.process_time = task(Counter, "task_process_seconds", "Time in the batch's work")
        self.lag = task(Gauge, "task_lag_messages", "Messages not yet read, over its SSPs")
        self.watermark = task(
            Gauge,
            "task_watermark_ms",
            "The task's event-time watermark (ms since the epoch) after its last batch that "
            "read event time",
        )
        self.commits = task(Counter, "task_commits", "Commits started")
        self.commit_sync = task(
            Summary, "task_commit_sync_seconds", "A commit's synchronous part (snapshot)"
        )
        self.commit_async = task(
            Summary, "task_commit_async_seconds", "From a commit's snapshot to its uploads done"
        )
        self.uploaded = task(Counter, "task_bytes_uploaded", "Bytes uploaded by commits")
        self.retained = task(
            Gauge, "task_bytes_retained", "Bytes the last commit kept from earlier snapshots"
        )
        self.restores = task(Counter, "task_restores", "Batches that restored the task's stores")
        self.restore_time = task(Counter, "task_restore_seconds", "Time spent restoring stores")
        self.restore_bytes = task(Counter, "task_restore_bytes", "Bytes restored into stores")
        self.away = task(
            Counter, "task_away", "Batches Spark ran the task away from its state's executor"
        )
        self.promotions = task(
            Counter, "task_promotions", "Batches that promoted a standby copy of the task"
        )
        self.standby_lag = task(
            Gauge,
            "task_standby_lag_records",
            "Changelog records the task's most current standby copy is behind its checkpoint",
        )
        self.standby_seconds = task(
            Counter, "standby_catch_up_seconds", "Time spent catching standby copies up", ()
        )
        self.state_bytes = task(
            Gauge, "task_state_bytes", "A persistent store's size on disk", ("task", "store")
        )
        self.driver_restarts = task(
            Gauge, "driver_restarts", "Times run --supervise restarted the job's driver", ()
        )
        self.driver_restarts.labels(job).set(int(os.environ.get(RESTARTS_ENV) or 0))

    def record(self, report: BatchReport) -> None:
        job = self.job
        self.batches.labels(job).inc()
        self.batch_time.labels(job).observe(report.seconds)
        for r in report.tasks:
            self._record_task(r)
        for task, parts in report.parts_open.items():
            self.parts_open.labels(job, task).set(parts)
        if report.parts_discarded:
            self.discarded.labels(job).inc(report.parts_discarded)
        tx, seen = report.transactions, self._tx_seen
        if tx.committed < seen.committed or tx.aborted < seen.aborted:
            seen = Transactions()  # the totals of another driver (a new coordinator)
        self.tx_committed.labels(job).inc(tx.committed - seen.committed)
        self.tx_aborted.labels(job).inc(tx.aborted - seen.aborted)
        self.tx_open.labels(job).set(tx.open)
        self._tx_seen = Transactions(tx.committed, tx.aborted)
        for task, lag in report.lag.items():
            self.lag.labels(job, task).set(lag)
        for move in report.away:
            self.away.labels(job, move.task).inc()
        for task, lag in report.standby.lags.items():
            self.standby_lag.labels(job, task).set(lag)
        self.standby_seconds.labels(job).inc(report.standby.seconds)

    def _record_task(self, r: TaskBatchResult) -> None:
        """One task's counts of the batch."""
        job = self.job
        labels = (job, r.task)
        self.processed.labels(*labels).inc(r.processed)
        self.sent.labels(*labels).inc(r.sent)
        self.late.labels(*labels).inc(r.late)
        self.window_late.labels(*labels).inc(r.window_late)
        self.timers_fired.labels(*labels).inc(r.timers_fired)
        if r.watermark_ms is not None:
            self.watermark.labels(*labels).set(r.watermark_ms)
        for reason, n in r.dead_letters.items():
            self.dead_letters.labels(*labels, reason).inc(n)
        self.parts_staged.labels(*labels).inc(r.parts_staged)
        self.published.labels(*labels).inc(r.records_published)
        self.process_time.labels(*labels).inc(r.process_seconds)
        if r.commit_started:
            self.commits.labels(*labels).inc()
            self.commit_sync.labels(*labels).observe(r.commit_seconds)
        for done in r.upload_metrics:
            self.commit_async.labels(*labels).observe(done.get("upload-ms", 0) / 1000)
            self.uploaded.labels(*labels).inc(done.get("bytes-uploaded", 0))
            if "bytes-retained" in done:
                self.retained.labels(*labels).set(done["bytes-retained"])
        restored = [s for s in r.restored if s.source != PROMOTED]
        if restored:
            self.restores.labels(*labels).inc()
            self.restore_time.labels(*labels).inc(sum(s.seconds for s in restored))
            self.restore_bytes.labels(*labels).inc(sum(s.bytes for s in restored))
        if len(restored) < len(r.restored):
            self.promotions.labels(*labels).inc()
        for store, size in r.state_bytes.items():
            self.state_bytes.labels(job, r.task, store).set(size)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Samza's ``metrics`` part: groups (``sparkpoint.job``, ``sparkpoint.task.<task>``)
        of ``name: value``; a summary gives ``<name>_count`` and ``<name>_sum``."""
        groups: dict[str, dict[str, float]] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                name = sample.name[len(PREFIX) :]
                task = sample.labels.get("task")
                group = "sparkpoint.job" if task is None else f"sparkpoint.task.{task}"
                if "store" in sample.labels:
                    name = f"{name}.{sample.labels['store']}"
                groups.setdefault(group, {})[name] = sample.value
        return groups


class MetricsReporters:
    """The reporters ``metrics.reporters`` names, fed by the coordinator after every batch."""

    def __init__(self, config: Config, systems: Systems) -> None:
        self.config = config
        self.metrics = JobMetrics(config.job_name)
        names = config.get_list("metrics.reporters")
        unknown = [n for n in names if n not in REPORTERS]
        if unknown:
            raise ConfigError(
                f"metrics.reporters: unknown reporter {unknown[0]!r}; known: {', '.join(REPORTERS)}"
            )
        self._server: Any = None
        #: where Prometheus scrapes this job (``http://host:port/metrics``), if it serves
        self.url: str | None = None
        if "prometheus" in names:
            host = config.get_str("metrics.reporter.prometheus.host") or "127.0.0.1"
            port = config.get_int("metrics.reporter.prometheus.port")
            try:
                self._server = start_http_server(port, host, registry=self.metrics.registry)
            except OSError as exc:
                raise ConfigError(
                    f"metrics.reporter.prometheus.port={port}: cannot serve metrics on "
                    f"{host}:{port} ({exc}); pick a free port"
                ) from exc
            bound_host, bound_port = self._server[0].server_address[:2]
            shown = socket.gethostname() if bound_host in ("0.0.0.0", "::") else bound_host
            self.url = f"http://{shown}:{bound_port}/metrics"  # the real port, also for port 0
            log.info("metrics: %s", self.url)
        self._snapshots = _SnapshotWriter(config, systems) if "snapshot" in names else None

    def on_batch(self, report: BatchReport) -> None:
        self.metrics.record(report)
        if self._snapshots is not None:
            self._snapshots.maybe_write(self.metrics)

    def close(self) -> None:
        if self._snapshots is not None:
            self._snapshots.write(self.metrics)
            self._snapshots = None
        if self._server is not None:
            server, _thread = self._server
            server.shutdown()
            server.server_close()
            self._server = None


class _SnapshotWriter:
    """Samza's MetricsSnapshotReporter: the metrics as one JSON message per interval."""

    def __init__(self, config: Config, systems: Systems) -> None:
        self.config = config
        self.systems = systems
        stream = config.get_str("metrics.reporter.snapshot.stream")
        self.stream = (
            SystemStream.parse(stream)
            if stream
            else SystemStream(config.coordinator_system, "metrics")
        )
        self.interval = config.get_int("metrics.reporter.snapshot.interval.ms") / 1000
        self.reset = int(time.time() * 1000)
        self._last = 0.0
        ensure_stream(config, systems, self.stream)

    def maybe_write(self, metrics: JobMetrics) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.write(metrics)

    def write(self, metrics: JobMetrics) -> None:
        self._last = time.monotonic()
        now = int(time.time() * 1000)
        snapshot = {
            "header": {
                "job-name": self.config.job_name,
                "job-id": self.config.job_id,
                "container-name": "driver",
                "source": "sparkpoint",
                "version": "0.0.1",
                "samza-version": "sparkpoint",
                "host": socket.gethostname(),
                "time": now,
                "reset-time": self.reset,
            },
            "metrics": metrics.snapshot(),
        }
        producer = self.systems.producer(self.stream.system)
        key = self.config.job_label.encode()
        producer.send(self.stream.stream, 0, Record("", key, json.dumps(snapshot).encode(), now))
        producer.flush()
