"""Users, tokens, scopes, sharing and the audit log (issue 25), on the embedded default
(SQLite) and on PostgreSQL, each on a database of its own: users created here must not
end the open mode of the suite's shared database."""

from __future__ import annotations

import getpass
import hmac
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, update

import app.services.experiments as experiments_service
from app.core.db import make_engine, make_sessionmaker
from app.core.errors import Conflict
from app.core.models import ApiToken, Experiment, utcnow
from app.core.settings import Settings
from app.main import create_app
from harness.stack import corel_env
from tests.app.conftest import PG_ADMIN_URL, corel_cli, migrated_database, npz_bytes, pg_available
from tests.conftest import REPO, require
from tests.encoder_files import timm_weights

# Each test sets up its own users (make test's open pass runs them; the user's passes leave them out).
pytestmark = pytest.mark.own_auth

BOOT = "bootstrap-s3cret"
RUN = {"dataset": "digits", "epochs": 1}


@pytest.fixture(params=["sqlite", "postgresql"])
def own_settings(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Settings]:
    if request.param == "postgresql":
        require(pg_available(), f"PostgreSQL at {PG_ADMIN_URL}")
    url, name = migrated_database(request.param, tmp_path)  # at the migrations' head
    s = Settings(database_url=url, var_dir=tmp_path, broker_url="memory://", log_level="WARNING",
                 api_token=SecretStr(BOOT))
    yield s
    if name is not None:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture()
def api(own_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(own_settings)) as c:
        yield c


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ADMIN = auth(BOOT)


def user_token(c: TestClient, name: str, scope: str = "write", admin: bool = False,
               expires_days: float | None = None) -> tuple[int, int, str]:
    """(user id, token id, token) of a new user."""
    r = c.post("/users", json={"name": name, "admin": admin}, headers=ADMIN)
    assert r.status_code == 201, r.text
    uid = r.json()["id"]
    r = c.post(f"/users/{uid}/tokens", json={"scope": scope, "expires_days": expires_days},
               headers=ADMIN)
    assert r.status_code == 201, r.text
    return uid, r.json()["id"], r.json()["token"]


def submit(c: TestClient, token: str) -> int:
    r = c.post("/experiments", json=RUN, headers=auth(token))
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def test_open_until_the_first_user_then_tokens(own_settings: Settings) -> None:
    open_settings = own_settings.model_copy(update={"api_token": None})
    with TestClient(create_app(open_settings)) as c:
        assert c.get("/experiments").status_code == 200  # no users: open, as before
        r = c.post("/users", json={"name": "first", "admin": True})
        assert r.status_code == 201
        r = c.get("/experiments")
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["detail"]
        assert c.post("/users/1/tokens", json={"scope": "admin"}).status_code == 401
    with TestClient(create_app(own_settings)) as c:  # COREL_API_TOKEN stays an admin token
        assert c.get("/users", headers=ADMIN).json()[0]["name"] == "first"


def test_missing_malformed_unknown_revoked_and_expired_tokens_are_401(
        api: TestClient, own_settings: Settings) -> None:
    alice, token_id, token = user_token(api, "alice")
    assert api.get("/experiments", headers=auth(token)).status_code == 200
    for headers in ({}, {"Authorization": f"Basic {token}"}, {"Authorization": "Bearer"},
                    {"Authorization": f"Bearer {token} extra"},
                    auth("corel_" + "x" * 43)):
        r = api.get("/experiments", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
    assert api.delete(f"/tokens/{token_id}", headers=ADMIN).status_code == 200
    r = api.get("/experiments", headers=auth(token))
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    bob, expiring_id, expiring = user_token(api, "bob", expires_days=1)
    assert api.get("/experiments", headers=auth(expiring)).status_code == 200
    factory = make_sessionmaker(engine := make_engine(own_settings.db_url))
    with factory.begin() as session:
        session.execute(update(ApiToken).where(ApiToken.id == expiring_id)
                        .values(expires_at=utcnow() - timedelta(seconds=1)))
    engine.dispose()
    r = api.get("/experiments", headers=auth(expiring))
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    # A revoked or an expired token names its user: the refusal is audited as theirs, a
    # read included; a token that names nobody is not (it says no more than an address).
    refused = [(e["user_id"], e["token_id"], e["action"], e["status"], e["detail"]) for e in
               api.get("/audit", headers=ADMIN).json()["items"] if e["outcome"] == "refused"]
    assert refused == [(bob, expiring_id, "GET /experiments", 401, "the bearer token has expired"),
                       (alice, token_id, "GET /experiments", 401, "the bearer token has been revoked")]


def test_a_token_in_the_query_string_is_refused(api: TestClient) -> None:
    _, _, token = user_token(api, "alice")
    for name in ("token", "access_token"):
        r = api.get(f"/experiments?{name}={token}", headers=auth(token))
        assert r.status_code == 401 and "never in the URL" in r.json()["detail"]


def test_scopes_read_may_not_write_and_only_admins_manage_users(api: TestClient) -> None:
    _, _, reader = user_token(api, "reader", scope="read")
    _, _, writer = user_token(api, "writer")
    assert api.get("/experiments", headers=auth(reader)).status_code == 200
    r = api.post("/experiments", json=RUN, headers=auth(reader))
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    for method, path, body in (("POST", "/users", {"name": "x"}), ("GET", "/users", None),
                               ("GET", "/audit", None), ("DELETE", "/tokens/1", None)):
        assert api.request(method, path, json=body, headers=auth(writer)).status_code == 403
    r = api.post("/users", json={"name": "no-admin"}, headers=ADMIN)
    r = api.post(f"/users/{r.json()['id']}/tokens", json={"scope": "admin"}, headers=ADMIN)
    assert r.status_code == 422  # an admin token needs an admin user


def test_another_users_private_run_is_404_until_shared(api: TestClient) -> None:
    a_id, _, a = user_token(api, "alice")
    b_id, _, b = user_token(api, "bob")
    _, _, c = user_token(api, "carol")
    run = submit(api, a)
    assert api.get(f"/experiments/{run}", headers=auth(a)).status_code == 200
    for method, path, body in (("GET", f"/experiments/{run}", None),
                               ("GET", f"/experiments/{run}/metrics", None),
                               ("POST", f"/experiments/{run}/cancel", None),
                               ("DELETE", f"/experiments/{run}", None),
                               ("POST", "/embed", {"experiment_id": run, "arrays": [[0.0] * 64]}),
                               ("POST", f"/experiments/{run}/neighbors", {"arrays": [[0.0] * 64]}),
                               ("POST", f"/experiments/{run}/shares", {"public": True}),
                               ("GET", f"/experiments/compare?ids={run}", None)):
        r = api.request(method, path, json=body, headers=auth(b))
        assert r.status_code == 404, (method, path, r.text)
    # An invalid query is a 422 before any row is looked up, whoever asks: it says nothing.
    for row in (run, 2_000_000_000):
        r = api.get(f"/experiments/{row}/clustering", params={"on": "train"}, headers=auth(b))
        assert r.status_code == 422, r.text
    listed = api.get("/experiments", headers=auth(b)).json()
    assert listed["total"] == 0 and listed["items"] == []
    assert [e["id"] for e in api.get("/experiments", headers=auth(a)).json()["items"]] == [run]
    assert api.get("/experiments", headers=ADMIN).json()["total"] == 1

    r = api.post(f"/experiments/{run}/shares", json={"user_id": 999_999, "access": "read"},
                 headers=auth(a))
    assert r.status_code == 422 and "does not exist" in r.json()["detail"]
    r = api.post(f"/experiments/{run}/shares", json={"user_id": b_id, "access": "read"},
                 headers=auth(a))
    assert r.status_code == 200
    assert [(x["user_id"], x["access"]) for x in r.json()["shares"]] == [(b_id, "read")]
    assert api.get(f"/experiments/{run}", headers=auth(b)).status_code == 200
    assert api.get(f"/experiments/{run}/shares", headers=auth(b)).status_code == 200
    assert api.get("/experiments", headers=auth(b)).json()["total"] == 1
    assert api.post(f"/experiments/{run}/cancel", headers=auth(b)).status_code == 403
    assert api.post(f"/experiments/{run}/shares", json={"public": True},
                    headers=auth(b)).status_code == 403  # only its owner or an admin shares
    assert api.get(f"/experiments/{run}", headers=auth(c)).status_code == 404
    assert api.post(f"/experiments/{run}/shares", json={"public": True},
                    headers=auth(a)).status_code == 200
    assert api.get(f"/experiments/{run}", headers=auth(c)).status_code == 200
    assert api.post(f"/experiments/{run}/cancel", headers=auth(c)).status_code == 403
    api.post(f"/experiments/{run}/shares", json={"user_id": b_id, "access": "write"},
             headers=auth(a))
    r = api.post(f"/experiments/{run}/cancel", headers=auth(b))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert a_id != b_id


def test_me_answers_who_the_token_is(own_settings: Settings) -> None:
    """GET /me: any caller's name, scope and admin flag (the dashboard shows its admin
    pages by it); no token and no users: the open mode, an admin."""
    with TestClient(create_app(own_settings.model_copy(update={"api_token": None}))) as c:
        assert c.get("/me").json() == {"user_id": None, "name": "open", "scope": "admin",
                                       "admin": True}
    with TestClient(create_app(own_settings)) as c:
        assert c.get("/me").status_code == 401
        assert c.get("/me", headers=ADMIN).json() == {
            "user_id": None, "name": "bootstrap admin", "scope": "admin", "admin": True}
        uid, _, read = user_token(c, "reader", scope="read")
        assert c.get("/me", headers=auth(read)).json() == {
            "user_id": uid, "name": "reader", "scope": "read", "admin": False}
        _, _, boss = user_token(c, "boss", scope="admin", admin=True)
        assert c.get("/me", headers=auth(boss)).json()["admin"] is True


def test_list_items_carry_their_owner(api: TestClient) -> None:
    a_id, _, a = user_token(api, "alice")
    mine = submit(api, a)
    api.post("/experiments", json=RUN, headers=ADMIN)
    owners = {e["id"]: e["owner"] for e in api.get("/experiments", headers=ADMIN).json()["items"]}
    assert owners[mine] == {"id": a_id, "name": "alice"} and list(owners.values()).count(None) == 1
    assert api.get(f"/experiments/{mine}", headers=auth(a)).json()["owner"]["name"] == "alice"
    r = api.post("/sweeps", json={"base": RUN, "grid": {"seed": [0]}}, headers=auth(a))
    sweep = r.json()["id"]
    assert api.get("/sweeps", headers=ADMIN).json()["items"][0]["owner"]["name"] == "alice"
    assert api.get(f"/sweeps/{sweep}", headers=auth(a)).json()["owner"]["id"] == a_id


@pytest.mark.parametrize("kind", ["experiments", "sweeps", "datasets"])
def test_a_share_is_taken_back_with_delete(api: TestClient, kind: str) -> None:
    a_id, _, a = user_token(api, "alice")
    b_id, _, b = user_token(api, "bob")
    if kind == "experiments":
        row = submit(api, a)
    elif kind == "sweeps":
        row = api.post("/sweeps", json={"base": RUN, "grid": {"seed": [0]}}, headers=auth(a)).json()["id"]
    else:
        r = api.post("/datasets", files={"file": ("b.npz", npz_bytes(x=np.eye(6, 3), y=np.arange(6) % 2))},
                     headers=auth(a))
        assert r.status_code == 201, r.text
        row = r.json()["id"]
    r = api.post(f"/{kind}/{row}/shares", json={"user_id": b_id, "access": "write"}, headers=auth(a))
    share_id = r.json()["shares"][0]["id"]
    assert api.get(f"/{kind}/{row}", headers=auth(b)).status_code == 200
    # Only the owner (or an admin) takes it back, even from someone who may write.
    assert api.delete(f"/{kind}/{row}/shares/{share_id}", headers=auth(b)).status_code == 403
    r = api.delete(f"/{kind}/{row}/shares/{share_id}", headers=auth(a))
    assert r.status_code == 200 and r.json()["shares"] == []
    assert api.get(f"/{kind}/{row}", headers=auth(b)).status_code == 404
    assert api.delete(f"/{kind}/{row}/shares/{share_id}", headers=auth(a)).status_code == 404
    assert api.delete(f"/{kind}/{row}/shares/{share_id}", headers=ADMIN).status_code == 404
    entries = api.get("/audit", params={"action": "/shares/"}, headers=ADMIN).json()["items"]
    assert (a_id, "ok", 200) in [(e["user_id"], e["outcome"], e["status"]) for e in entries]
    assert a_id != b_id
    # Found by schemathesis: a share id past PostgreSQL's integer was a 500.
    for huge in (2**31, 6469693229, 2**63):
        r = api.delete(f"/{kind}/{row}/shares/{huge}", headers=auth(a))
        assert r.status_code == 404 and f"share {huge} does not exist" in r.json()["detail"], r.text


def test_a_write_naming_an_id_no_row_can_have_is_audited_without_it(api: TestClient) -> None:
    """Its entry used to fail to insert on PostgreSQL (the id past its integer), so the
    refusal went unrecorded."""
    a_id, _, a = user_token(api, "alice")
    assert api.post(f"/experiments/{2**31}/cancel", headers=auth(a)).status_code == 404
    assert api.post(f"/sweeps/{2**40}/cancel", headers=auth(a)).status_code == 404
    items = api.get("/audit", params={"user_id": a_id}, headers=ADMIN).json()["items"]
    assert [(e["action"], e["resource"], e["resource_id"], e["status"]) for e in items] == [
        ("POST /sweeps/{sweep_id}/cancel", "sweep", None, 404),
        ("POST /experiments/{experiment_id}/cancel", "experiment", None, 404)]


def test_the_audit_entry_is_written_with_the_write_and_not_without_it(
        api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    a_id, a_token_id, a = user_token(api, "alice")
    run = submit(api, a)
    r = api.get("/audit", params={"user_id": a_id}, headers=ADMIN)
    entry = r.json()["items"][0]
    assert r.json()["total"] == 1 and entry["action"] == "POST /experiments"
    assert (entry["resource"], entry["resource_id"], entry["outcome"], entry["token_id"]) == (
        "experiment", run, "ok", a_token_id)
    api.post(f"/experiments/{run}/cancel", headers=auth(a))
    r = api.get("/audit", params={"resource": "experiment", "resource_id": run,
                                  "action": "cancel"}, headers=ADMIN)
    assert [e["action"] for e in r.json()["items"]] == ["POST /experiments/{experiment_id}/cancel"]

    # A write rolled back after its row was flushed: neither the row nor an "ok" entry
    # stays, and the failure is recorded in a transaction of its own.
    real = experiments_service.create_experiment

    def flush_then_fail(session: Any, body: Any) -> Experiment:
        real(session, body)
        raise Conflict("refused after the flush")

    monkeypatch.setattr(experiments_service, "create_experiment", flush_then_fail)
    assert api.post("/experiments", json=RUN, headers=auth(a)).status_code == 409
    assert api.get("/experiments", headers=auth(a)).json()["total"] == 1
    items = api.get("/audit", params={"user_id": a_id, "action": "POST /experiments"},
                    headers=ADMIN).json()["items"]
    assert [(e["outcome"], e["status"]) for e in items] == [("failed", 409), ("ok", 200), ("ok", 202)]
    assert "refused after the flush" in items[0]["detail"]


def test_failed_authentications_are_slowed_down_per_address(api: TestClient,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    _, _, token = user_token(api, "alice")
    for _ in range(10):
        assert api.get("/experiments", headers=auth("corel_wrong")).status_code == 401
    r = api.get("/experiments", headers=auth("corel_wrong"))
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    # The address is held off whatever it sends, until its failures leave the minute.
    assert api.get("/experiments", headers=auth(token)).status_code == 429
    assert any("authentication failed" in rec.message for rec in caplog.records)
    api.app.state.auth_failures._failures.clear()  # type: ignore[attr-defined]
    assert api.get("/experiments", headers=auth(token)).status_code == 200


def test_tokens_are_compared_as_digests_in_constant_time(api: TestClient,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, token = user_token(api, "alice")
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    last = token[:-1] + ("A" if token[-1] != "A" else "B")
    first = "x" + token[1:]  # not even the prefix: refused without a lookup
    for wrong in (last, first, BOOT[:-1] + "X"):
        assert api.get("/experiments", headers=auth(wrong)).status_code == 401
    assert api.get("/experiments", headers=auth(token)).status_code == 200
    # The bootstrap token, and the stored digest of a user's token, went through it.
    assert any(len(a) == 64 for a, _ in compared) and any(b == BOOT.encode() for _, b in compared)


def test_the_cli_adds_users_and_creates_and_revokes_tokens(api: TestClient,
                                                           own_settings: Settings) -> None:
    def corel(*args: str) -> subprocess.CompletedProcess[str]:
        return corel_cli(own_settings, *args)

    r = corel("users", "add", "dana", "--admin")
    assert r.returncode == 0 and "dana (admin)" in r.stdout, r.stderr
    assert corel("users", "add", "dana").returncode == 1
    r = corel("tokens", "create", "dana", "--scope", "admin", "--expires", "2")
    assert r.returncode == 0 and "shown this once" in r.stderr, r.stderr
    token = r.stdout.strip()
    token_id = int(r.stderr.split()[1])
    assert api.get("/users", headers=auth(token)).status_code == 200
    assert corel("tokens", "create", "nobody").returncode == 1
    r = corel("tokens", "revoke", str(token_id))
    assert r.returncode == 0, r.stderr
    assert api.get("/users", headers=auth(token)).status_code == 401
    # Each change, and each refusal, is in the audit log as the CLI's, with the OS user
    # and the host, as the same action over HTTP would be.
    cli = [(e["action"], e["resource"], e["outcome"]) for e in
           api.get("/audit", headers=ADMIN).json()["items"] if (e["client"] or "").startswith("cli ")]
    assert cli == [("corel tokens revoke", "token", "ok"), ("corel tokens create", None, "refused"),
                   ("corel tokens create", "token", "ok"), ("corel users add", None, "refused"),
                   ("corel users add", "user", "ok")], cli
    entry = api.get("/audit", params={"action": "corel users add"}, headers=ADMIN).json()["items"][-1]
    assert entry["client"] == f"cli {getpass.getuser()}@{socket.gethostname()}"[:64]
    assert entry["resource_id"] == api.get("/users", headers=ADMIN).json()[0]["id"]
    assert "nobody" in api.get("/audit", params={"action": "corel tokens create"},
                               headers=ADMIN).json()["items"][0]["detail"]


def test_users_list_and_revoke_their_own_tokens_and_admins_anyones(
        api: TestClient, own_settings: Settings) -> None:
    a_id, first_id, a = user_token(api, "alice")
    b_id, b_token_id, b = user_token(api, "bob")
    r = api.post(f"/users/{a_id}/tokens", json={"scope": "read", "name": "laptop"}, headers=ADMIN)
    second = r.json()["id"]
    listed = api.get("/me/tokens", headers=auth(a)).json()
    assert [t["id"] for t in listed] == [second, first_id]
    assert listed[0]["name"] == "laptop" and listed[0]["scope"] == "read"
    assert set(listed[0]) == {"id", "user_id", "name", "scope", "created_at", "expires_at",
                              "revoked_at", "last_used_at"}  # never the token, nor its hash
    assert listed[1]["last_used_at"] is not None  # it authenticated this very request
    assert listed[0]["last_used_at"] is None
    assert a not in api.get("/me/tokens", headers=auth(a)).text
    # Another user's token: as if there were none, and the refusal is audited.
    r = api.delete(f"/me/tokens/{b_token_id}", headers=auth(a))
    assert r.status_code == 404, r.text
    assert api.get("/me", headers=auth(b)).status_code == 200
    r = api.delete(f"/me/tokens/{second}", headers=auth(a))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert api.get("/me/tokens", headers=auth(a)).json()[0]["revoked_at"] is not None
    # A user's tokens are an admin's to list; another user's without admin scope: 403, audited.
    assert [t["id"] for t in api.get(f"/users/{b_id}/tokens", headers=ADMIN).json()] == [b_token_id]
    r = api.get(f"/users/{b_id}/tokens", headers=auth(a))
    assert r.status_code == 403 and "admin token" in r.json()["detail"]
    refused = api.get("/audit", params={"user_id": a_id}, headers=ADMIN).json()["items"]
    assert [(e["action"], e["outcome"], e["status"]) for e in refused][:2] == [
        (f"GET /users/{b_id}/tokens", "refused", 403),  # refused before routing: its path
        ("DELETE /me/tokens/{token_id}", "ok", 200)]
    assert ("DELETE /me/tokens/{token_id}", "refused", 404) in [
        (e["action"], e["outcome"], e["status"]) for e in refused]
    # The bootstrap admin is no user: it has no tokens of its own.
    assert api.get("/me/tokens", headers=ADMIN).json() == []
    r = api.delete(f"/me/tokens/{first_id}", headers=ADMIN)
    assert r.status_code == 404 and "DELETE /tokens/{token_id}" in r.json()["detail"]
    # The CLI's list: every user's, or one's; never a token.
    out = corel_cli(own_settings, "tokens", "list", "alice")
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()[1:]]
    assert [(int(r[0]), r[2], r[3], r[7]) for r in rows] == [(second, "laptop", "read", "revoked"),
                                                             (first_id, "-", "write", "valid")]
    assert a not in out.stdout


def test_rows_made_before_users_are_adopted_by_one(own_settings: Settings) -> None:
    """Rows made in the open mode have no owner: once users exist only admins see them
    (marked unowned); `corel users adopt` hands them to a user, all or by kind and id."""
    open_settings = own_settings.model_copy(update={"api_token": None})
    with TestClient(create_app(open_settings)) as c:
        runs = [c.post("/experiments", json=RUN).json()["id"] for _ in range(3)]
        sweep = c.post("/sweeps", json={"base": RUN, "grid": {"seed": [0, 1]}}).json()["id"]
        members = c.get(f"/sweeps/{sweep}").json()["experiment_ids"]
    def corel(*args: str) -> subprocess.CompletedProcess[str]:
        return corel_cli(own_settings, *args)

    assert corel("users", "add", "erin").returncode == 0
    out = corel("users", "list")
    assert "unowned" in out.stdout and "5 experiments, 1 sweep" in out.stdout, out.stdout
    r = corel("tokens", "create", "erin")
    erin = auth(r.stdout.strip())
    with TestClient(create_app(own_settings)) as api:
        assert api.get("/experiments", headers=erin).json()["total"] == 0
        assert api.get(f"/experiments/{runs[0]}", headers=erin).status_code == 404
        # Into a user that does not exist: named in the error, nothing handed over, audited.
        r = corel("users", "adopt", "nobody")
        assert r.returncode == 1 and "'nobody'" in r.stderr
        assert api.get("/experiments", headers=erin).json()["total"] == 0
        # A row that does not exist: nothing handed over, not even the others named.
        r = corel("users", "adopt", "erin", "--kind", "experiment", "--id", str(runs[0]),
                  "--id", "99999")
        assert r.returncode == 1 and "experiment 99999 does not exist" in r.stderr
        assert api.get(f"/experiments/{runs[0]}", headers=erin).status_code == 404
        r = corel("users", "adopt", "erin", "--kind", "sweep", "--id", str(sweep))
        assert r.returncode == 0, r.stderr
        assert api.get(f"/sweeps/{sweep}", headers=erin).json()["owner"]["name"] == "erin"
        mine = {e["id"] for e in api.get("/experiments", headers=erin).json()["items"]}
        assert mine == set(members)
        r = corel("users", "adopt", "erin")
        assert r.returncode == 0 and "3 rows handed to erin" in r.stdout, r.stdout
        mine = {e["id"] for e in api.get("/experiments", headers=erin).json()["items"]}
        assert mine == set(members) | set(runs)
        assert api.get(f"/experiments/{runs[0]}", headers=erin).json()["owner"]["name"] == "erin"
        actions = [(e["action"], e["outcome"]) for e in api.get("/audit", headers=ADMIN).json()["items"]
                   if e["action"].startswith("corel users adopt")]
        assert actions == [("corel users adopt", "ok"), ("corel users adopt --kind sweep --id "
                            f"{sweep}", "ok"), (f"corel users adopt --kind experiment --id {runs[0]}"
                            " --id 99999", "refused"), ("corel users adopt", "refused")]


def test_serve_refuses_the_network_with_no_token_and_no_users(own_settings: Settings) -> None:
    """With no COREL_API_TOKEN and no users the API is open: `corel serve` keeps that to the
    loopback, and refuses --host 0.0.0.0 saying what to set."""
    from app.cli.service import is_loopback, open_to_the_network

    assert all(map(is_loopback, ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.1.2.3", "corel.example")))
    bare = own_settings.model_copy(update={"api_token": None})
    assert open_to_the_network(bare, "127.0.0.1") is None
    assert open_to_the_network(own_settings, "0.0.0.0") is None  # COREL_API_TOKEN set
    refused = open_to_the_network(bare, "0.0.0.0")
    assert refused and "COREL_API_TOKEN" in refused and "corel users add" in refused
    env = corel_env(bare)
    env.pop("COREL_API_TOKEN", None)
    env.pop("COREL_BROKER_URL", None)  # the embedded default, as `make serve`
    done = subprocess.run([sys.executable, "-m", "corel.cli", "serve", "--host", "0.0.0.0",
                           "--port", "0", "--no-worker"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "refusing to serve on 0.0.0.0" in done.stderr and "COREL_API_TOKEN" in done.stderr
    with TestClient(create_app(bare)) as c:  # one user, and the network is allowed
        assert c.post("/users", json={"name": "first", "admin": True}).status_code == 201
    assert open_to_the_network(bare, "0.0.0.0") is None


@pytest.mark.parametrize("api_token", [None, BOOT])
def test_the_openapi_document_lists_the_token_answers(tmp_path: Any, api_token: str | None) -> None:
    """401 and 429 (with Retry-After) on every guarded operation, 403 on the writes and the
    admin routes, 404 wherever the path names a row; the bearer scheme says which tokens.
    The token is required with COREL_API_TOKEN; without, optional (open until a user)."""
    s = Settings(database_url=f"sqlite:///{tmp_path / 'doc.sqlite3'}", var_dir=tmp_path,
                 broker_url="memory://", api_token=SecretStr(api_token) if api_token else None)
    doc = create_app(s).openapi()
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert scheme["scheme"] == "bearer"
    assert "corel tokens create" in scheme["description"] and "COREL_API_TOKEN" in scheme["description"]
    writes = {("post", "/experiments"), ("delete", "/experiments/{experiment_id}"),
              ("post", "/experiments/{experiment_id}/shares"), ("post", "/datasets"),
              ("post", "/experiments/{experiment_id}/cancel")}
    admin = {("get", "/users"), ("post", "/users"), ("post", "/users/{user_id}/tokens"),
             ("delete", "/tokens/{token_id}"), ("get", "/audit")}
    reads = {("get", "/experiments"), ("get", "/me"), ("post", "/embed"),
             ("post", "/experiments/{experiment_id}/neighbors")}
    want_security: list[dict[str, list[str]]] = [{"bearer": []}] if api_token else [{"bearer": []}, {}]
    for method, path in writes | admin | reads:
        op = doc["paths"][path][method]
        codes = set(op["responses"])
        assert {"401", "429"} <= codes, (method, path)
        assert ("403" in codes) == ((method, path) not in reads), (method, path)
        assert "Retry-After" in op["responses"]["429"]["headers"]
        assert op["security"] == want_security
        if "{" in path:
            assert "404" in codes, (method, path)
    for path in ("/health", "/ready"):
        assert not {"401", "403", "429"} & set(doc["paths"][path]["get"]["responses"])
        assert "security" not in doc["paths"][path]["get"]


def test_a_refused_write_leaves_an_audit_entry(api: TestClient) -> None:
    """A write refused before its handler runs, by the token's scope or by the access check
    of the row its path names, is audited "refused" with its status; a refused read is not,
    nor is a token that names no user."""
    _, _, a = user_token(api, "alice")
    b_id, b_token_id, b = user_token(api, "bob")
    r_id, _, reader = user_token(api, "reader", scope="read")
    run = submit(api, a)
    assert api.delete(f"/experiments/{run}", headers=auth(b)).status_code == 404
    assert api.get(f"/experiments/{run}", headers=auth(b)).status_code == 404
    api.post(f"/experiments/{run}/shares", json={"user_id": b_id, "access": "read"}, headers=auth(a))
    assert api.post(f"/experiments/{run}/cancel", headers=auth(b)).status_code == 403
    assert api.post("/experiments", json=RUN, headers=auth(reader)).status_code == 403
    assert api.post("/users", json={"name": "x"}, headers=auth(b)).status_code == 403
    assert api.post("/experiments", json=RUN, headers=auth("corel_" + "x" * 43)).status_code == 401
    # A row named in the body, checked by the route itself: refused all the same.
    r = api.post("/datasets", files={"file": ("a.npz", npz_bytes(x=np.eye(6, 3), y=np.arange(6) % 2))},
                 headers=auth(a))
    r = api.post("/experiments", json={"dataset": "npz", "dataset_id": r.json()["id"]},
                 headers=auth(b))
    assert r.status_code == 404, r.text

    def entries(user_id: int) -> list[tuple[str, str | None, int | None, str, int]]:
        items = api.get("/audit", params={"user_id": user_id}, headers=ADMIN).json()["items"]
        return [(e["action"], e["resource"], e["resource_id"], e["outcome"], e["status"])
                for e in items]

    assert entries(b_id) == [
        ("POST /experiments", None, None, "refused", 404),
        ("POST /users", None, None, "refused", 403),
        ("POST /experiments/{experiment_id}/cancel", "experiment", run, "refused", 403),
        ("DELETE /experiments/{experiment_id}", "experiment", run, "refused", 404)]
    assert entries(r_id) == [("POST /experiments", None, None, "refused", 403)]
    item = api.get("/audit", params={"user_id": b_id}, headers=ADMIN).json()["items"][-1]  # DELETE
    assert item["token_id"] == b_token_id and "does not exist" in item["detail"]
    everything = api.get("/audit", headers=ADMIN).json()["items"]
    assert [e["outcome"] for e in everything].count("refused") == 5  # not the 401
    assert api.get(f"/experiments/{run}", headers=auth(a)).json()["status"] != "cancelled"


ZONED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _date_times(doc: dict[str, Any], schema: Any, value: Any) -> Iterator[tuple[str, Any]]:
    """(where, value) of every field of ``value`` that ``schema`` (of the OpenAPI document
    ``doc``) declares a date-time."""
    if not isinstance(schema, dict) or value is None:
        return
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].split("/")[-1]]
    if schema.get("format") == "date-time":
        yield "", value
    for option in schema.get("anyOf", []) + schema.get("allOf", []):
        yield from _date_times(doc, option, value)
    if isinstance(value, list):
        for i, item in enumerate(value):
            for where, found in _date_times(doc, schema.get("items"), item):
                yield f"[{i}]{where}", found
    elif isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            for where, found in _date_times(doc, sub, value.get(name)):
                yield f".{name}{where}", found


def test_every_timestamp_the_api_returns_carries_its_zone(api: TestClient,
                                                          own_settings: Settings) -> None:
    """Every date-time of the OpenAPI document, in real answers of every route that has
    one, on SQLite (which keeps no offset) and PostgreSQL: ISO 8601 with its offset."""
    from app.core.models import (
        AliasMove,
        EmbeddingJob,
        ModelAlias,
        ModelVersion,
        NeighborIndex,
        RegisteredModel,
        Status,
    )

    uid, token_id, token = user_token(api, "tz")
    run = submit(api, token)
    answers: dict[tuple[str, str], Any] = {}

    def call(method: str, template: str, **kwargs: Any) -> Any:
        ids = {"experiment_id": run, "user_id": uid, "token_id": token_id, **ids_,
               **kwargs.pop("ids", {})}
        r = api.request(method, template.format(**ids), headers=kwargs.pop("headers", auth(token)),
                        **kwargs)
        assert r.status_code < 300, (method, template, r.text)
        answers[(method, template)] = r.json()
        return r.json()

    ids_: dict[str, Any] = {}
    upload = call("POST", "/datasets", files={"file": ("t.npz", npz_bytes(x=np.eye(6, 3), y=np.arange(6) % 2))})
    ids_["dataset_id"] = upload["id"]
    ids_["sweep_id"] = call("POST", "/sweeps", json={"base": RUN, "grid": {"seed": [0]}})["id"]
    with tempfile.TemporaryDirectory() as tmp:  # an encoder of the user's own (POST /encoders)
        weights = timm_weights(Path(tmp) / "w.safetensors").read_bytes()
    ids_["encoder_id"] = call("POST", "/encoders", files={"file": ("w.safetensors", weights)},
                              data={"architecture": "test_efficientnet"})["id"]
    factory = make_sessionmaker(engine := make_engine(own_settings.db_url))
    with factory.begin() as session:  # a job and an index of the run, as a worker leaves them
        now = utcnow()
        job = EmbeddingJob(experiment_id=run, dataset_id=upload["id"], status=Status.QUEUED, n_total=6,
                           n_done=0, cancel_requested=False, created_at=now, attempts=0,
                           enqueued_at=now, enqueues=1, owner_id=uid)
        index = NeighborIndex(experiment_id=run, source="train", requested_kind="exact",
                              geometry="cosine", status=Status.QUEUED, n_total=6, n_done=0,
                              cancel_requested=False, created_at=now, attempts=0, enqueued_at=now,
                              enqueues=1, owner_id=uid)
        session.add_all([job, index])
        session.flush()
        session.get(Experiment, run).status = Status.SUCCEEDED  # its indexes may be listed
        ids_.update(job_id=job.id, index_id=index.id)
    # A model: two versions of the run, an alias with a move, as a worker leaves them (a
    # version's POST reads a checkpoint: none without a worker).
    ids_.update(name="tz-model", alias="staging")
    call("POST", "/models", json={"name": "tz-model"})
    with factory.begin() as session:
        model = session.scalar(select(RegisteredModel).where(RegisteredModel.name == "tz-model"))
        model.contract = {"inputs": "arrays", "shape": [3], "class_names": ["0", "1"]}
        session.add_all([ModelVersion(model_id=model.id, version=v, experiment_id=run, created_by=uid)
                         for v in (1, 2)])
        session.add(ModelAlias(model_id=model.id, name="staging", version=1))
        session.add(AliasMove(model_id=model.id, alias="staging", from_version=None, to_version=1, user_id=uid))
    engine.dispose()
    ids_["promotion_id"] = call("POST", "/models/{name}/aliases/{alias}",
                                json={"version": 2, "expected_version": 1})["promotion_id"]
    call("POST", "/models/{name}/collections", json={"dataset_id": upload["id"]})
    call("PATCH", "/models/{name}", json={"description": "with a zone"})
    api.post(f"/experiments/{run}/shares", json={"public": True}, headers=auth(token))
    call("POST", "/users/{user_id}/tokens", json={"scope": "read"}, headers=ADMIN)
    call("POST", "/users", json={"name": "tz2"}, headers=ADMIN)
    doc = api.get("/openapi.json").json()
    with_dates: list[tuple[str, str]] = []
    for template, ops in doc["paths"].items():
        for method, op in ops.items():
            content = next(iter(op["responses"].values())).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            if _declares_date_time(doc, schema):
                with_dates.append((method.upper(), template))
    assert len(with_dates) >= 24, with_dates
    admin_paths = ("/users", "/audit", "/tokens")
    for method, template in with_dates:
        if method == "GET":
            call("GET", template, headers=ADMIN if template.startswith(admin_paths) else auth(token))
    call("POST", "/experiments/{experiment_id}/cancel", ids={"experiment_id": submit(api, token)})
    call("POST", "/sweeps/{sweep_id}/cancel")
    call("POST", "/embeddings/{job_id}/cancel")
    call("POST", "/indexes/{index_id}/cancel")
    call("DELETE", "/me/tokens/{token_id}")
    call("DELETE", "/tokens/{token_id}", headers=ADMIN)
    call("GET", "/audit", headers=ADMIN)  # with the writes above in it
    # Those that create a run or a job from a trained one are not answered here (no worker).
    untested = {r for r in with_dates if r not in answers}
    assert untested == {("POST", "/experiments/{experiment_id}/embeddings"),
                        ("POST", "/experiments/{experiment_id}/index"),
                        ("POST", "/models/{name}/versions")}, untested
    for method, template in answers:
        op = doc["paths"][template][method.lower()]
        schema = next(iter(op["responses"].values())).get("content", {}).get(
            "application/json", {}).get("schema")
        found = list(_date_times(doc, schema, answers[(method, template)]))
        assert found or (method, template) not in with_dates, (method, template)
        for where, value in found:
            assert isinstance(value, str) and ZONED.match(value), (method, template, where, value)


def _declares_date_time(doc: dict[str, Any], schema: Any, seen: frozenset[str] = frozenset()) -> bool:
    if isinstance(schema, list):
        return any(_declares_date_time(doc, x, seen) for x in schema)
    if not isinstance(schema, dict):
        return False
    if schema.get("format") == "date-time":
        return True
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        return name not in seen and _declares_date_time(
            doc, doc["components"]["schemas"][name], seen | {name})
    return any(_declares_date_time(doc, v, seen) for v in schema.values())
