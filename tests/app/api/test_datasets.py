"""Uploads: validated on arrival, stored, and trainable by a real worker."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.app.conftest import npz_bytes
from tests.conftest import SHARED_DATASETS, require


def blobs(n=600, k=3, d=5, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    x = rng.normal(size=(n, d)) + 4 * np.eye(k, d)[y]
    return x.astype(np.float32), y


def test_upload_ag_news_csv(client):
    require((SHARED_DATASETS / "ag_news" / "test.csv").exists(), "AG News test split")
    head = (SHARED_DATASETS / "ag_news" / "test.csv").read_bytes().splitlines()[:300]
    r = client.post("/datasets", files={"file": ("news.csv", b"\n".join(head))})
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "ag-news" and r.json()["summary"]["n"] == 300
    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": r.json()["id"]})
    assert r.status_code == 422 and "'ag-news' upload" in r.json()["detail"]


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("junk.npz", b"this is not a zip file", "not usable"),
        ("nolabels.npz", npz_bytes(x=np.zeros((10, 2))), "y"),
        ("short.npz", npz_bytes(x=np.zeros((10, 2)), y=np.zeros(9, int)), "not usable"),
        ("nan.npz", npz_bytes(x=np.full((30, 2), np.nan), y=np.arange(30) % 3), "not usable"),
        ("one.npz", npz_bytes(x=np.zeros((30, 2)), y=np.zeros(30, int)), "not usable"),
        ("bad.csv", b"a,b,c\nd,e,f\n", "not usable"),
        ("empty.npz", b"", "empty"),
        ("notes.txt", b"hello", "cannot tell the kind"),
    ],
)
def test_bad_uploads_get_422(client, name, data, words):
    r = client.post("/datasets", files={"file": (name, data)})
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]


def test_unknown_kind_is_422(client):
    r = client.post("/datasets", files={"file": ("a.npz", b"x")}, data={"kind": "parquet"})
    assert r.status_code == 422 and "'npz', 'ag-news', 'features', 'text' or 'images'; got 'parquet'" \
        in r.json()["detail"], r.text


def test_missing_file_is_422(client):
    assert client.post("/datasets").status_code == 422


def test_upload_over_the_limit_is_413(settings):
    small = settings.model_copy(update={"max_upload_bytes": 1000})
    x, y = blobs()
    with TestClient(create_app(small)) as c:
        r = c.post("/datasets", files={"file": ("big.npz", npz_bytes(x=x, y=y))})
    assert r.status_code == 413 and "1000 bytes" in r.json()["detail"]


@pytest.mark.parametrize("name, data", [
    ("zip signature then garbage", b"PK\x03\x04" + bytes(range(256)) * 4),
    ("truncated archive", npz_bytes(x=np.zeros((40, 3)), y=np.arange(40) % 2)[:300]),
    ("damaged member", (lambda b: b[:120] + bytes(v ^ 0xFF for v in b[120:200]) + b[200:])(
        npz_bytes(x=np.zeros((40, 3)), y=np.arange(40) % 2))),
])
def test_corrupt_npz_uploads_are_422_without_server_paths(client, name, data):
    r = client.post("/datasets", files={"file": ("bad.npz", data)})
    assert r.status_code == 422, (name, r.status_code, r.text)
    detail = r.json()["detail"]
    assert "not usable" in detail and "/tmp" not in detail and "upload" in detail, detail
