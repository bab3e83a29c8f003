"""The job's own modules on a session someone else started (a notebook's): which modules are
the job's, how they are packed, and how an edited one replaces the version a process imported
before (the driver's side, which ships them: :mod:`sparkpoint.runtime.driver.callers_session`).

- **Which:** the modules the job imports from its directory, found from its imports (the task
  class's or the pipeline's module, and any other ``module:attr`` value of the config that
  names a module there, then what those import from there): never every ``*.py`` beside it.
- **How they ship:** one zip named by the hash of their names and contents
  (``sparkpoint-job-<version>.zip``), added to the session (``addPyFile``). Spark keeps the first
  file of a name it was given, so an edited module ships under a new name; the pipeline's
  modules are also pickled by value (its steps' functions travel with the plan).
- **How an edit takes effect:** the run's config carries the names and the version
  (``job.modules``, ``job.modules.version``); a process that imported another version of them
  (the notebook's own, a reused Python worker) forgets them before it loads the job's code,
  so that the next import reads the new version.

May import the config, :mod:`sparkpoint.worker` and the standard library; no Spark.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from modulefinder import ModuleFinder
from pathlib import Path

from sparkpoint import worker
from sparkpoint.config import Config

#: the job's modules, comma separated, and their version: set by a run, not by the user
MODULES = "job.modules"
VERSION = "job.modules.version"

#: packages never shipped or forgotten as the job's, wherever they live
_NEVER = frozenset({"sparkpoint", "pyspark", "__main__"})
_REFERENCE = re.compile(r"^([A-Za-z_][\w.]*):[A-Za-z_]\w*$")


@dataclass(frozen=True)
class JobModules:
    """The job's modules: each name's file under ``directory``, and their version."""

    directory: Path
    files: dict[str, Path]
    version: str

    def settings(self) -> dict[str, str]:
        """The config values that tell a process which modules to forget on a new version."""
        return {MODULES: ",".join(sorted(self.files)), VERSION: self.version}


def _roots(config: Config, pipeline_module: str | None) -> list[str]:
    roots = [pipeline_module] if pipeline_module else []
    task = config.get_str("task.class")
    if task:
        roots.append(task.partition(":")[0] if ":" in task else task.rpartition(".")[0])
    for value in config.values():
        match = _REFERENCE.match(str(value))
        if match:
            roots.append(match.group(1))
    return list(dict.fromkeys(r for r in roots if r))


def _under(path: str | None, directory: Path) -> Path | None:
    if not path:
        return None
    resolved = Path(path).resolve()
    return resolved if resolved.is_relative_to(directory) else None


def find(config: Config, directory: Path, pipeline_module: str | None = None) -> JobModules:
    """The modules of ``directory`` the job imports (see the module docstring); an import the
    finder cannot see (one a function makes by name at run time) is not among them: such a
    module is read from the job's directory, as any module on the workers' path."""
    directory = directory.resolve()
    finder = ModuleFinder(path=[str(directory)])
    for root in _roots(config, pipeline_module):
        try:
            finder.import_hook(root)
        except (ImportError, SyntaxError):
            continue  # not a module of the directory (an installed one), or broken: said later
    files: dict[str, Path] = {}
    for name, found in finder.modules.items():
        path = _under(getattr(found, "__file__", None), directory)
        if path is not None and name.partition(".")[0] not in _NEVER:
            files[name] = path
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name].relative_to(directory)}\0".encode())
        digest.update(files[name].read_bytes())
    return JobModules(directory, files, digest.hexdigest()[:12])


def zipped(modules: JobModules, staging: Path | None = None) -> Path:
    """The modules as one zip named by their version, made once (kept for the session's
    workers to fetch)."""
    staging = staging or Path(tempfile.gettempdir()) / f"sparkpoint-job-modules-{os.getuid()}"
    staging.mkdir(parents=True, exist_ok=True)
    target = staging / f"sparkpoint-job-{modules.version}.zip"
    if not target.exists():
        tmp = target.with_name(f".{target.name}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(set(modules.files.values())):
                archive.write(path, str(path.relative_to(modules.directory)))
            for package in _package_dirs(modules):
                init = package / "__init__.py"
                if init.exists() and init not in modules.files.values():
                    archive.write(init, str(init.relative_to(modules.directory)))
        tmp.replace(target)
    return target


def _package_dirs(modules: JobModules) -> set[Path]:
    return {
        parent
        for path in modules.files.values()
        for parent in path.parents
        if parent != modules.directory and parent.is_relative_to(modules.directory)
    }


#: the version of each set of job modules this process loaded last
_LOADED: dict[str, str] = worker.slot("job-modules", dict)


def forget_changed(names: Iterable[str], version: str) -> list[str]:
    """Before this process loads the job's code: unless it loaded version ``version`` of the
    modules ``names`` last, forget those it imported (another version, or one imported
    before any run named a version: a notebook's own ``import``), so that the next import
    reads the version shipped now; which it forgot. Kept per set of names: two jobs of one
    session do not make each other forget."""
    names = sorted(n for n in names if n)
    loaded = _LOADED
    key = ",".join(names)
    if loaded.get(key) == version:
        return []
    loaded[key] = version
    forgotten = [n for n in names if sys.modules.pop(n, None) is not None]
    importlib.invalidate_caches()
    return forgotten


def use_version(config: Mapping[str, str]) -> None:
    """In a Python worker, before the job's code loads: the version the run shipped."""
    version = config.get(VERSION)
    if version:
        forget_changed((config.get(MODULES) or "").split(","), version)
