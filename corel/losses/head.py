"""What every loss head is: :class:`LossHead` (class vectors, similarities, a loss) and the
label check every entry point runs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from corel.loss_catalog import declaration


def check_labels(labels: torch.Tensor, n: int, k: int) -> None:
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64:
        got = labels.dtype if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"labels must be an int64 (torch.long) tensor; got {got}")
    if labels.dim() != 1 or labels.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},), one per sample; got {tuple(labels.shape)}")
    if n and (int(labels.min()) < 0 or int(labels.max()) >= k):
        raise ValueError(
            f"labels must lie in 0..{k - 1} for {k} classes; "
            f"got values from {int(labels.min())} to {int(labels.max())}"
        )


def _check_lam(lam: float) -> None:
    if not (isinstance(lam, int | float) and math.isfinite(lam) and 0.0 < lam <= 1.0):
        raise ValueError(f"lam must be a number in (0, 1]; got {lam!r}")


class LossHead(nn.Module):
    """The prediction map: one vector per class, a similarity, and a loss.

    A head works in any training loop, as pytorch-metric-learning's losses do: it
    owns its class vectors (train them with the encoder's parameters) and
    ``loss_fn(embeddings, labels)`` returns the scalar loss::

        loss_fn = GaussianCOREL(num_classes=10, embedding_size=128, lam=0.85)
        optimizer = torch.optim.Adam([*encoder.parameters(), *loss_fn.parameters()], lr=1e-4)
        loss = loss_fn(encoder(x), y)

    ``similarities(h)`` is the (N, K) matrix s(h, w_k); prediction is its argmax.
    ``forward(h, labels)`` returns the scalar training loss, ``loss(sim, h, labels)``
    the same from similarities already computed. ``after_batch`` runs
    after each optimiser step (Center loss moves its centers there).
    """

    name: ClassVar[str]
    stacks_without_vmap: ClassVar[bool] = False
    """True where :meth:`functional_loss` also takes a stack of M members at once (sim
    (M, N, K), h (M, N, H), lam (M, 1), state tensors (M, ...)) and returns their M losses:
    the stacked trainer then calls it directly rather than under ``torch.vmap``."""
    uses_class_means: ClassVar[bool] = False
    """True for a head that predicts with class means set by the training loop
    (``set_class_means(h_train, y_train)`` after every epoch)."""

    def __init__(self, num_classes: int, embedding_size: int) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"need at least 2 classes; got {num_classes}")
        if embedding_size < 1:
            raise ValueError(f"embedding_size (the representation dimension) must be positive; "
                             f"got {embedding_size}")
        self.num_classes = num_classes
        self.dim = embedding_size
        # Same initialisation as nn.Linear's weight, so CCE is an ordinary classifier.
        self.W = nn.Parameter(torch.empty(num_classes, embedding_size))
        nn.init.kaiming_uniform_(self.W, a=math.sqrt(5))

    def declared_option(self, keyword: str, value: Any) -> Any:
        """The head's option ``keyword`` as its declaration (:mod:`corel.loss_catalog`) has it:
        the declared default where ``value`` is None, else ``value`` if it lies in the declared
        range, so that a head refuses what the API refuses, in the same words."""
        option = next((o for o in declaration(self.name).options if o.keyword == keyword), None)
        if option is None:
            raise ValueError(f"loss {self.name!r} declares no option {keyword!r}")
        if value is None:
            value = option.default
        else:
            option.check(self.name, value, name=keyword)
        return value if option.choices else float(value)

    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def functional_loss(
        sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor,
        lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor, state: Mapping[str, Any],
    ) -> torch.Tensor:
        """The loss as a plain function of the similarities ``sim`` of ``h``, without
        checks: what :meth:`loss` computes, and what the stacked trainer calls under
        ``torch.vmap`` with one member's lambda (0-d tensors) and state (``state``: the
        head's buffers by name, such as ``centers``, and its options as
        :meth:`functional_options` gives them: numbers, which may be 0-d tensors, and names)."""
        raise NotImplementedError

    def option_values(self) -> dict[str, float | str]:
        """The head's own options (margin, scale, ...) by keyword, as built: empty for a
        loss that declares none (:mod:`corel.loss_catalog`)."""
        return {o.keyword: getattr(self, o.keyword) for o in declaration(self.name).options}

    @classmethod
    def functional_options(cls, values: Mapping[str, float | str]) -> dict[str, float | str]:
        """The options (:meth:`option_values`) as :meth:`functional_loss` reads them from its
        ``state``; a head may convert one (ArcFace's margin: degrees to radians). The stacked
        trainer calls it per member, in double precision, before rounding to the members'
        dtype, as a Python float rounds where it meets a tensor."""
        return dict(values)

    def loss(
        self, sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, *, check: bool = True
    ) -> torch.Tensor:
        """The loss from this head's similarities ``sim`` of ``h`` (computed once per step).

        ``check=False`` skips validating the labels, for a training loop that validated
        its dataset's labels once (the check reads them, which waits for a GPU).
        """
        if check:
            check_labels(labels, h.shape[0], self.num_classes)
        lam = getattr(self, "lam", 0.5)  # a loss without lambda (CCE) ignores it
        state = {**dict(self.named_buffers()), **self.functional_options(self.option_values())}
        return self.functional_loss(sim, h, labels, lam, 1.0 - lam, state)

    def loss_and_similarities(
        self, h: torch.Tensor, labels: torch.Tensor, *, check: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(:meth:`loss`, :meth:`similarities`) of a batch: the similarities, then the loss
        from them; a head may compute both as one fused operation."""
        sim = self.similarities(h)
        return self.loss(sim, h, labels, check=check), sim

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_and_similarities(h, labels)[0]

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        return self.similarities(h).argmax(dim=1)

    @torch.no_grad()
    def after_batch(self, h: torch.Tensor, labels: torch.Tensor) -> None:
        """Hook after each optimiser step; nothing to do for gradient-only heads."""

    @torch.no_grad()
    def set_class_means(self, h: torch.Tensor, labels: torch.Tensor) -> None:
        """Hook after each epoch for heads that ``uses_class_means``, with every training
        representation."""

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, dim={self.dim}"
