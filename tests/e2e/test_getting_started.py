"""docs/getting-started.md's walk-through, run as written from an empty directory: its files,
its commands (through bash, with this venv's `sparkpoint` first on PATH), the outputs it shows,
and its test snippet under pytest (issue 37: the guide stopped at "write a job")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

GUIDE = ROOT / "docs" / "getting-started.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S)]


@pytest.mark.slow
def test_the_walk_through_runs_as_written(tmp_path: Path) -> None:
    text = GUIDE.read_text()
    walk = text[text.index("## Walk-through") : text.index("## Test it")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    last_out = ""
    checked = 0
    for lang, body in blocks(walk):
        first = body.splitlines()[0]
        if first.startswith("# file: "):
            (tmp_path / first[len("# file: ") :]).write_text(body)
        elif lang == "sh":
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", body],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, f"{body}\n{proc.stderr[-3000:]}"
            last_out = proc.stdout
        elif lang == "text":  # the output the guide shows for the commands before it
            want = body.strip().splitlines()
            assert last_out.strip().splitlines()[-len(want) :] == want, last_out
            checked += 1
    assert checked == 3
    # the guide's test, next to the job it wrote
    test = next(b for lang, b in blocks(text[text.index("## Test it") :]) if lang == "python")
    (tmp_path / "test_clicks.py").write_text(test)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_clicks.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
