"""Metrics (issue 16): a Prometheus endpoint scraped while a job runs, Samza-style snapshots on
a stream, and config errors that name the key."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sparkpoint.config import load_config
from sparkpoint.errors import ConfigError
from sparkpoint.model import SystemStream
from sparkpoint.runtime.driver.coordinator import JobCoordinator
from sparkpoint.runtime.driver.inline import InlineRunner
from sparkpoint.runtime.driver.metrics import MetricsReporters
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import read_json_lines
from tests.conftest import pageviews_config
from tests.helpers import generate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        m = re.match(r"^(sparkpoint_\w+)(\{[^}]*\})? (\S+)$", line)
        if m:
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == name)


def test_the_prometheus_endpoint_is_scraped_during_a_run_and_snapshots_are_written(
    tmp_path: Path,
) -> None:
    port = free_port()
    values = pageviews_config(
        tmp_path,
        **{
            "metrics.reporters": "prometheus,snapshot",
            "metrics.reporter.prometheus.port": str(port),
            "metrics.reporter.snapshot.interval.ms": "0",
            "stores.user-counts.changelog": "filelog.user-counts-changelog",
            "task.batch.max.messages": "100",
            "task.commit.ms": "0",
            "task.poll.interval.ms": "20",
        },
    )
    config = load_config(None, values)
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 4))
    expected = generate(config, tmp_path / "a.yaml", 2000, seed=81)
    coordinator = JobCoordinator(config, InlineRunner())
    thread = threading.Thread(target=coordinator.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    samples: dict[str, float] = {}
    while total(samples, "sparkpoint_task_messages_processed_total") < 2000:  # the job runs on
        assert thread.is_alive() and time.monotonic() < deadline, samples
        time.sleep(0.05)
        try:
            samples = scrape(port)
        except OSError:
            continue  # not serving yet
    assert sum(expected.values()) == 2000
    assert total(samples, "sparkpoint_task_messages_sent_total") == 2000  # one count per view
    assert total(samples, "sparkpoint_batches_total") >= 5
    assert samples['sparkpoint_task_lag_messages{job="pageviews",task="Partition 0"}'] == 0
    assert total(samples, "sparkpoint_task_commits_total") >= 4
    assert total(samples, "sparkpoint_task_commit_sync_seconds_count") >= 4
    assert total(samples, "sparkpoint_task_state_bytes") > 0
    coordinator.stop("test")
    thread.join(30)
    coordinator.close()
    with pytest.raises(OSError):
        scrape(port)  # the endpoint stops with the job
    rows = list(read_json_lines(config, Systems(config), SystemStream("filelog", "metrics")))
    last = rows[-1]["value"]
    assert last["header"]["job-name"] == "pageviews" and last["header"]["reset-time"] > 0
    processed = [
        group["task_messages_processed_total"]
        for name, group in last["metrics"].items()
        if name.startswith("sparkpoint.task.")
    ]
    assert sum(processed) == 2000 and len(processed) == 4
    assert json.dumps(last)  # plain JSON, as Samza's MetricsSnapshotSerdeV2 writes


def test_metrics_config_errors_name_the_key(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path, **{"metrics.reporters": "graphite"}))
    Systems(config).admin("filelog").create_stream(StreamSpec("pageviews", 1))
    with pytest.raises(ConfigError, match="metrics.reporters: unknown reporter 'graphite'"):
        JobCoordinator(config, InlineRunner()).start()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        values = {"metrics.reporters": "prometheus", "metrics.reporter.prometheus.port": str(port)}
        taken = load_config(None, pageviews_config(tmp_path, **values))
        with pytest.raises(ConfigError, match=rf"metrics.reporter.prometheus.port={port}"):
            JobCoordinator(taken, InlineRunner()).start()
    with pytest.raises(ConfigError, match="unknown config key metrics.reporter.prometheus.prot"):
        load_config(None, {"job.name": "j", "metrics.reporter.prometheus.prot": "1"})


def test_the_metrics_url_names_the_port_it_serves_on(tmp_path: Path) -> None:
    """Issue 37: the Prometheus URL was never printed (`sparkpoint run` prints this one); with
    port 0 the log said port 0."""
    values = pageviews_config(
        tmp_path, **{"metrics.reporters": "prometheus", "metrics.reporter.prometheus.port": "0"}
    )
    config = load_config(None, values)
    reporters = MetricsReporters(config, Systems(config))
    try:
        assert reporters.url is not None and reporters.url.startswith("http://127.0.0.1:")
        assert not reporters.url.startswith("http://127.0.0.1:0/")
        with urllib.request.urlopen(reporters.url, timeout=10) as response:
            assert b"sparkpoint" in response.read()
    finally:
        reporters.close()
