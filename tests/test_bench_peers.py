"""bench/peers/run.py's own checks: the shared input and the final-count check that makes
`make bench-peers` fail when a variant counts wrong."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import zlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_run", ROOT / "bench" / "peers" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_run"] = module
    spec.loader.exec_module(module)
    return module


peers = _load()

VARIANT = """
import json, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
counts = json.load(open(args["--data"] + "/../counts.json"))
counts["user-00000"] += int(args["--off-by"])
json.dump({"counts": counts, "first_output": time.time(), "finished": time.time()},
          open(args["--result"], "w"))
"""


def _run(tmp_path: Path, off_by: int) -> tuple[float, float]:
    data = tmp_path / "data"
    expected = peers.write_input(data, 500, 20, seed=3)
    (tmp_path / "counts.json").write_text(json.dumps(expected))
    script = tmp_path / "variant.py"
    script.write_text(VARIANT)
    variant = peers.Variant("fake", "project", str(script), ("--off-by", str(off_by)))
    args = argparse.Namespace(checkpoint_ms=1000, events=500)
    result: tuple[float, float] = peers.run_variant(
        variant, data, tmp_path / "work", args, expected
    )
    return result


def test_every_partition_holds_the_views_of_its_users(tmp_path: Path) -> None:
    expected = peers.write_input(tmp_path, 2000, 50, seed=1)
    seen = 0
    for p in range(peers.PARTITIONS):
        for line in (tmp_path / f"part-{p}.jsonl").open():
            user = json.loads(line)["user"]
            assert zlib.crc32(user.encode()) % peers.PARTITIONS == p
            seen += 1
    assert seen == sum(expected.values()) == 2000


def test_a_variant_with_the_right_counts_is_timed(tmp_path: Path) -> None:
    seconds, steady = _run(tmp_path, 0)
    assert seconds >= steady >= 0


def test_a_variant_with_a_wrong_count_fails_the_benchmark(tmp_path: Path) -> None:
    with pytest.raises(peers.CountError, match="fake: 1 users have wrong final counts"):
        _run(tmp_path, 1)
