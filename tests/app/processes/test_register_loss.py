"""A loss registered in one place: a plugin's entry point (group ``corel.losses``) calls
``corel.losses.register_loss`` with a declaration and a head. The API then accepts and
validates it, lists it, a real worker (which loads the plugin by its entry point alone)
trains it, and its model exports and serves."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
from fastapi.testclient import TestClient

from app.main import create_app
from corel import losses
from corel.loss_catalog import DECLARATIONS
from tests.app.conftest import finished, wait_for
from tests.conftest import REPO

PLUGIN = textwrap.dedent('''
    import torch.nn.functional as F

    from corel import similarity
    from corel.loss_catalog import LossDeclaration, Option
    from corel.losses import LossHead, register_loss


    class ScaledCosine(LossHead):
        """Cross-entropy of scale * cos(h, w_k): a toy loss of a plugin."""

        name = "scaledcos"

        def __init__(self, num_classes, embedding_size, scale=4.0):
            super().__init__(num_classes, embedding_size)
            self.scale = scale

        def similarities(self, h):
            return similarity.cosine(h, self.W)

        def loss(self, sim, h, labels, *, check=True):
            return F.cross_entropy(self.scale * sim, labels)


    def register():
        register_loss(LossDeclaration(
            "scaledcos", "Scaled cosine", "ScaledCos", "cosine", (), "cosine", stackable=False,
            options=(Option("scale", 4.0, 0.0, 64.0, doc="logit scale"),)), ScaledCosine)
''')


def _plugin(root):
    root.mkdir()
    (root / "corel_scaledcos.py").write_text(PLUGIN)
    info = root / "corel_scaledcos-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: corel-scaledcos\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[corel.losses]\nscaledcos = corel_scaledcos:register\n")
    return root


def test_a_loss_registered_in_one_place_is_accepted_validated_trained_exported_and_listed(
        settings, workers, tmp_path):
    root = _plugin(tmp_path / "plugin")
    s = settings.model_copy(update={"queue": f"corel-plugin-{uuid.uuid4().hex[:8]}"})
    # Only this worker has the plugin on its path; it registers the loss through its
    # entry point when corel.losses is imported there.
    proc = workers.start(s, python_path=root)
    sys.path.insert(0, str(root))
    try:
        import corel_scaledcos

        assert "scaledcos" not in DECLARATIONS
        corel_scaledcos.register()
        with TestClient(create_app(s)) as c:
            listed = {d["name"]: d for d in c.get("/losses").json()}
            assert listed["scaledcos"]["options"] == [{
                "field": "scale", "default": 4.0, "allowed": "a number in (0, 64]",
                "keyword": "scale", "doc": "logit scale"}]
            assert listed["arcface"]["source"] == "pytorch-metric-learning"
            assert listed["supcon"]["prediction"] == "nearest class mean"

            bad = c.post("/experiments", json={"dataset": "digits", "loss": "scaledcos", "scale": 99})
            assert bad.status_code == 422
            assert "scale for loss 'scaledcos' must be a number in (0, 64]; got 99" in bad.json()["detail"]
            bad = c.post("/experiments", json={"dataset": "digits", "loss": "scaledcos", "margin": 0.1})
            assert bad.status_code == 422 and "loss 'scaledcos' takes no margin" in bad.json()["detail"]

            r = c.post("/experiments", json={"dataset": "digits", "loss": "scaledcos", "scale": 16,
                                             "epochs": 3, "lr": 0.003, "batch_size": 64})
            assert r.status_code == 202, r.text
            eid = r.json()["id"]
            body = wait_for(c, eid, finished, timeout=240, workers=workers)
            assert body["status"] == "succeeded", body
            assert body["spec"]["scale"] == 16 and body["spec"]["loss"] == "scaledcos"
            assert body["test_accuracy"] > 0.5

            assert c.get("/experiments", params={"loss": "scaledcos"}).json()["total"] == 1
            export = c.get(f"/experiments/{eid}/export", params={"format": "torchscript"})
            assert export.status_code == 200 and len(export.content) > 1000
            rows = np.zeros((2, 8, 8), dtype=np.uint8)
            predicted = c.post("/predict", json={"experiment_id": eid, "binary": {
                "dtype": "uint8", "shape": [2, 8, 8], "data": base64.b64encode(rows.tobytes()).decode()}})
            assert predicted.status_code == 200, predicted.text
            assert predicted.json()["similarity"] == "cosine"
    finally:
        workers.stop(proc)  # its reconciler would take other tests' runs to its own queue
        losses.unregister_loss("scaledcos")
        sys.path.remove(str(root))
        sys.modules.pop("corel_scaledcos", None)
    assert "scaledcos" not in DECLARATIONS


def test_the_command_line_offers_a_plugins_loss_and_imports_torch_only_for_one(tmp_path):
    """``corel train --loss`` lists a plugin's loss (its entry point registers it when the
    parser is built); without a plugin, building the parser leaves torch unimported, so the
    service's commands (users, tokens, db, ...) start without it."""
    root = _plugin(tmp_path / "plugin")
    probe = ("import sys; from corel.cli import build_parser; p = build_parser(); "
             "print('torch' in sys.modules); p.parse_args(['train', '--help'])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    alone = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=120)
    assert alone.stdout.startswith("False\n"), alone.stdout + alone.stderr
    assert "scaledcos" not in alone.stdout and "arcface" in alone.stdout

    env["PYTHONPATH"] = os.pathsep.join([str(root), env["PYTHONPATH"]])
    with_plugin = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
    assert with_plugin.stdout.startswith("True\n"), with_plugin.stdout + with_plugin.stderr
    assert "scaledcos" in with_plugin.stdout
