"""The public API (issue 16): everything a job needs imports from ``sparkpoint``, and every
Python snippet in the README runs as shown."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sparkpoint
from tests.conftest import ROOT


def test_every_public_name_resolves_and_import_stays_light() -> None:
    for name in sparkpoint.__all__:
        assert getattr(sparkpoint, name) is not None, name
    assert set(sparkpoint.__all__) <= set(dir(sparkpoint))
    probe = "import sys, sparkpoint; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # Spark loads on first use of a DataFrame name


def readme_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_every_readme_python_snippet_runs_as_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snippets = readme_snippets()
    assert len(snippets) >= 2
    defined: dict[str, Any] = {}
    for snippet in snippets:
        namespace: dict[str, Any] = {"__name__": "readme"}
        exec(compile(snippet, "README.md", "exec"), namespace)
        defined.update(namespace)
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository
    tests = {name: fn for name, fn in defined.items() if name.startswith("test_")}
    assert tests  # the README's example test
    for name, fn in tests.items():
        (tmp_path / name).mkdir()
        fn(tmp_path / name)
    assert issubclass(defined["PageViewCounter"], sparkpoint.StreamTask)
    assert isinstance(defined["job"], sparkpoint.Pipeline)
    # the task snippet counts, as its README text says
    from sparkpoint.testing import JobTestDriver

    config = {
        "job.name": "readme",
        "systems.filelog.factory": "filelog",
        "task.inputs": "filelog.pageviews",
        "stores.user-counts.factory": "rocksdb",
        "stores.user-counts.key.serde": "string",
        "stores.user-counts.msg.serde": "integer",
    }
    with JobTestDriver(config, tmp_path, task=defined["PageViewCounter"]) as job:
        job.send("pageviews", [{"user": "ann"}, {"user": "bob"}, {"user": "ann"}])
        job.run()
        assert job.store("user-counts") == {"ann": 2, "bob": 1}
        assert [m.value["count"] for m in job.output("user-counts")] == [1, 1, 2]
