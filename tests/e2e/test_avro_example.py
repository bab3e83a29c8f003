"""``make example-avro``'s script runs as a user runs it: a registry started, Avro views
written, the job run, and the counts read back from the output equal the store's."""

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
    assert "4 tasks, 4 input partitions" in result.stderr + result.stdout
    assert "5000 views counted" in result.stdout
    assert "counts in Avro, read by confluent-kafka; all equal to the store's" in result.stdout
