"""The README's testing snippet, run as a user would: from a directory outside the repository,
with nothing of the repository on the import path (issue 37: it failed there with "task.class
... cannot import it", because the job file's directory was not importable)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLE_DIR, ROOT


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Testing a job") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README's testing section has no python block"
    return match.group(1)


def test_the_readme_testing_snippet_runs_from_anywhere(tmp_path: Path) -> None:
    snippet = readme_snippet()
    assert '"examples/pageviews/job.yaml"' in snippet  # the one thing a user adapts: the path
    test_file = tmp_path / "test_mine.py"
    test_file.write_text(
        snippet.replace("examples/pageviews/job.yaml", str(EXAMPLE_DIR / "job.yaml"))
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
