"""A client generated from the running service's OpenAPI document works, unedited.

This file holds those of its tests that belong in the processes tier (processes of its own);
the others, and the helpers they share, are in tests/app/api/test_generated_client.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.app.api.test_generated_client import QUICK_START
from tests.app.conftest import Workers, new_user, own_database, serving
from tests.conftest import require


@pytest.fixture(scope="module")
def service(settings: Settings, tmp_path_factory: pytest.TempPathFactory,
            workers: Workers) -> Iterator[tuple[str, str]]:
    """A live service on a database of its own with a user and a write token, and a worker."""
    with own_database(settings, tmp_path_factory.mktemp("generated-var")) as s:
        _, token = new_user(s, "ada")
        proc = workers.start(s)
        try:
            with serving(create_app(s)) as url:
                yield url, token
        finally:
            proc.terminate()
            proc.wait(30)


@pytest.mark.serial  # a service, a worker and a code generator of its own: alone, not beside the others
def test_a_generated_client_imports_whole_and_runs_the_quick_start(service, tmp_path):
    url, token = service
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    require(generator is not None, "openapi-python-client (pip install '.[test]')")
    config = tmp_path / "generator.yaml"
    config.write_text("package_name_override: corel_api\npost_hooks: []\n")
    done = subprocess.run([str(generator), "generate", "--url", f"{url}/openapi.json", "--meta", "none",
                           "--output-path", str(tmp_path / "corel_api"), "--config", str(config)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Error" not in done.stdout, done.stdout
    every = textwrap.dedent('''
        import importlib, pkgutil, corel_api
        failed = []
        names = [m.name for m in pkgutil.walk_packages(corel_api.__path__, "corel_api.")]
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
        assert not failed, failed
        print(len(names), "modules")
    ''')
    imported = subprocess.run([sys.executable, "-c", every], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert int(imported.stdout.split()[0]) > 100
    ran = subprocess.run([sys.executable, "-c", QUICK_START, url, token], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "quick start through the generated client: ok" in ran.stdout
