"""schemathesis against the live service: no server error, and answers that conform to
the OpenAPI document (status codes, schemas, headers, content types, Allow), without a
token and with one.

Deliberately excluded checks, each with its reason:

* ``positive_data_acceptance``: it expects every schema-valid request to be accepted,
  but some rules span several fields or the database and are not expressible in an
  OpenAPI schema: an ``npz`` spec needs a ``dataset_id`` that exists, a sweep's grid
  needs at least one value, an inference batch at least one input. Those answer 422
  with a sentence saying what is missing, which is what a client should get.

Deliberately excluded operations: the event streams (``/experiments/{id}/events``,
``/sweeps/{id}/events``). A stream ends only when its runs finish, and here no worker
trains them, so a request for an existing id would never complete
(tests/app/test_events.py covers them).

The service runs on a database of its own and a queue no worker reads, so that the
experiments the fuzzer submits are never trained.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pydantic import SecretStr

from app.main import create_app
from app.migrate import upgrade
from app.settings import Settings
from tests.app.conftest import PG_ADMIN_URL, serving

TOKEN = "fuzz-token"
EXCLUDED = ["positive_data_acceptance"]


@pytest.fixture(scope="module")
def fuzz_settings(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    name = f"corel_fuzz_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    s = settings.model_copy(update={
        "database_url": f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}",
        "queue": f"corel-fuzz-{uuid.uuid4().hex[:8]}", "max_sweep_size": 20,
        "var_dir": tmp_path_factory.mktemp("fuzz-var"), "log_level": "WARNING"})
    upgrade(s)
    yield s
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def schemathesis(url: str, tmp_path: Path, *extra: str) -> None:
    st = Path(sys.executable).parent / "st"
    assert st.exists() or shutil.which("st"), "schemathesis is not installed (the test extra)"
    cmd = [str(st) if st.exists() else "st", "run", f"{url}/openapi.json", "--checks", "all",
           "--exclude-checks", ",".join(EXCLUDED), "--exclude-path-regex", "/events$",
           "--max-examples", "5", "--max-time", "60",
           "--seed", "1", "--no-color", "--report-dir", str(tmp_path), *extra]
    # In the test's own directory: st keeps a cache (.schemathesis/) where it runs.
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]


def test_no_server_error_and_a_true_schema_without_a_token(fuzz_settings, tmp_path) -> None:
    with serving(create_app(fuzz_settings)) as url:
        schemathesis(url, tmp_path)


def test_no_server_error_and_a_true_schema_with_a_token(fuzz_settings, tmp_path) -> None:
    guarded = fuzz_settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    with serving(create_app(guarded)) as url:
        schemathesis(url, tmp_path, "--header", f"Authorization: Bearer {TOKEN}")
