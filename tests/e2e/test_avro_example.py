"""``make example-avro``'s script runs as a user runs it: a registry started, Avro views
written with one JSON view among them, the job run (the JSON view goes to the dead-letter
stream), the letter shown and replayed where JSON views belong, the job run again, and the
counts read back from the output equal the store's, the replayed view counted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "avro" / "run_example.py"


def test_the_avro_example_runs_and_its_output_equals_its_store() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARKPOINT_SCHEMA_REGISTRY_URL"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env={**env, "EVENTS": "5000"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stderr + result.stdout
    assert "4 tasks, 8 input partitions" in out
    assert "; 1 dead letter (1 decode)" in out  # the JSON view, set aside in the first run
    assert "1 dead letter\n" in out and "not in the Schema Registry wire format" in out
    assert "wrote 1 to filelog.pageviews-legacy" in out
    assert "5001 views counted" in result.stdout  # the replayed view counted too
    assert "counts in Avro, read by confluent-kafka; all equal to the store's" in result.stdout
