"""One cluster for the module: a database host, an API host, two worker hosts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from sklearn.datasets import load_digits

from harness.hosts import API_TOKEN, Cluster, cluster_available
from harness.wait import wait_until
from tests.app.conftest import npz_bytes
from tests.conftest import require

# Short leases so that a lost host's runs move within seconds; a peer that is silent for
# 3 s is given up on (both ends of a database connection).
SETTINGS = {
    "COREL_LEASE_SECONDS": "6",
    "COREL_HEARTBEAT_SECONDS": "1",
    "COREL_DB_PEER_TIMEOUT_SECONDS": os.environ.get("COREL_TEST_CLUSTER_PEER_TIMEOUT", "3"),
    "COREL_RETRY_MAX_PAUSE": "1",
    "COREL_TRANSIENT_RETRY_SECONDS": "900",
    "COREL_DOWNLOAD": "false",
    "COREL_LOG_LEVEL": "INFO",
    # Each epoch commits: test_2 cuts a host while its worker is in an epoch's transaction
    # after epoch 2, and its 40 short epochs, held a second at a time, may all train before
    # that (a run lost with epochs held: tests/worker/test_runner.py).
    "COREL_EPOCH_COMMIT_SECONDS": "0",
}
FINISHED = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    why = cluster_available()
    require(why is None, f"a cluster of network namespaces ({why})")
    c = Cluster(SETTINGS)
    try:
        c.migrate()
        c.url = c.start_api()
        c.start_worker("w1", cpu=0)
        c.start_worker("w2", cpu=1)
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.close()


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.url, timeout=30,
                      headers={"Authorization": f"Bearer {API_TOKEN}"}) as client:
        yield client


@pytest.fixture(scope="module")
def upload(api: httpx.Client) -> int:
    """scikit-learn's digits, uploaded through the API host (kept in the S3 store)."""
    d = load_digits()
    r = api.post("/datasets", files={"file": ("digits.npz", npz_bytes(x=d.data.astype(np.float32),
                                                                      y=d.target))})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def wait(api: httpx.Client, path: str, until: Any = lambda b: b["status"] in FINISHED,
         timeout: float = 180) -> dict[str, Any]:
    def there() -> dict[str, Any] | None:
        r = api.get(path)
        return r.json() if r.status_code == 200 and until(r.json()) else None

    return wait_until(there, timeout, f"{path} to get there", detail=lambda: api.get(path).text)
