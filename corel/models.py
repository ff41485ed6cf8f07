"""The classifier that pairs an encoder F(x) = h (:mod:`corel.encoders`: the paper's
architectures, Section 4, and the pretrained families) with a loss head."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn

from corel.encoders import build_encoder
from corel.losses import LossHead, build_loss
from corel.spec import ExperimentSpec

__all__ = ["Classifier", "Inputs", "Prediction", "build_classifier", "build_encoder"]


class Prediction(NamedTuple):
    classes: torch.Tensor  # (N,) int64
    similarities: torch.Tensor  # (N, K)


class Classifier(nn.Module):
    """An encoder F (x -> h) and a loss head (h -> similarities, loss)."""

    def __init__(self, encoder: nn.Module, head: LossHead):
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The representation h = F(x)."""
        out: torch.Tensor = self.encoder(x)
        return out

    def loss(
        self, x: torch.Tensor, labels: torch.Tensor, *, check: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, h, similarities) for a batch; ``check=False``: labels already validated."""
        h = self.encoder(x)
        loss, sim = self.head.loss_and_similarities(h, labels, check=check)
        return loss, h, sim

    @torch.inference_mode()
    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """The final hidden layer (N, hidden), in eval mode; the previous mode is restored."""
        was_training = self.training
        self.eval()
        try:
            out: torch.Tensor = self.encoder(x)
        finally:
            self.train(was_training)
        return out

    @torch.inference_mode()
    def predict(self, x: torch.Tensor) -> Prediction:
        """argmax_k s(h, w_k) and the (N, K) similarities, in eval mode."""
        sims = self.head.similarities(self.embed(x))
        return Prediction(sims.argmax(dim=1), sims)


def build_classifier(
    spec: ExperimentSpec, input_shape: tuple[int, ...], num_classes: int,
    preprocessing: dict[str, Any] | None = None,
) -> Classifier:
    """Encoder for the spec's model and modality plus the spec's loss head; ``preprocessing``:
    what the run records of its inputs (a fine-tuned encoder's files are found by it)."""
    if spec.fewshot is not None:  # a few-shot member: the head over the inputs themselves
        inputs = Inputs(input_shape)
        return Classifier(inputs, build_loss(spec.loss, num_classes, inputs.out_dim, **spec.loss_params()))
    head = build_loss(spec.loss, num_classes, spec.hidden, **spec.loss_params())
    return Classifier(build_encoder(spec, input_shape, preprocessing), head)


class Inputs(nn.Module):
    """h = x, flattened: the encoder of a head over its inputs (a few-shot member's, over a
    frozen encoder's features)."""

    def __init__(self, input_shape: tuple[int, ...]):
        super().__init__()
        self.out_dim = math.prod(input_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)
