"""The paper's encoders (Section 4), trained from scratch with the head.

* ``FFNN``: two fully connected hidden layers of 128 units.
* ``ImageCNN``: three convolutional layers of 15, 30 and 60 filters, each
  followed by 2x2 max-pooling, then two fully connected layers of 128 units.
* text FFNN: the ``FFNN`` over the average of a text's word vectors (the
  averaging is done by ``corel.data``), with dropout 0.5 after the input and
  between the fully connected layers.
* ``TextCNN``: Kim (2014): convolutions of widths 3, 4 and 5 words with ReLU
  and max-over-time pooling, then two fully connected layers of 128 units, with
  dropout 0.5 after the input and between the fully connected layers.

LeakyReLU(0.1) everywhere except the Kim convolutions, which use ReLU as Kim
does. The final hidden layer h (128-d by default) is the representation. The same FFNN
also runs over a pretrained encoder's features (its head's two hidden layers).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from corel.encoder_catalog import TEXT_DROPOUT
from corel.fused import fusable, leaky_mlp

__all__ = ["FFNN", "LEAK", "ImageCNN", "StreamDropout", "TextCNN", "dropout_generator", "dropout_stream",
           "has_dropout"]

LEAK = 0.1

_STREAM: ContextVar[torch.Generator | None] = ContextVar("corel_dropout_stream", default=None)


@contextmanager
def dropout_stream(generator: torch.Generator | None) -> Iterator[None]:
    """Within the block (this thread's context), :class:`StreamDropout` draws its masks from
    ``generator``: a run's own stream, so that a member of a stack draws the masks it would
    draw alone (None: torch's global generator)."""
    token = _STREAM.set(generator)
    try:
        yield
    finally:
        _STREAM.reset(token)


def dropout_generator(seed: int, device: torch.device) -> torch.Generator:
    """A run's dropout stream on ``device``, from its seed; another stream than its data
    order's (same seed, other draws: a derived seed)."""
    return torch.Generator(device=device).manual_seed((seed * 6364136223846793005 + 1442695040888963407) % 2**63)


def has_dropout(module: nn.Module) -> bool:
    """Whether a model draws dropout masks from a run's stream while training (the paper's
    text models; a pretrained tower's own dropout draws from torch's generator)."""
    return any(isinstance(m, StreamDropout) and m.p > 0 for m in module.modules())


class StreamDropout(nn.Dropout):
    """Dropout (the inverted form: kept units scaled by 1 / (1 - p)) whose masks come from the
    run's own generator (:func:`dropout_stream`) where one is set, else torch's global one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = _STREAM.get()
        if generator is None or not self.training or self.p == 0:
            return super().forward(x)
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=generator)
        return x * keep * (1.0 / (1.0 - self.p))


def _mlp(in_dim: int, hidden: int, dropout: float) -> list[nn.Module]:
    """Two hidden layers of ``hidden`` units; dropout after the input and between them."""
    layers: list[nn.Module] = []
    if dropout:
        layers.append(StreamDropout(dropout))
    layers += [nn.Linear(in_dim, hidden), nn.LeakyReLU(LEAK)]
    if dropout:
        layers.append(StreamDropout(dropout))
    layers += [nn.Linear(hidden, hidden), nn.LeakyReLU(LEAK)]
    return layers


class FFNN(nn.Module):
    """Flatten, then two fully connected hidden layers with LeakyReLU(0.1)."""

    def __init__(self, input_shape: tuple[int, ...], hidden: int = 128, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), *_mlp(math.prod(input_shape), hidden, dropout))
        self.out_dim = hidden
        self._fused = fusable(self.net)

    @property
    def fused_layers(self) -> tuple[float, list[nn.Linear]] | None:
        """(slope, linears) where the layers run as one fused node (no dropout), else None."""
        return self._fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Training without dropout: the layers as one autograd node, bit for bit the same.
        if self._fused is not None:
            fused = leaky_mlp(x, *self._fused)
            if fused is not None:
                return fused
        out: torch.Tensor = self.net(x)
        return out


class ImageCNN(nn.Module):
    """Conv(15)-pool, Conv(30)-pool, Conv(60)-pool, then FC 128, FC 128 (LeakyReLU 0.1).

    3x3 kernels with padding 1; on 28x28 inputs the feature maps are 14, 7 and 3
    pixels wide before the fully connected layers.
    """

    def __init__(self, input_shape: tuple[int, ...], hidden: int = 128):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"ImageCNN takes (channels, height, width) inputs; got {input_shape}")
        channels, height, width = input_shape
        convs: list[nn.Module] = []
        for out_channels in (15, 30, 60):
            convs += [
                nn.Conv2d(channels, out_channels, kernel_size=3, padding=1),
                nn.LeakyReLU(LEAK),
                nn.MaxPool2d(2),
            ]
            channels = out_channels
            height, width = height // 2, width // 2
        if height < 1 or width < 1:
            raise ValueError(f"images of shape {input_shape} are too small for three 2x2 poolings")
        self.features = nn.Sequential(*convs, nn.Flatten())
        self.head = nn.Sequential(*_mlp(channels * height * width, hidden, 0.0))
        self.out_dim = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


class TextCNN(nn.Module):
    """Kim (2014) over (L, D) word-vector sequences: widths 3/4/5, max-over-time pooling."""

    def __init__(
        self, input_shape: tuple[int, ...], hidden: int = 128, filters: int = 100,
        widths: tuple[int, ...] = (3, 4, 5),
    ):
        super().__init__()
        if len(input_shape) != 2:
            raise ValueError(f"TextCNN takes (length, vector_dim) inputs; got {input_shape}")
        length, dim = input_shape
        if length < max(widths):
            raise ValueError(f"texts must be at least {max(widths)} tokens long; got {length}")
        self.dropout = StreamDropout(TEXT_DROPOUT)
        self.convs = nn.ModuleList(nn.Conv1d(dim, filters, w) for w in widths)
        self.relu = nn.ReLU()
        self.head = nn.Sequential(*_mlp(filters * len(widths), hidden, TEXT_DROPOUT))
        self.out_dim = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(x).transpose(1, 2)  # (N, D, L) for Conv1d
        pooled = [self.relu(conv(x)).amax(dim=2) for conv in self.convs]
        out: torch.Tensor = self.head(torch.cat(pooled, dim=1))
        return out
