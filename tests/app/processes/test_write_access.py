"""Every route of the OpenAPI document that writes needs write access to what it changes
(issue 45): acting as a user with no share, a user with a read share and a read-scope
token of the owner, each is refused (404, 403, 403) with nothing written and the refusal
audited; the POSTs that only compute from a model (/embed, /predict, /neighbors) are
checked the other way round: a read share may use them, no share may not.

A route without a rule in :data:`RULES` fails :func:`test_every_route_that_writes_has_a_rule`:
a new route must say who may call it. Real parts: PostgreSQL, Redis and a worker process,
on a database and a queue of this module's own (users end the open mode of the suite's).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import func, select, text

from app.core.db import Base, make_engine, make_sessionmaker
from app.core.models import AuditEntry
from app.core.settings import Settings
from app.main import create_app
from harness.wait import wait_until
from tests.app.conftest import Workers, npz_bytes, own_database

pytestmark = pytest.mark.own_auth

BOOT = "write-access-bootstrap"
DIGITS = {"dataset": "digits", "epochs": 3, "batch_size": 64, "lr": 0.003, "loss": "cosine",
          "lam": 0.8}

# How a route is checked:
# - "path": changes the row its path names (or makes one under it): a user with no share
#   of it 404, a read share 403, the owner's read token 403.
# - "upload": makes a run from an upload its body names: the same, for the upload.
# - "manage": shares the row its path names: its owner's or an admin's; a read share 403
#   and a write share 403 too.
# - "own": makes a row of the caller's own from nothing another user owns: a read token 403.
# - "admin": an admin's: a user's write token 403, a read token 403.
# - "self": the caller's own tokens: another user's token 404, a read token 403.
# - "compute": only computes from a trained model: a read share may, no share 404.
RULES: dict[tuple[str, str], str] = {
    ("POST", "/experiments"): "upload",
    ("DELETE", "/experiments/{experiment_id}"): "path",
    ("POST", "/experiments/{experiment_id}/cancel"): "path",
    ("POST", "/datasets"): "own",
    ("POST", "/sweeps"): "upload",
    ("POST", "/sweeps/{sweep_id}/cancel"): "path",
    ("POST", "/experiments/{experiment_id}/embeddings"): "path",
    ("POST", "/embeddings/{job_id}/cancel"): "path",
    ("POST", "/experiments/{experiment_id}/index"): "path",
    ("POST", "/indexes/{index_id}/cancel"): "path",
    ("POST", "/experiments/{experiment_id}/shares"): "manage",
    ("DELETE", "/experiments/{experiment_id}/shares/{share_id}"): "manage",
    ("POST", "/sweeps/{sweep_id}/shares"): "manage",
    ("DELETE", "/sweeps/{sweep_id}/shares/{share_id}"): "manage",
    ("POST", "/datasets/{dataset_id}/shares"): "manage",
    ("DELETE", "/datasets/{dataset_id}/shares/{share_id}"): "manage",
    ("POST", "/encoders"): "own",
    ("POST", "/encoders/{encoder_id}/shares"): "manage",
    ("DELETE", "/encoders/{encoder_id}/shares/{share_id}"): "manage",
    ("POST", "/users"): "admin",
    ("POST", "/users/{user_id}/tokens"): "admin",
    ("DELETE", "/tokens/{token_id}"): "admin",
    ("DELETE", "/me/tokens/{token_id}"): "self",
    ("POST", "/embed"): "compute",
    ("POST", "/predict"): "compute",
    ("POST", "/experiments/{experiment_id}/neighbors"): "compute",
    ("POST", "/embed/files"): "compute",
    ("POST", "/predict/files"): "compute",
    ("POST", "/experiments/{experiment_id}/neighbors/files"): "compute",
    ("POST", "/models"): "own",
    ("PATCH", "/models/{name}"): "path",
    ("POST", "/models/{name}/versions"): "path",
    ("POST", "/models/{name}/aliases/{alias}"): "path",
    ("POST", "/models/{name}/collections"): "path",
    ("POST", "/models/{name}/shares"): "manage",
    ("DELETE", "/models/{name}/shares/{share_id}"): "manage",
    ("POST", "/models/{name}/neighbors"): "compute",
}
MODEL = "team-model"  # the owner's model: version 1 its run, production its alias, its upload a collection


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Team:
    client: TestClient
    settings: Settings
    ids: dict[str, int]  # the owner's rows: experiment, sweep, dataset, job, index, shares
    tokens: dict[str, str]  # owner, owner_read, reader, writer, stranger, admin
    users: dict[str, int]

    def counts(self) -> dict[str, int]:
        """Rows in every table but the audit log's (a refusal adds an entry there), once
        no run, embedding job or index build of an earlier test is still writing its own
        (a run an earlier test submitted and left training added its epochs between two
        counts of a later test)."""
        engine = make_engine(self.settings.db_url)
        try:
            with engine.connect() as conn:
                def settled() -> bool:
                    return all(conn.execute(text(
                        f"SELECT count(*) FROM {table} WHERE status IN ('queued', 'running')"
                    )).scalar_one() == 0 for table in ("experiments", "embedding_jobs",
                                                       "neighbor_indexes"))
                wait_until(settled, 180, "earlier tests' work to finish", interval=0.2)
                return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                        for t in Base.metadata.sorted_tables if t.name != AuditEntry.__tablename__}
        finally:
            engine.dispose()

    def audit(self) -> list[tuple[str, str, int | None]]:
        factory = make_sessionmaker(engine := make_engine(self.settings.db_url))
        try:
            with factory() as session:
                return [(e.action, e.outcome, e.status) for e in session.scalars(
                    select(AuditEntry).order_by(AuditEntry.id))]
        finally:
            engine.dispose()


def _until(c: TestClient, path: str, headers: dict[str, str], timeout: float = 180) -> dict:
    def succeeded() -> dict | None:
        body = c.get(path, headers=headers).json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            assert body["status"] == "succeeded", (body.get("error"), body.get("phase"))
            return dict(body)
        return None

    return wait_until(succeeded, timeout, f"{path} to finish", interval=0.2)


@pytest.fixture(scope="module")
def team(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    tmp = tmp_path_factory.mktemp("write-access")
    (tmp / "logs").mkdir()
    with own_database(settings, tmp) as own:
        s = own.model_copy(update={"api_token": SecretStr(BOOT)})
        workers = Workers(s, tmp / "logs")
        try:
            workers.start(s)
            with TestClient(create_app(s)) as c:
                yield _build_team(c, s)
        finally:
            workers.stop_all()


def _build_team(c: TestClient, s: Settings) -> Team:
    boot = auth(BOOT)
    tokens: dict[str, str] = {"admin": BOOT}
    users: dict[str, int] = {}
    for who in ("owner", "reader", "writer", "stranger"):
        uid = c.post("/users", json={"name": who}, headers=boot).json()["id"]
        users[who] = uid
        r = c.post(f"/users/{uid}/tokens", json={"scope": "write"}, headers=boot)
        assert r.status_code == 201, r.text
        tokens[who] = r.json()["token"]
    r = c.post(f"/users/{users['owner']}/tokens", json={"scope": "read"}, headers=boot)
    tokens["owner_read"] = r.json()["token"]
    owner = auth(tokens["owner"])
    y = np.arange(90) % 3
    x = (np.random.default_rng(0).normal(size=(90, 64)) + 4 * np.eye(3, 64)[y]).astype(np.float32)
    x = np.clip(x + 8, 0, 16).reshape(90, 8, 8)  # digits' raw pixels
    r = c.post("/datasets", files={"file": ("blobs.npz", npz_bytes(x=x, y=y))}, headers=owner)
    assert r.status_code == 201, r.text
    ids = {"dataset": r.json()["id"]}
    r = c.post("/encoders", files={"file": ("mine.safetensors", _weights())},
               data={"architecture": "test_efficientnet"}, headers=owner)
    assert r.status_code == 201, r.text
    ids["encoder"] = r.json()["id"]
    r = c.post("/experiments", json=DIGITS, headers=owner)
    assert r.status_code == 202, r.text
    ids["experiment"] = r.json()["id"]
    r = c.post("/sweeps", json={"base": {**DIGITS, "epochs": 1}, "grid": {"seed": [0, 1]}},
               headers=owner)
    assert r.status_code == 202, r.text
    ids["sweep"] = r.json()["id"]
    _until(c, f"/experiments/{ids['experiment']}", owner)
    r = c.post(f"/experiments/{ids['experiment']}/embeddings", json={"dataset_id": ids["dataset"]},
               headers=owner)
    assert r.status_code == 202, r.text
    ids["job"] = r.json()["id"]
    r = c.post(f"/experiments/{ids['experiment']}/index", json={"kind": "exact"}, headers=owner)
    assert r.status_code == 202, r.text
    ids["index"] = r.json()["id"]
    _until(c, f"/embeddings/{ids['job']}", owner)
    _until(c, f"/indexes/{ids['index']}", owner)
    for kind, key in (("experiments", "experiment"), ("sweeps", "sweep"), ("datasets", "dataset"),
                      ("encoders", "encoder")):
        for who, level in (("reader", "read"), ("writer", "write")):
            r = c.post(f"/{kind}/{ids[key]}/shares", json={"user_id": users[who], "access": level},
                       headers=owner)
            assert r.status_code == 200, r.text
        ids[f"{key}_share"] = next(x["id"] for x in r.json()["shares"]
                                   if x["user_id"] == users["reader"])
    assert c.post("/models", json={"name": MODEL}, headers=owner).status_code == 201
    r = c.post(f"/models/{MODEL}/versions", json={"experiment_id": ids["experiment"]}, headers=owner)
    assert r.status_code == 201, r.text
    assert c.post(f"/models/{MODEL}/collections", json={"dataset_id": ids["dataset"]},
                  headers=owner).status_code == 202
    r = c.post(f"/models/{MODEL}/aliases/production", json={"version": 1, "expected_version": None},
               headers=owner)
    assert r.status_code == 202, r.text
    _until(c, f"/models/{MODEL}/promotions/{r.json()['promotion_id']}", owner)
    for who, level in (("reader", "read"), ("writer", "write")):
        r = c.post(f"/models/{MODEL}/shares", json={"user_id": users[who], "access": level}, headers=owner)
        assert r.status_code == 200, r.text
    ids["model_share"] = next(x["id"] for x in r.json()["shares"] if x["user_id"] == users["reader"])
    r = c.post(f"/users/{users['stranger']}/tokens", json={"scope": "read"}, headers=boot)
    ids["stranger_token"] = r.json()["id"]
    return Team(c, s, ids, tokens, users)


def _request(team: Team, method: str, path: str) -> tuple[str, dict[str, Any] | None, dict | None]:
    """The concrete path of a route's template, on the owner's rows, and a valid body."""
    ids = team.ids
    concrete = path.format(experiment_id=ids["experiment"], sweep_id=ids["sweep"],
                           dataset_id=ids["dataset"], job_id=ids["job"], index_id=ids["index"],
                           encoder_id=ids["encoder"], name=MODEL, alias="production",
                           user_id=team.users["stranger"], token_id=ids["stranger_token"],
                           share_id=ids[f"{_kind_of(path)}_share"] if "{share_id}" in path else 0)
    rows = [[[0.0] * 8] * 8]  # one 8 x 8 image (digits)
    bodies: dict[tuple[str, str], Any] = {
        ("POST", "/experiments"): {"dataset": "npz", "dataset_id": ids["dataset"], "epochs": 1},
        ("POST", "/sweeps"): {"base": {"dataset": "npz", "dataset_id": ids["dataset"], "epochs": 1},
                              "grid": {"seed": [0, 1]}},
        ("POST", "/experiments/{experiment_id}/embeddings"): {"dataset_id": ids["dataset"]},
        ("POST", "/experiments/{experiment_id}/index"): {"kind": "exact"},
        ("POST", "/experiments/{experiment_id}/shares"): {"public": True},
        ("POST", "/sweeps/{sweep_id}/shares"): {"public": True},
        ("POST", "/datasets/{dataset_id}/shares"): {"public": True},
        ("POST", "/encoders/{encoder_id}/shares"): {"public": True},
        ("POST", "/users"): {"name": "intruder"},
        ("POST", "/users/{user_id}/tokens"): {"scope": "write"},
        ("POST", "/embed"): {"experiment_id": ids["experiment"], "arrays": rows},
        ("POST", "/predict"): {"experiment_id": ids["experiment"], "arrays": rows},
        ("POST", "/experiments/{experiment_id}/neighbors"): {"arrays": rows, "k": 3},
        ("POST", "/models"): {"name": "another-model"},
        ("PATCH", "/models/{name}"): {"description": "changed"},
        ("POST", "/models/{name}/versions"): {"experiment_id": ids["experiment"]},
        ("POST", "/models/{name}/aliases/{alias}"): {"version": 1, "expected_version": 1, "force": True},
        ("POST", "/models/{name}/collections"): {"dataset_id": ids["dataset"]},
        ("POST", "/models/{name}/shares"): {"public": True},
        ("POST", "/models/{name}/neighbors"): {"alias": "production", "collection": ids["dataset"],
                                               "arrays": rows, "k": 3},
    }
    # The forms' routes take the JSON bodies too.
    for route in ("/embed", "/predict", "/experiments/{experiment_id}/neighbors"):
        bodies[("POST", route + "/files")] = bodies[("POST", route)]
    files = None
    if (method, path) == ("POST", "/datasets"):
        files = {"file": ("mine.npz", npz_bytes(x=np.eye(6, 4, dtype=np.float32),
                                                y=np.arange(6) % 2))}
    if (method, path) == ("POST", "/encoders"):
        files = {"file": ("mine.safetensors", _weights())}
    return concrete, bodies.get((method, path)), files


def _kind_of(path: str) -> str:
    return {"experiments": "experiment", "sweeps": "sweep", "datasets": "dataset",
            "encoders": "encoder", "models": "model"}[path.split("/")[1]]


def _weights() -> bytes:
    """timm's test_efficientnet's weights (99k parameters), as a safetensors file."""
    import tempfile
    from pathlib import Path

    from tests.encoder_files import timm_weights

    with tempfile.TemporaryDirectory() as tmp:
        return timm_weights(Path(tmp) / "w.safetensors").read_bytes()


def _routes(team: Team) -> list[tuple[str, str]]:
    doc = team.client.get("/openapi.json").json()
    return sorted((method.upper(), path) for path, ops in doc["paths"].items() for method in ops
                  if method.upper() not in ("GET", "HEAD", "OPTIONS"))


def test_every_route_that_writes_has_a_rule(team: Team) -> None:
    routes = set(_routes(team))
    assert routes - set(RULES) == set(), "routes without a rule: say who may call them"
    assert set(RULES) - routes == set(), "rules for routes the API does not have"


# Who is refused how, per rule: (the caller's token, the status, words of the answer).
REFUSED: dict[str, list[tuple[str, int, str]]] = {
    "path": [("stranger", 404, "does not exist"), ("reader", 403, "reading only"),
             ("owner_read", 403, "scope read")],
    "upload": [("stranger", 404, "does not exist"), ("reader", 403, "reading only"),
               ("owner_read", 403, "scope read")],
    "manage": [("stranger", 404, "does not exist"), ("reader", 403, "owner"),
               ("writer", 403, "owner"), ("owner_read", 403, "scope read")],
    "own": [("owner_read", 403, "scope read")],
    "admin": [("owner", 403, "admin"), ("owner_read", 403, "admin")],
    "self": [("owner", 404, "does not exist"), ("reader", 404, "does not exist")],
    "compute": [("stranger", 404, "does not exist")],
}


@pytest.mark.parametrize("route", sorted(RULES), ids=lambda r: f"{r[0]} {r[1]}")
def test_a_write_is_refused_without_write_access_and_writes_nothing(
        team: Team, route: tuple[str, str]) -> None:
    method, template = route
    if route not in set(_routes(team)):
        pytest.fail(f"{method} {template} is not a route of the API")
    path, body, files = _request(team, method, template)
    for who, status, words in REFUSED[RULES[route]]:
        before, audited = team.counts(), len(team.audit())
        r = team.client.request(method, path, json=body, files=files, headers=auth(team.tokens[who]))
        assert r.status_code == status, (who, method, path, r.text)
        assert words in r.json()["detail"], (who, method, path, r.text)
        assert team.counts() == before, f"{who}: {method} {path} wrote rows"
        if RULES[route] != "compute":
            entries = team.audit()[audited:]
            assert [(e[1], e[2]) for e in entries] == [("refused", status)], (who, entries)


@pytest.mark.parametrize("route", [r for r, rule in sorted(RULES.items()) if rule == "compute"],
                         ids=lambda r: f"{r[0]} {r[1]}")
def test_a_read_share_and_a_read_token_may_use_a_model(team: Team, route: tuple[str, str]) -> None:
    method, template = route
    path, body, _ = _request(team, method, template)
    for who in ("reader", "owner_read"):
        before = team.counts()
        r = team.client.request(method, path, json=body, headers=auth(team.tokens[who]))
        assert r.status_code == 200, (who, r.text)
        assert team.counts() == before


def test_a_read_share_cannot_index_another_users_run_and_a_write_share_builds_one_its_owner_sees(
        team: Team) -> None:
    """The hole of issue 45: a read share built an index that became the owner's default
    for /neighbors, which the owner could not even see."""
    c, ids = team.client, team.ids
    owner, reader, writer = (auth(team.tokens[w]) for w in ("owner", "reader", "writer"))
    exp = ids["experiment"]
    before = [i["id"] for i in c.get(f"/experiments/{exp}/indexes", headers=owner).json()]
    r = c.post(f"/experiments/{exp}/index", json={"kind": "exact"}, headers=reader)
    assert r.status_code == 403, r.text
    assert [i["id"] for i in c.get(f"/experiments/{exp}/indexes", headers=owner).json()] == before
    r = c.post(f"/experiments/{exp}/index", json={"kind": "exact"}, headers=writer)
    assert r.status_code == 202, r.text
    built = r.json()["id"]
    _until(c, f"/indexes/{built}", writer)
    # Owned by its maker; its experiment's owner sees it, lists it and may cancel it.
    engine = make_engine(team.settings.db_url)
    with engine.connect() as conn:
        owner_id = conn.execute(text("SELECT owner_id FROM neighbor_indexes WHERE id = :i"),
                                {"i": built}).scalar_one()
    engine.dispose()
    assert owner_id == team.users["writer"]
    assert c.get(f"/indexes/{built}", headers=owner).status_code == 200
    assert [i["id"] for i in c.get(f"/experiments/{exp}/indexes", headers=owner).json()] == \
        [built, *before]
    r = c.post(f"/indexes/{built}/cancel", headers=owner)
    assert r.status_code == 409, r.text  # not refused: it has finished
    # A read share of the experiment sees it too, and may not cancel it.
    assert c.get(f"/indexes/{built}", headers=reader).status_code == 200
    assert c.post(f"/indexes/{built}/cancel", headers=reader).status_code == 403
    assert c.get(f"/indexes/{built}", headers=auth(team.tokens["stranger"])).status_code == 404


def test_a_write_share_of_an_upload_trains_from_it(team: Team) -> None:
    c, ids = team.client, team.ids
    r = c.post("/experiments", json={"dataset": "npz", "dataset_id": ids["dataset"], "epochs": 1},
               headers=auth(team.tokens["writer"]))
    assert r.status_code == 202, r.text
    run = r.json()["id"]
    got = c.get(f"/experiments/{run}", headers=auth(team.tokens["writer"])).json()
    assert got["owner"] == {"id": team.users["writer"], "name": "writer"}
    assert c.get(f"/experiments/{run}", headers=auth(team.tokens["owner"])).status_code == 404




def test_training_on_another_user_s_encoder_needs_a_write_share_of_it(team: Team) -> None:
    """As for uploads: a read share of an encoder sees it, and may not train on it."""
    c, ids = team.client, team.ids
    spec = {"dataset": "digits", "encoder_id": ids["encoder"], "epochs": 1, "train_subset": 30}
    before = team.counts()
    for who, status, words in (("stranger", 404, "does not exist"), ("reader", 403, "reading only")):
        r = c.post("/experiments", json=spec, headers=auth(team.tokens[who]))
        assert r.status_code == status and words in r.json()["detail"], (who, r.text)
    assert team.counts() == before
    assert c.get(f"/encoders/{ids['encoder']}", headers=auth(team.tokens["reader"])).status_code == 200
    assert c.get(f"/encoders/{ids['encoder']}", headers=auth(team.tokens["stranger"])).status_code == 404
    r = c.post("/experiments", json=spec, headers=auth(team.tokens["writer"]))
    assert r.status_code == 202, r.text
    got = c.get(f"/experiments/{r.json()['id']}", headers=auth(team.tokens["writer"])).json()
    assert got["spec"]["encoder"] == "timm:test_efficientnet"
    c.post(f"/experiments/{r.json()['id']}/cancel", headers=auth(team.tokens["writer"]))
