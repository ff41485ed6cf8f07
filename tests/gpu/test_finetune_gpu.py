"""Fine-tuning on CUDA (corel.encoders.finetune): the encoder trains on the GPU, bf16 stays within a
stated tolerance of fp32, the frozen lower part's kept rows live on the GPU, and fine-tuned
steps take no CUDA graph (their batches' lengths are read on the host)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corel.data import load_dataset
from corel.encoders.finetune import FrozenOutputs, frozen_outputs_kept
from corel.serving import ServedModel
from corel.spec import ExperimentSpec
from corel.train import checkpoint_to_bytes, fit, start_run, train_pass
from tests.encoder_files import TOPICS, tiny_sentence_transformer

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finetune-gpu")
    texts, y = [], []
    for k, sentences in enumerate(TOPICS.values()):
        for i in range(40):
            texts.append(f"{sentences[i % 4]} ({i})")
            y.append(k)
    np.savez(tmp / "t.npz", texts=np.array(texts), y=np.array(y), class_names=np.array(list(TOPICS)))
    return tmp / "t.npz", tiny_sentence_transformer(tmp / "st")


def spec(files, **fields) -> ExperimentSpec:
    table, folder = files
    return ExperimentSpec(**{"dataset": "text", "dataset_path": str(table), "encoder": "sentence-transformers",
                             "encoder_path": str(folder), "encoder_mode": "finetune", "loss": "cosine",
                             "lam": 0.85, "epochs": 3, "lr": 0.01, "batch_size": 16, "hidden": 16, **fields})


def test_the_encoder_fine_tunes_on_the_gpu_without_a_graph(files):
    run = start_run(spec(files, trainable_blocks=1))
    assert run.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in run.model.encoder.tower.parameters())
    kept = FrozenOutputs()
    with frozen_outputs_kept(run.model, kept):
        assert train_pass(run) is not None
    assert run.graphed is None  # a fine-tuned run's steps are never captured
    table = next(iter(kept.tables.values()))
    assert kept.computed > 0 and all(row.device.type == "cuda" for row in table.values())


def test_bf16_fine_tuning_stays_within_two_points_of_fp32_and_serves_on_the_gpu(files):
    fp32 = fit(spec(files), chance_epochs=0)
    bf16 = fit(spec(files, precision="bf16"), chance_epochs=0)
    assert bf16.run.precision == "bf16"
    # The stated tolerance: each epoch's training loss within 5 % of fp32's, the validation
    # accuracy within two of its rows, and every weight finite.
    for a, b in zip(bf16.history, fp32.history, strict=True):
        assert abs(a.train_loss - b.train_loss) <= 0.05 * abs(b.train_loss), (a, b)
    assert abs(bf16.best_val_accuracy - fp32.best_val_accuracy) <= 2 / len(fp32.run.data.y_val) + 1e-9
    assert all(torch.isfinite(p).all() for p in bf16.run.model.parameters())
    served = ServedModel.from_bytes(checkpoint_to_bytes(bf16.run.best_checkpoint()), "cuda")
    x = served.prepare(["the goalkeeper saved a penalty", "bond yields rose again"])
    assert served.embed(x).device.type == "cuda" and served.embed(x).shape == (2, 16)


def test_an_image_encoder_fine_tunes_on_the_gpu(tmp_path):
    from tests.encoder_files import timm_weights

    file = timm_weights(tmp_path / "w.safetensors")
    image = ExperimentSpec(dataset="digits", encoder="timm:test_efficientnet", encoder_path=str(file),
                           encoder_mode="finetune", trainable_blocks=1, loss="supcon", epochs=1, lr=0.01,
                           train_subset=64, batch_size=16, hidden=16, precision="bf16")
    data = load_dataset(image)
    result = fit(image, data=data, chance_epochs=0)
    assert result.run.device.type == "cuda" and result.run.graphed is None
    assert next(result.run.model.parameters()).device.type == "cuda"
