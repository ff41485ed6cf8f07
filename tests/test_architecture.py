"""The arrows between the packages: ``worker`` may import ``app`` and ``corel``; ``app``
may import ``corel``; ``corel`` imports neither. The benchmarks (``bench``) and the test
harness (``harness``) import nothing from ``tests``: what both need lives in ``harness``. Every import statement counts, those
inside functions too, read from the source (nothing is imported to check). And each of the
library's test files says whether make test's kernel pass runs it."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.conftest import REPO

FORBIDDEN = {"app": {"worker"}, "corel": {"app", "worker"}, "bench": {"tests"},
             "harness": {"tests"}}


def imported_packages(path: Path) -> set[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, alias.name.split(".")[0]) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_against_the_arrows(package):
    modules = sorted((REPO / package).rglob("*.py"))
    assert modules, f"no modules under {package}/"
    wrong = [f"{path.relative_to(REPO)}:{line} imports {name}"
             for path in modules for line, name in sorted(imported_packages(path))
             if name in FORBIDDEN[package]]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from worker.tasks import x\n    import app.cli\n")
    assert imported_packages(module) == {(2, "worker"), (3, "app")}


# --- app/'s floor plan: the arrows between its folders ------------------------------------

# What each folder of app/ may import of app/ (besides itself), lowest floor first; the
# floor plan is docs/development.md's. app/main.py (the factory) and app/cli (the
# command lines) stand on top and may import anything.
APP_FLOORS = {
    "core": set(),
    "access": {"core"},
    "jobs": {"core"},
    "storage": {"core"},
    "web": {"core"},
    "services": {"core", "access", "jobs", "storage"},
    "serving": {"core", "access", "jobs", "storage", "services"},
    "api": {"core", "access", "jobs", "storage", "services", "serving", "web"},
}
APP_TOP = {"main.py", "cli", "__init__.py"}


def app_folders_imported(path: Path) -> set[tuple[int, str]]:
    """The folders of app/ a module imports (``from app.jobs.queue import ...`` is ``jobs``;
    ``from app.jobs import lifecycle`` too), those inside functions included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "app" else [f"app.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "app" and len(parts) > 1:
                found.add((node.lineno, parts[1]))
    return found


def test_app_is_grouped_by_concern():
    root = sorted(p.name for p in (REPO / "app").iterdir()
                  if p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir()))
    stray = sorted(set(root) - set(APP_FLOORS) - APP_TOP)
    assert not stray, f"app/ holds {stray}: each belongs in a folder of docs/development.md's floor plan"


def test_app_s_folders_import_only_the_floors_below():
    wrong = []
    for folder, allowed in APP_FLOORS.items():
        for path in sorted((REPO / "app" / folder).rglob("*.py")):
            wrong += [f"{path.relative_to(REPO)}:{line} imports app.{name}"
                      for line, name in sorted(app_folders_imported(path))
                      if name != folder and name not in allowed]
    assert not wrong, "\n".join(wrong)


def test_the_floor_check_sees_an_arrow_up(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from app.jobs import lifecycle\nimport app.api.deps\n"
                      "def f():\n    from app.core.db import x\n")
    assert app_folders_imported(module) == {(1, "jobs"), (2, "api"), (4, "core")}


def private_imports(path: Path, package: str) -> list[tuple[int, str]]:
    """``from m import _name`` in a module of ``package`` (dotted): another module's private
    name. A subpackage's modules share their private helpers (``corel.data``'s loaders
    and splits); the modules of a top-level package (``corel.cli`` and
    ``corel.serving``, ``app.main`` and ``app.core.errors``) do not."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module):
            continue
        inside = package.count(".") >= 1 and node.module.rpartition(".")[0] == package
        found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names
                  if alias.name.startswith("_") and not alias.name.startswith("__") and not inside]
    return found


def test_no_module_imports_another_module_s_private_names():
    wrong = []
    for top in ("corel", "app", "worker", "bench", "harness"):
        for path in sorted((REPO / top).rglob("*.py")):
            package = ".".join(path.relative_to(REPO).parent.parts)
            wrong += [f"{path.relative_to(REPO)}:{line} imports {name}"
                      for line, name in private_imports(path, package)]
    assert not wrong, "\n".join(wrong)


def test_the_private_check_sees_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from corel.losses import _check, public\nfrom corel.data.splits import _subset\n")
    assert private_imports(module, "corel") == [(1, "corel.losses._check"), (2, "corel.data.splits._subset")]
    assert private_imports(module, "corel.data") == [(1, "corel.losses._check")]



# --- corel/ has no import cycles ------------------------------------------------------------


def corel_modules() -> dict[str, Path]:
    """Every module of corel/ by its dotted name (a package by its own)."""
    found = {}
    for path in sorted((REPO / "corel").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def corel_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of corel a module imports, those inside functions included: ``from
    corel.encoders import files`` is ``corel.encoders.files`` where that is a module, else
    ``corel.encoders``. Imports for the type checker alone (``if TYPE_CHECKING:``) do not
    run, and do not count."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(inner) for node in ast.walk(tree)
                   if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for statement in node.body for inner in ast.walk(statement)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs if len(subs) == len(node.names) else subs | {node.module}
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of a graph of imports: each strongly connected set of more than one module
    (or one that imports itself), in order of its first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1 or node in graph.get(node, ()):
                cycles.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_corel_has_no_import_cycle():
    """A package's __init__ that imports its own modules is not a cycle unless one of them
    imports the package back (corel.models once imported corel.finetune, which imported the
    FFNN back from corel.models)."""
    modules = corel_modules()
    graph = {name: corel_imports(path, set(modules)) - {name} for name, path in modules.items()}
    cycles = import_cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_one():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


SESSION_QUERIES = {"execute", "scalar", "scalars", "get", "query"}


def sql_in(path: Path) -> list[tuple[int, str]]:
    """SQL run by the module itself: an import of SQLAlchemy (``select``, ``text``, ...)
    or a query on a ``session`` (``session.scalars(...)``, ``session.get(...)``), where a
    route should call a service."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            found.append((node.lineno, f"imports {node.module}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"imports {a.name}") for a in node.names
                      if a.name.split(".")[0] == "sqlalchemy"]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "session"
              and node.func.attr in SESSION_QUERIES):
            found.append((node.lineno, f"calls session.{node.func.attr}"))
    return found


def test_routes_call_services_and_run_no_sql():
    routes = sorted((REPO / "app" / "api" / "routes").rglob("*.py"))
    assert routes, "no modules under app/api/routes/"
    wrong = [f"{path.relative_to(REPO)}:{line} {what}"
             for path in routes for line, what in sql_in(path)]
    assert not wrong, "\n".join(wrong)


def test_the_sql_check_sees_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from sqlalchemy import select\nimport sqlalchemy.orm\n"
                      "def f(session):\n    return session.get(A, 1), service.get(session, 1)\n")
    assert sql_in(module) == [(1, "imports sqlalchemy"), (2, "imports sqlalchemy.orm"),
                              (4, "calls session.get")]


# --- the library reads no environment; the engine has one import path -------------------

# The library's command lines: the only modules of corel/ that read environment variables.
READS_THE_ENVIRONMENT = {"corel/cli.py", "corel/native/__main__.py"}
# Kept one release so that old imports work; nothing else imports them.
ENGINE_SHIMS = {"corel.training", "corel.vectorized"}


def environment_reads(path: Path) -> list[tuple[int, str]]:
    """``os.environ``, ``os.getenv`` and ``os.putenv`` (read or written), and ``environ`` or
    ``getenv`` imported from os, in a module's source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb")
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            found.append((node.lineno, f"os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"from os import {a.name}") for a in node.names
                      if a.name in ("environ", "getenv", "putenv", "environb")]
    return found


def test_no_module_of_corel_reads_the_environment_but_its_command_lines():
    modules = sorted((REPO / "corel").rglob("*.py"))
    wrong = [f"{path.relative_to(REPO)}:{line} {what}" for path in modules
             if str(path.relative_to(REPO)) not in READS_THE_ENVIRONMENT
             for line, what in environment_reads(path)]
    assert not wrong, "\n".join(wrong)


def test_the_environment_check_sees_a_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom os import getenv\nx = os.environ.get('A')\ny = os.getenv('B')\n")
    assert sorted(environment_reads(module)) == [(2, "from os import getenv"), (3, "os.environ"), (4, "os.getenv")]


def second_engine_paths(path: Path, exported: set[str]) -> list[tuple[int, str]]:
    """Imports of an engine name by a path other than ``corel.train``: a name that
    ``corel.train`` exports taken from one of its modules, or anything taken from a shim."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in ENGINE_SHIMS:
                found.append((node.lineno, f"from {node.module} (a shim; import from corel.train)"))
            elif node.module.startswith("corel.train."):
                found += [(node.lineno, f"{a.name} from {node.module} (corel.train exports it)")
                          for a in node.names if a.name in exported]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name} (a shim)") for a in node.names if a.name in ENGINE_SHIMS]
    return found


def test_every_engine_name_has_one_import_path():
    import corel.train

    exported = set(corel.train.__all__)
    shims = {REPO / (name.replace(".", "/") + ".py") for name in ENGINE_SHIMS}
    modules = sorted(p for package in ("corel", "app", "worker", "bench", "harness", "tests")
                     for p in (REPO / package).rglob("*.py")
                     if p not in shims and REPO / "corel" / "train" not in p.parents)
    wrong = [f"{path.relative_to(REPO)}:{line} imports {what}"
             for path in modules for line, what in second_engine_paths(path, exported)]
    assert not wrong, "\n".join(wrong)


def test_the_import_path_check_sees_a_second_path(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from corel.train.solo import fit, EVAL_BATCH\nfrom corel.training import Run\n"
                      "import corel.vectorized\n")
    assert second_engine_paths(module, {"fit", "Run"}) == [
        (1, "fit from corel.train.solo (corel.train exports it)"),
        (2, "from corel.training (a shim; import from corel.train)"),
        (3, "import corel.vectorized (a shim)")]


# The library's test files that make test's kernel pass leaves out, and why: what they
# assert does not come out of torch's or MKL's kernels, or does not depend on which ones.
KERNEL_FREE = {
    "test_clustering.py": "the clustering metrics: counting, in numpy and scipy",
    "test_device.py": "torch's float32 settings for CUDA, set and read back",
    "data/test_download.py": "the downloads' files",
    "test_encoder_catalog.py": "the catalog's declarations",
    "encoders/test_record.py": "the encoder record's fields, read back as recorded",
    "encoders/test_precision.py": "the parity gate: its verdicts follow from the figures it "
                                  "measures, each path compared with fp32 on the same kernels",
    "test_index.py": "faiss's kernels, not torch's",
    "native/test_native.py": "the native build's loader",
    "test_report.py": "the report's tables and t-tests, in numpy and scipy",
    "train/test_lockstep.py": "float64 throughout, each assertion two computations of the same process "
                              "(stacks in lockstep against each stack alone), 1e-10 apart on any kernels",
    "train/test_pruning.py": "float64 throughout, each assertion two computations of the same "
                             "process (a pruned stack against the unpruned one), 1e-16 apart on any kernels",
}
# A file may instead mark its tests one by one (``KERNELS = pytest.mark.kernels``, then
# ``@KERNELS``): test_vectorized.py's float32 tests run again, its float64 equivalences once.
BY_TEST = "KERNELS = pytest.mark.kernels"
LIBRARY_TESTS = REPO / "tests" / "corel"


def test_each_library_test_file_says_whether_its_figures_come_out_of_the_kernels():
    """A file in tests/corel is marked ``kernels`` (make test runs it once more on torch's
    default kernels and MKL's reproducible path), marks its tests one by one (BY_TEST) or is
    named in KERNEL_FREE with its reason; a new file is none of these until its author says which."""
    files = {p.relative_to(LIBRARY_TESTS).as_posix(): p for p in LIBRARY_TESTS.rglob("test_*.py")}
    marked = {name for name, p in files.items()
              if "pytestmark = pytest.mark.kernels" in p.read_text() or BY_TEST in p.read_text()}
    unsaid = sorted(name for name in files if name not in marked and name not in KERNEL_FREE)
    assert not unsaid, (f"{unsaid}: mark each `pytestmark = pytest.mark.kernels`, mark its tests "
                        f"(`{BY_TEST}`, then `@KERNELS`) or name it in KERNEL_FREE")
    both = sorted(marked & set(KERNEL_FREE))
    assert not both, f"{both} are marked kernels and named kernel-free"
    gone = sorted(set(KERNEL_FREE) - set(files))
    assert not gone, f"KERNEL_FREE names files that are not there: {gone}"


def test_the_library_s_tests_mirror_its_folders():
    """tests/corel has a folder for each of corel/'s packages, and no other: a test of
    corel/train/pruning.py is tests/corel/train/test_pruning.py (as pytorch-metric-learning's
    tests/losses/ mirrors its losses/)."""
    packages = {p.parent.name for p in (REPO / "corel").glob("*/__init__.py")}
    folders = {p.name for p in LIBRARY_TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == packages, (f"tests/corel's folders {sorted(folders)}, "
                                 f"corel's packages {sorted(packages)}")
    for folder in folders:
        assert (LIBRARY_TESTS / folder / "__init__.py").exists(), folder


# --- the service's test tiers ----------------------------------------------------------------


def test_a_service_test_in_the_wrong_tier_stops_the_collection() -> None:
    """tests/app/conftest.py refuses, at collection, a service test outside the tiers' folders
    and one of the API tier that needs a worker, a trained run or a browser."""
    from tests.app.conftest import tier_violations

    assert tier_violations([("tests/app/api/test_x.py::test_a", {"settings", "client"}),
                            ("tests/app/stack/test_x.py::test_b", {"worker", "digits_runs"}),
                            ("tests/app/processes/test_x.py::test_c", {"workers"}),
                            ("tests/corel/test_x.py::test_d", {"worker"})]) == []
    wrong = tier_violations([("tests/app/test_x.py::test_a", {"client"}),
                             ("tests/app/api/test_x.py::test_b", {"client", "digits_runs"}),
                             ("tests/app/other/test_x.py::test_c", set())])
    assert len(wrong) == 3
    assert "tests/app/<tier>/" in wrong[0] and "digits_runs" in wrong[1] and "tests/app/<tier>/" in wrong[2]


def test_a_serial_test_outside_the_processes_tier_stops_the_collection() -> None:
    """make test's serial pass collects tests/app/processes alone: tests/conftest.py refuses,
    at collection, a test marked serial anywhere else (it would run in no pass)."""
    from tests.conftest import misplaced_serial

    assert misplaced_serial([("tests/app/processes/test_x.py::test_a", True),
                             ("tests/app/stack/test_x.py::test_b", False)]) == []
    assert misplaced_serial([("tests/app/stack/test_x.py::test_b", True),
                             ("tests/corel/test_y.py::test_c", False)]) == ["tests/app/stack/test_x.py::test_b"]


def test_under_xdist_a_file_s_tests_are_one_work_unit(request: pytest.FixtureRequest) -> None:
    """make test keeps a file's tests on one process (tests/conftest.py gives each test its
    file's xdist_group, and --dist loadgroup sends a group to one process), so that a file's
    module fixtures are made once. xdist names the group in the test's id ("...@group"):
    under pytest 9.2 it no longer could, and every test was sent on its own."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        return  # a run without xdist's groups (one process) has no work units to keep together
    assert request.node.nodeid.endswith("@tests/test_architecture.py"), request.node.nodeid
