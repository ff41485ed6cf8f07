"""The arrows between the packages: ``worker`` may import ``app`` and ``corel``; ``app``
may import ``corel``; ``corel`` imports neither. Every import statement counts, those
inside functions too, read from the source (nothing is imported to check)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

FORBIDDEN = {"app": {"worker"}, "corel": {"app", "worker"}}


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
