"""corel.serving: the one pipeline from a checkpoint and raw inputs to representations."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from corel.data import prepare_images
from corel.serving import ServedModel
from corel.spec import ExperimentSpec
from corel.train import checkpoint_from_bytes, checkpoint_to_bytes, fit

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


@pytest.fixture(scope="module")
def trained():
    spec = ExperimentSpec(dataset="digits", loss="cosine", lam=0.8, epochs=2, lr=3e-3,
                          batch_size=64)
    return fit(spec, chance_epochs=0)


def test_a_served_model_is_the_checkpoint_s_model_with_its_preprocessing(trained):
    blob = checkpoint_to_bytes(trained.run.best_checkpoint())
    served = ServedModel.from_bytes(blob, "cpu")
    raw = load_digits().images[:50].astype(np.float32)  # 8 x 8 pixels, 0..16
    ckpt = checkpoint_from_bytes(blob)
    x = prepare_images(raw, json.loads(ckpt["preprocessing"]))
    with torch.inference_mode():
        want_h = trained.model.encoder(x)
        want_s = trained.model.head.similarities(want_h)
    h, sims = served.forward(served.prepare(raw))
    torch.testing.assert_close(h, want_h.float())
    torch.testing.assert_close(sims, want_s.float())
    torch.testing.assert_close(served.embed_all(raw, batch=7), want_h.float().numpy(),
                               check_dtype=False)
    assert served.similarity == "cosine"
    assert served.class_names == [str(d) for d in range(10)] and served.dim == 128
    meta = served.metadata()
    assert meta["inputs"]["x"]["shape"] == ["N", *served.input_shape]
    assert meta["outputs"] == {"embeddings": ["N", 128], "similarities": ["N", 10]}


def test_the_wrong_kind_of_input_is_a_value_error(trained):
    served = ServedModel.from_checkpoint(trained.run.best_checkpoint(), "cpu")
    with pytest.raises(ValueError, match="takes image arrays, not texts"):
        served.prepare(["a text"])
    with pytest.raises(ValueError, match="pixel"):
        served.prepare(np.full((1, 8, 8), 300.0))
