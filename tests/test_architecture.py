"""Dependencies run one way (DESIGN.md §9): cli -> runtime -> tools -> storage -> startpoint ->
checkpoint -> metadata -> system -> config -> model -> serde (serde is a leaf: config names its
serdes; startpoint values live in the model layer, the startpoint manager above metadata); only
runtime imports pyspark; nothing in the product imports the test kit. Every package sits on one
layer of its own, so "metadata never imports checkpoints" is held like every other arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "sparkpoint"

# a package may import its own modules and those of lower layers, never higher ones; only the
# leaf utilities (which import nothing of sparkpoint) share a layer
LEAVES = {"errors", "fsutil", "failpoints", "worker"}
LAYER = {
    **dict.fromkeys(LEAVES, 0),
    "refs": 0.5,  # loads module:attr references: above the errors it raises, below the rest
    "serde": 1,
    "model": 2,
    "config": 3,
    "system": 4,
    "metadata": 5,
    "checkpoint": 6,
    "startpoint": 7,
    "storage": 8,
    "tools": 9,
    "state": 9.5,  # state as data: reads through the tools, pyspark in its data source only
    "runtime": 10,
    "cli": 11,
    "testing": 12,
    "__init__": 13,
    "__main__": 14,
}


def test_every_package_has_a_layer_of_its_own() -> None:
    packages = {p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert packages == set(LAYER), "place every package of src/sparkpoint in LAYER"
    shared = [n for n in LAYER.values() if n != 0 and list(LAYER.values()).count(n) > 1]
    assert shared == []


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> list[tuple[str, str, int]]:
    """(importing package, imported sparkpoint module, line) for every import in the product."""
    out = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        here = package_of(".".join(rel.parts))
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                out.append((f"{here}:{rel}", name, node.lineno))
    return out


def test_layers_are_respected() -> None:
    wrong = []
    for where, name, line in imports():
        here = where.split(":")[0]
        if not name.startswith("sparkpoint.") or here == "testing":
            continue
        there = package_of(name)
        if there != here and LAYER[there] >= LAYER[here]:
            wrong.append(f"{where.split(':')[1]}:{line} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("forbidden", ["pyspark", "sparkpoint.testing"])
def test_only_where_allowed(forbidden: str) -> None:
    allowed = (
        {"runtime", "state", "cli", "testing", "__init__"}
        if forbidden == "pyspark"
        else {"testing"}
    )
    wrong = [
        f"{where.split(':')[1]}:{line}"
        for where, name, line in imports()
        if name.startswith(forbidden) and where.split(":")[0] not in allowed
    ]
    assert wrong == []


# test folders that are not a package of sparkpoint: whole-job tests, fixtures
NOT_PACKAGES = {"e2e", "golden", "jobs"}


def test_tests_mirror_the_package_layout() -> None:
    """A test folder is named after the sparkpoint package it tests (``tests/storage/blobstore``
    tests ``sparkpoint.storage.blobstore``), so a package's tests are found where it lives."""
    tests = Path(__file__).resolve().parent
    stray = [
        str(d.relative_to(tests))
        for d in sorted(tests.rglob("*"))
        if d.is_dir()
        and d.name != "__pycache__"
        and d.relative_to(tests).parts[0] not in NOT_PACKAGES
        and not (SRC / d.relative_to(tests)).is_dir()
    ]
    assert stray == [], f"test folders with no sparkpoint package of that name: {stray}"


# packages whose tests live elsewhere, and where
TESTED_ELSEWHERE = {
    "cli": "tests/e2e/test_cli.py and test_cli_errors.py run the commands end to end",
    "runtime/api": "protocols only: every task test runs a StreamTask through them",
    "storage/changelog": "tests/storage/test_state_backends.py runs it as a backend, with the "
    "blob store, through every failpoint",
    "testing": "tests/testing",
}


def test_every_package_has_its_tests_folder() -> None:
    """The other way round: each package of sparkpoint has a test folder of its name (those
    tested elsewhere are named above, with where)."""
    packages = sorted(
        str(d.relative_to(SRC))
        for d in SRC.rglob("*")
        if d.is_dir() and (d / "__init__.py").is_file()
    )
    tests = Path(__file__).resolve().parent
    missing = [p for p in packages if not (tests / p).is_dir() and p not in TESTED_ELSEWHERE]
    assert missing == [], f"packages with no tests/<package> folder: {missing}"


@pytest.mark.parametrize("package", ["runtime", "system"])
def test_a_package_of_packages_holds_only_tests_of_its_own_modules(package: str) -> None:
    """In ``tests/runtime`` and ``tests/system``, whose packages are split into subpackages,
    a test file at the top tests one of the package's own modules (``test_retry.py`` tests
    ``system/retry.py``): a subpackage's tests are in its own folder."""
    tests = Path(__file__).resolve().parent / package
    modules = {p.stem for p in (SRC / package).glob("*.py")}
    stray = [
        f.name
        for f in sorted(tests.glob("test_*.py"))
        if not any(f.stem[len("test_") :].startswith(m) for m in modules)
    ]
    assert stray == [], f"tests/{package}: move these to their subpackage's folder: {stray}"


# the runtime's own packages, in the one order they may import each other (plan.py, the
# contract between the driver and the tasks, and runner.py, between the driver and whatever
# runs a batch, are below them all)
RUNTIME_LAYER = {
    "plan": 0,
    "runner": 0.5,
    "api": 0.7,
    "executor": 1,
    "spark": 2,
    "dataframe": 3,
    "driver": 4,
}
RUNTIME = SRC / "runtime"


def runtime_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["sparkpoint", "runtime"]:
        return None
    return parts[2] if len(parts) > 2 else "__init__"


def test_the_runtime_is_its_packages() -> None:
    """Every module of the runtime is in one of its packages (or is the plan), and each package
    says in its docstring what it owns and what it may import."""
    parts = {
        p.stem for p in RUNTIME.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    assert parts - {"__init__"} == set(RUNTIME_LAYER)
    for name in RUNTIME_LAYER:
        if name in ("plan", "runner"):
            continue
        doc = ast.get_docstring(ast.parse((RUNTIME / name / "__init__.py").read_text())) or ""
        assert "Owns" in doc and "May import" in doc, f"runtime/{name}/__init__.py docstring"


def test_runtime_packages_import_one_way() -> None:
    wrong = []
    for where, name, line in imports():
        if where.split(":")[0] != "runtime":
            continue
        path = where.split(":")[1]
        here, there = runtime_part(path.replace("/", ".")), runtime_part(name)
        if here in (None, "__init__") or there in (None, "__init__") or here == there:
            continue
        if RUNTIME_LAYER[there] >= RUNTIME_LAYER[here]:
            wrong.append(f"{path}:{line} imports {name}")
    assert wrong == []


# the runtime's parts that run without Spark (the inline runner, the test kit)
SPARKLESS = ("plan", "runner", "api", "executor")


def test_no_spark_in_the_task_api() -> None:
    """The task API's executor side runs without Spark (the inline runner, the test kit)."""
    wrong = [
        f"{where.split(':')[1]}:{line}"
        for where, name, line in imports()
        if name.startswith("pyspark")
        and runtime_part(where.split(":")[1].replace("/", "."))
        in ("plan", "runner", "api", "executor")
    ]
    assert wrong == []


def module_imports() -> dict[str, set[str]]:
    """Each product module's imports of other product modules, at any depth of the module
    (function-level imports too) but for those under ``if TYPE_CHECKING:``."""
    paths = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in paths)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                deps.update(s for s in subs if s in paths)
                if any(s not in paths for s in subs) and node.module in paths:
                    deps.add(node.module)  # a name defined in the module (not a submodule)
        graph[module] = deps - {module}
    return graph


def test_no_import_cycles() -> None:
    """No module imports, directly or through others, a module that imports it back (imports
    under TYPE_CHECKING aside): every room can be read, and tested, without the rooms above."""
    graph = module_imports()
    cycles = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(" -> ".join([*path[path.index(module) :], module]))
            return
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == []


def test_the_task_api_imports_no_runtime_implementation() -> None:
    """``runtime/api`` (what a user implements and calls) imports no other runtime package:
    its context, timers and windows are protocols the executor runtime implements."""
    wrong = [
        f"{where.split(':')[1]}:{line} imports {name}"
        for where, name, line in imports()
        if runtime_part(where.split(":")[1].replace("/", ".")) == "api"
        and runtime_part(name) not in (None, "api")
    ]
    assert wrong == []


# storage test modules that run a job through its driver, and why the driver is part of what
# they test; every other one drives TaskStorage itself (tests/storage/cycle.py)
STORAGE_TESTS_WITH_A_DRIVER = {
    "test_ttl_stores.py": "TTL as a running job sees it: the task reads an expired count as "
    "absent and counts again from zero, with the driver's clock on every host; the TTL store "
    "alone is tests/storage/kv/test_ttl.py",
}


def driver_imports(path: Path) -> list[str]:
    """What ``path`` imports that builds or runs a driver."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if node.module.startswith("sparkpoint.runtime.driver"):
                found.append(node.module)
            elif node.module == "tests.helpers" and "run_job" in names:
                found.append("tests.helpers.run_job")
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("sparkpoint.runtime.driver")]
    return found


def test_storage_is_tested_without_a_driver() -> None:
    """Issue 70: storage behaviour is tested on the storage itself, not through a driver, unless
    the driver's part is what is under test (named above, with why; those moved to
    tests/runtime/driver/ when the driver is most of it)."""
    storage_tests = Path(__file__).resolve().parent / "storage"
    found = {
        p.name: imports
        for p in sorted(storage_tests.rglob("*.py"))
        if (imports := driver_imports(p)) and p.name not in STORAGE_TESTS_WITH_A_DRIVER
    }
    assert found == {}, f"storage tests that build a driver: {found}"
    gone = [n for n in STORAGE_TESTS_WITH_A_DRIVER if not (storage_tests / n).exists()]
    assert gone == [], f"named above but gone: {gone}"
