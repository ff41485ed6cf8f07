"""Encoders have the paper's shapes; the classifier embeds and predicts."""

import pytest
import torch
from torch import nn

from corel.encoders.paper import FFNN, ImageCNN, TextCNN
from corel.models import Classifier, build_classifier
from corel.spec import ExperimentSpec

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


def test_ffnn_two_hidden_layers_of_128_with_leaky_relu():
    enc = FFNN((1, 28, 28))
    linears = [m for m in enc.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 128), (128, 128)]
    acts = [m for m in enc.modules() if isinstance(m, nn.LeakyReLU)]
    assert len(acts) == 2 and all(a.negative_slope == 0.1 for a in acts)
    assert not any(isinstance(m, nn.Dropout) for m in enc.modules())
    assert enc(torch.randn(3, 1, 28, 28)).shape == (3, 128)


def test_image_cnn_15_30_60_filters_with_pooling():
    enc = ImageCNN((1, 28, 28))
    convs = [m for m in enc.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [15, 30, 60]
    assert sum(isinstance(m, nn.MaxPool2d) and m.kernel_size == 2 for m in enc.modules()) == 3
    linears = [m for m in enc.modules() if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == [128, 128]
    assert all(a.negative_slope == 0.1 for a in enc.modules() if isinstance(a, nn.LeakyReLU))
    assert enc(torch.randn(2, 1, 28, 28)).shape == (2, 128)


def test_image_cnn_rejects_tiny_images():
    with pytest.raises(ValueError, match="too small"):
        ImageCNN((1, 4, 4))


def test_text_models_have_dropout_and_kim_widths():
    text_cnn = TextCNN((64, 50))
    assert [c.kernel_size[0] for c in text_cnn.convs] == [3, 4, 5]
    drops = [m for m in text_cnn.modules() if isinstance(m, nn.Dropout)]
    assert len(drops) >= 3 and all(d.p == 0.5 for d in drops)
    assert text_cnn(torch.randn(4, 64, 50)).shape == (4, 128)
    spec = ExperimentSpec(dataset="ag-news", model="ffnn", dataset_path="x.csv")
    text_ffnn = build_classifier(spec, (50,), 4).encoder
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.5 for m in text_ffnn.modules()) == 2


@pytest.mark.parametrize("loss", ["cce", "center", "cosine", "gaussian"])
def test_classifier_embed_and_predict(loss):
    spec = ExperimentSpec(dataset="digits", model="ffnn", loss=loss, lam=0.7)
    model = build_classifier(spec, (1, 8, 8), 10)
    assert isinstance(model, Classifier)
    x = torch.randn(6, 1, 8, 8)
    model.train()
    h = model.embed(x)
    assert h.shape == (6, 128) and model.training, "embed restores train mode"
    pred = model.predict(x)
    assert pred.similarities.shape == (6, 10)
    assert torch.equal(pred.classes, pred.similarities.argmax(1))
    torch.testing.assert_close(h, model(x))
    loss_value, _, sims = model.loss(x, torch.arange(6))
    assert sims.shape == (6, 10)
    assert loss_value.dim() == 0 and torch.isfinite(loss_value)


def test_cnn_on_vectors_is_rejected_by_the_spec():
    with pytest.raises(ValueError, match="model 'cnn' does not apply to dataset 'npz'"):
        ExperimentSpec(dataset="npz", dataset_path="a.npz", model="cnn")
