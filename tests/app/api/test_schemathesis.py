"""schemathesis against the live service, every check on: no server error, answers that
conform to the OpenAPI document (status codes, schemas, headers, content types, Allow),
schema-invalid requests refused, and schema-valid requests accepted
(``positive_data_acceptance``: the rules across fields are in the schema too), without a
token, with COREL_API_TOKEN, and as the second of two users (each with a write token; the
first owns private rows whose ids the second may guess, and must be answered a documented
404 or 403, never a 500, and leave them as they were).

Each run is counted, not timed: every phase (coverage, fuzzing, stateful) once (the run
without a token, all but coverage: ``WITHOUT_COVERAGE``), with at
most ``EXAMPLES`` generated cases an operation and phase (``EXAMPLES_WITHOUT_TOKEN``
without a token, ``EXAMPLES_SECOND_USER`` as the second user), from a fixed seed: the same
requests on any machine, and every operation reached. (Until the suite's time was cut, each
ran for a time budget instead, 120-180, 30 and 60-120 s: on this machine the 30 s with a
token did not finish one pass, so which operations it reached depended on the machine.)

Two operations may answer 422 to a schema-valid request, each for a rule no schema can
state (tests/app/api/schemathesis.toml says which and why): an upload's content, and a
sweep's size and the combination of its base with its grid.

Deliberately excluded operations: the event streams (``/experiments/{id}/events``,
``/sweeps/{id}/events``). A stream ends only when its runs finish, and here no worker
trains them, so a request for an existing id would never complete
(tests/app/stack/test_events.py covers them).

The service runs on a database of its own and a queue no worker reads, so that the
experiments the fuzzer submits are never trained.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.access.tokens import FailureBudget
from app.access.users import create_token
from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.settings import Settings
from app.main import create_app
from tests.app.conftest import npz_bytes, own_database, serving

TOKEN = "fuzz-token"
# Generated cases an operation and phase (schemathesis' --max-examples; its default is 100):
# about 3,700 requests a run, 20-40 s each here.
EXAMPLES = 10
# Without a token, 61 of the 65 operations answer 401 whatever the input (the suite's
# settings carry COREL_API_TOKEN): a few cases an operation show that, and the two runs with a
# token do the fuzzing behind it. That run leaves out the coverage phase: its boundary cases
# (4,206 of the run's 4,461 here) met a 401 at 80 of the 85 operations, and the five that
# answer without a token (app/access/tokens.py's OPEN_PATHS: probes, the pages) are covered by
# the run with one, where they answer alike (19 s -> 7 s alone, on a 2-core AMD EPYC).
EXAMPLES_WITHOUT_TOKEN = 3
# Every phase but coverage (see below for each run that leaves it out).
WITHOUT_COVERAGE = "examples,fuzzing,stateful"
# As the second of two users, the run shows what a user may not do to another's rows: every
# operation reached with bob's token, ann's ids met where the fuzzer guesses them (the test
# counts the requests that named them); the run with COREL_API_TOKEN does the fuzzing at
# EXAMPLES behind it. It leaves out the coverage phase too: its boundary cases (4,182 of the
# run's 4,590 here) are the schema's edges, answered by the same validation as the run with
# a token's, before any row is read (35 -> 15 s alone, on a 2-core AMD EPYC with AVX-512).
EXAMPLES_SECOND_USER = 5
CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module")
def fuzz_settings(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    with own_database(settings, tmp_path_factory.mktemp("fuzz-var")) as s:
        yield s


def fuzzed_app(s: Settings) -> Any:
    """The app of ``s``, with the failed-authentication budget out of the way: the fuzzer's
    own probes of wrong tokens (``ignored_auth``) would otherwise have every later request
    from 127.0.0.1 answered 429, and nothing behind it tested (test_users tests the budget)."""
    app = create_app(s)
    app.state.auth_failures = FailureBudget(limit=10**9)
    return app


class Calls:
    """The app, with each HTTP request's method, path and answer's status kept in ``seen``."""

    def __init__(self, app: Any) -> None:
        self.app, self.seen = app, []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def answer(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, answer)
        self.seen.append((scope["method"], scope["path"], status[0] if status else None))


def schemathesis(url: str, tmp_path: Path, *extra: str, exclude: str = "/events$",
                 examples: int = EXAMPLES) -> None:
    st = Path(sys.executable).parent / "st"
    assert st.exists() or shutil.which("st"), "schemathesis is not installed (the test extra)"
    cmd = [str(st) if st.exists() else "st", "--config-file", str(CONFIG), "run",
           f"{url}/openapi.json", "--exclude-path-regex", exclude,
           "--max-examples", str(examples),
           "--seed", "1", "--no-color", "--report-dir", str(tmp_path), *extra]
    # In the test's own directory: st keeps a cache (.schemathesis/) where it runs.
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]


@pytest.mark.own_auth
def test_no_server_error_and_a_true_schema_without_a_token(fuzz_settings, tmp_path) -> None:
    with serving(fuzzed_app(fuzz_settings)) as url:
        schemathesis(url, tmp_path, "--phases", WITHOUT_COVERAGE, examples=EXAMPLES_WITHOUT_TOKEN)


@pytest.mark.own_auth
def test_no_server_error_and_a_true_schema_with_a_token(fuzz_settings, tmp_path) -> None:
    guarded = fuzz_settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    with serving(fuzzed_app(guarded)) as url:
        schemathesis(url, tmp_path, "--header", f"Authorization: Bearer {TOKEN}")


@pytest.mark.own_auth
def test_no_server_error_and_a_true_schema_as_the_second_of_two_users(
        settings: Settings, tmp_path: Path) -> None:
    """Users ann and bob, each with a write token (made by the bootstrap admin, then served
    without COREL_API_TOKEN: personal tokens only). Ann owns a private experiment, sweep and
    upload, the first ids of each, which the fuzzer, as bob, names by chance: each must be a
    documented 404 (403 where shared for less), and stay as ann left it."""
    boot = {"Authorization": f"Bearer {TOKEN}"}
    (tmp_path / "var").mkdir()
    with own_database(settings, tmp_path / "var") as s:
        with TestClient(create_app(s.model_copy(update={"api_token": SecretStr(TOKEN)}))) as c:
            tokens, ids = {}, {}
            for name in ("ann", "bob"):
                uid = ids[name] = c.post("/users", json={"name": name}, headers=boot).json()["id"]
                r = c.post(f"/users/{uid}/tokens", json={"scope": "write"}, headers=boot)
                tokens[name] = {"Authorization": f"Bearer {r.json()['token']}"}
            ann = tokens["ann"]
            runs = [c.post("/experiments", json={"dataset": "digits", "epochs": 1},
                           headers=ann).json()["id"] for _ in range(3)]
            sweep = c.post("/sweeps", json={"base": {"dataset": "digits", "epochs": 1},
                                            "grid": {"seed": [0, 1]}}, headers=ann).json()["id"]
            upload = npz_bytes(x=np.eye(6, 3), y=np.arange(6) % 2)
            r = c.post("/datasets", files={"file": ("a.npz", upload)}, headers=ann)
            assert r.status_code == 201, r.text
            dataset = r.json()["id"]
            before = {path: c.get(path, headers=ann).json() for path in
                      [*(f"/experiments/{i}" for i in runs), f"/sweeps/{sweep}",
                       f"/datasets/{dataset}"]}
        # Bob's requests do not revoke tokens: the fuzzer revoked bob's own early (DELETE
        # /me/tokens/{id}, or /tokens/{id} with his own id), and answers 401 were all it
        # got from then on. test_users.py revokes another user's token, as a user and as
        # the admin.
        calls = Calls(fuzzed_app(s))
        with serving(calls) as url:
            schemathesis(url, tmp_path, "--header", f"Authorization: {tokens['bob']['Authorization']}",
                         "--phases", WITHOUT_COVERAGE, exclude=r"/events$|^/(me/)?tokens/\{token_id\}$",
                         examples=EXAMPLES_SECOND_USER)
        # The fuzzer named each of ann's rows, reading and writing, and was refused each time.
        # (Bob's own rows, made in the stateful phase, have later ids: his experiments from 6
        # on, after ann's three and her sweep's two members.)
        mine = [f"/experiments/{runs[0]}", f"/sweeps/{sweep}", f"/datasets/{dataset}"]
        named = [(method, path, status, row) for method, path, status in calls.seen
                 for row in mine if path == row or path.startswith(row + "/")]
        assert {row for *_, row in named} == set(mine), named
        assert {method for method, *_ in named} >= {"GET", "POST", "DELETE"}, named
        assert all(status in (401, 403, 404, 405, 422) for _, _, status, _ in named), [
            c for c in named if c[2] not in (401, 403, 404, 405, 422)]
        # A token of bob's made now reads as bob.
        factory = make_sessionmaker(engine := make_engine(s.db_url))
        with session_scope(factory) as session:
            _, fresh = create_token(session, ids["bob"], "read")
        engine.dispose()
        bob = {"Authorization": f"Bearer {fresh}"}
        with TestClient(create_app(s)) as c:
            for path, body in before.items():
                assert c.get(path, headers=bob).status_code == 404, path
                after = c.get(path, headers=ann).json()
                assert (after.get("status"), after.get("public"), after.get("shares")) == (
                    body.get("status"), body.get("public"), body.get("shares")), path
