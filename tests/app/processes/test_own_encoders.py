"""POST /encoders: a user's own encoder (a zipped sentence-transformers folder, or timm weights),
checked before it is accepted, stored once per content, named by encoder_id in a spec, trained
on by a real worker and served; every bad upload a clear 4xx that stores nothing.

This file holds those of its tests that belong in the processes tier (processes of its own);
the others, and the helpers they share, are in tests/app/api/test_own_encoders.py."""

from __future__ import annotations

from tests.app.api import test_own_encoders as shared
from tests.app.api.test_own_encoders import _text_table
from tests.app.conftest import finished, own_stack, wait_for

# Fixtures shared with the tests in tests/app/api/test_own_encoders.py (pytest finds a fixture by its name here).
st_zip = shared.st_zip


def test_a_run_on_an_uploaded_encoder_resumes_on_a_worker_with_another_data_directory(
        settings, workers, st_zip, tmp_path):
    """Each worker keeps an uploaded encoder's files in its own data directory, so the spec
    a resumed run rebuilds names other files than its checkpoint's: where they lie is not
    what they hold (the content digest is), and the run resumes from its checkpoint."""
    # A queue of its own: no other worker (the session's data directory) may take it.
    with own_stack(settings, tmp_path / "var") as (own, client):
        encoder = client.post("/encoders", files={"file": ("my-model.zip", st_zip)}).json()["id"]
        spec = {"dataset": "text", "dataset_id": _text_table(client), "encoder_id": encoder,
                "encoder_mode": "finetune", "loss": "cosine", "lam": 0.85, "epochs": 12, "lr": 0.01,
                "encoder_lr": 0.001, "batch_size": 8, "hidden": 16, "seed": 3}
        # Two hosts of their own: each its data directory, both the service's artifact store.
        host = {name: own.model_copy(update={"var_dir": tmp_path / name, "artifacts_dir": own.artifact_dir})
                for name in ("a", "b")}
        first = workers.start(host["a"])
        eid = client.post("/experiments", json=spec).json()["id"]
        wait_for(client, eid, lambda b: b["current_epoch"] >= 2, workers=workers, timeout=180)
        workers.kill(first)
        killed_at = client.get(f"/experiments/{eid}").json()
        assert killed_at["status"] == "running" and killed_at["current_epoch"] < 12
        second = workers.start(host["b"])
        try:
            body = wait_for(client, eid, finished, workers=workers, timeout=300)
            assert body["status"] == "succeeded", body.get("error")
            assert body["attempts"] == 2
            epochs = [m["epoch"] for m in client.get(f"/experiments/{eid}/metrics").json()["items"]]
            assert epochs == list(range(1, 13))  # resumed from its checkpoint: none lost, none twice
            assert {p.name for p in (tmp_path / "b" / "cache" / "encoders").iterdir()} and \
                {p.name for p in (tmp_path / "a" / "cache" / "encoders").iterdir()}  # each host its own copy
        finally:
            workers.kill(second)
