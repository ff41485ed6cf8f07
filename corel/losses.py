"""Attractive-repulsive (AR) losses: CCE, Center loss, Cosine-COREL, Gaussian-COREL.

The paper (Kenyon-Dean et al., 2019) writes the loss of a sample i with label y_i
as

    L_AR = mean_i [ -lam * attract(s, h_i, y_i) + (1 - lam) * repulse(s, h_i, W) ]

with lam in (0, 1]. The equations live in two plain functions,
:func:`attractive_repulsive` and :func:`center_loss_term`; the ``nn.Module``
presets below only own their parameters (W, bias, centers, gamma) and call them.

Where this differs from the authors' code (kiankd/corel2019), and why:

* lambda is applied once, as in the equation; their code multiplies it in twice
  when lam != 0.5, which changes the effective attraction weight.
* the batch mean is over the N samples; at lam = 0.5 their code averages over
  the N x K similarity entries, which rescales the loss (and so Adam's steps
  relative to the regulariser) by 1/K.
* the Gaussian repulsion is a logsumexp; their exp-then-log underflows to
  log(0) = -inf once squared distances reach a few hundred.
* the cosine repulsion squares the largest wrong-class cosine as written; their
  code clamps it at zero first, which stops pushing classes that are already
  anti-aligned towards orthogonality.
* gamma is fixed at 0.5 unless asked for (``learn_gamma``); their code always
  learns it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from corel import similarity
from corel.loss_catalog import DECLARATIONS, declaration

__all__ = [
    "CCE",
    "LOSSES",
    "REPULSIONS",
    "CenterLoss",
    "CosineCOREL",
    "GaussianCOREL",
    "LossHead",
    "attractive_repulsive",
    "build_loss",
    "center_loss_term",
    "spread_class_vectors",
]

REPULSIONS = ("logsumexp", "max_squared")


def _check_labels(labels: torch.Tensor, n: int, k: int) -> None:
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


def attractive_repulsive(
    sim: torch.Tensor, labels: torch.Tensor, lam: float, repulsion: str = "logsumexp"
) -> torch.Tensor:
    """Batch mean of the AR loss (paper, Eq. 2) from a similarity matrix.

    ``sim`` is (N, K) with sim[i, k] = s(h_i, w_k); ``labels`` is (N,) int64.

    * attract(i) = sim[i, y_i]
    * ``repulsion="logsumexp"``: repulse(i) = log sum_k exp(sim[i, k]) — CCE with
      s = dot (then lam = 0.5 gives half the cross-entropy) and Gaussian-COREL.
    * ``repulsion="max_squared"``: repulse(i) = (max_{k != y_i} sim[i, k])^2 — the
      most similar wrong class, squared (Cosine-COREL); needs K >= 2.
    """
    if not isinstance(sim, torch.Tensor) or sim.dim() != 2:
        raise ValueError("sim must be a 2-D tensor of shape (N, K)")
    if not sim.is_floating_point():
        raise ValueError(f"sim must be floating point; got {sim.dtype}")
    n, k = sim.shape
    if n == 0:
        raise ValueError("the batch is empty: sim has no rows")
    if k < 2:
        raise ValueError(f"an attractive-repulsive loss needs at least 2 classes; got K = {k}")
    _check_labels(labels, n, k)
    _check_lam(lam)
    return _attractive_repulsive_core(sim, labels, lam, 1.0 - lam, repulsion)


def _attractive_repulsive_core(
    sim: torch.Tensor,
    labels: torch.Tensor,
    lam: float | torch.Tensor,
    one_minus_lam: float | torch.Tensor,
    repulsion: str,
) -> torch.Tensor:
    """:func:`attractive_repulsive` without its checks, for use under ``torch.vmap``.

    ``lam`` and ``1 - lam`` may be (batched) 0-d tensors; ``1 - lam`` is passed in
    so that a caller can form it in double precision, as the float path does.
    """
    attract = sim.gather(1, labels.unsqueeze(1)).squeeze(1)
    if repulsion == "logsumexp":
        repulse = torch.logsumexp(sim, dim=1)
    elif repulsion == "max_squared":
        own = F.one_hot(labels, sim.shape[1]).bool()
        repulse = sim.masked_fill(own, float("-inf")).amax(dim=1).square()
    else:
        raise ValueError(f"repulsion must be one of {', '.join(REPULSIONS)}; got {repulsion!r}")
    return (-lam * attract + one_minus_lam * repulse).mean()


def center_loss_term(h: torch.Tensor, labels: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """mean_i |h_i - c_{y_i}|^2 / 2 (Wen et al., 2016, Eq. 2, averaged over the batch)."""
    similarity.check_pair(h, centers)
    if h.shape[0] == 0:
        raise ValueError("the batch is empty: h has no rows")
    _check_labels(labels, h.shape[0], centers.shape[0])
    return _center_core(h, labels, centers)


def _center_core(h: torch.Tensor, labels: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    return 0.5 * (h - centers[labels]).square().sum(1).mean()


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

    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def functional_loss(
        sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor,
        lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor, state: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        """The loss as a plain function of the similarities ``sim`` of ``h``, without
        checks: what :meth:`loss` computes, and what the stacked trainer calls under
        ``torch.vmap`` with one member's lambda (0-d tensors) and buffers (``state``:
        the head's buffers by name, such as ``centers``)."""
        raise NotImplementedError

    def loss(
        self, sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, *, check: bool = True
    ) -> torch.Tensor:
        """The loss from this head's similarities ``sim`` of ``h`` (computed once per step).

        ``check=False`` skips validating the labels, for a training loop that validated
        its dataset's labels once (the check reads them, which waits for a GPU).
        """
        if check:
            _check_labels(labels, h.shape[0], self.num_classes)
        lam = getattr(self, "lam", 0.5)  # a loss without lambda (CCE) ignores it
        return self.functional_loss(sim, h, labels, lam, 1.0 - lam, dict(self.named_buffers()))

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(self.similarities(h), h, labels)

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        return self.similarities(h).argmax(dim=1)

    @torch.no_grad()
    def after_batch(self, h: torch.Tensor, labels: torch.Tensor) -> None:
        """Hook after each optimiser step; nothing to do for gradient-only heads."""

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, dim={self.dim}"


class CCE(LossHead):
    """Categorical cross-entropy: s = h . w_k + b_k, ordinary softmax cross-entropy.

    This is the AR loss with the dot product, logsumexp repulsion and lam = 0.5,
    multiplied by 2; lambda does not apply.
    """

    name = "cce"

    def __init__(self, num_classes: int, embedding_size: int) -> None:
        super().__init__(num_classes, embedding_size)
        bound = 1.0 / math.sqrt(embedding_size)
        self.bias = nn.Parameter(torch.empty(num_classes).uniform_(-bound, bound))

    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        return similarity.dot(h, self.W) + self.bias

    @staticmethod
    def functional_loss(
        sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor,
        lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor, state: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        return F.cross_entropy(sim, labels)


class CenterLoss(CCE):
    """Center loss (Wen et al., 2016), the paper's baseline.

        L = CCE + lam * mean_i |h_i - mu_{y_i}|^2 / 2

    The centers mu are a buffer, not a parameter: after each batch,
    ``mu_j <- mu_j - alpha * sum_{i: y_i = j} (mu_j - h_i) / (1 + n_j)``
    (Wen et al.'s update rule, Eq. 4), with alpha = 0.25 by default.
    """

    name = "center"
    centers: torch.Tensor

    def __init__(self, num_classes: int, embedding_size: int, lam: float = 0.5,
                 alpha: float = 0.25) -> None:
        super().__init__(num_classes, embedding_size)
        _check_lam(lam)
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha (the centroid rate) must be in (0, 1]; got {alpha!r}")
        self.lam = float(lam)
        self.alpha = float(alpha)
        self.register_buffer("centers", torch.zeros(num_classes, embedding_size))

    @staticmethod
    def functional_loss(
        sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor,
        lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor, state: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        return F.cross_entropy(sim, labels) + lam * _center_core(h, labels, state["centers"])

    @torch.no_grad()
    def after_batch(self, h: torch.Tensor, labels: torch.Tensor) -> None:
        h = h.detach().to(self.centers.dtype)
        counts = torch.bincount(labels, minlength=self.num_classes).to(h.dtype)
        sums = torch.zeros_like(self.centers).index_add_(0, labels, h)
        # sum_{i: y_i=j} (mu_j - h_i) = n_j mu_j - sum_i h_i
        delta = (counts.unsqueeze(1) * self.centers - sums) / (1.0 + counts).unsqueeze(1)
        self.centers.sub_(self.alpha * delta)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lam={self.lam}, alpha={self.alpha}"


class CosineCOREL(LossHead):
    """Cosine-COREL: s_cos(h, w) = h.w / (|h||w|),

        L = mean_i [ -lam s_cos(h_i, w_{y_i}) + (1 - lam) (max_{k != y_i} s_cos(h_i, w_k))^2 ]

    It attracts h towards its class direction and pushes the most similar wrong
    class towards orthogonality; no softmax and no scale parameter.
    """

    name = "cosine"

    def __init__(self, num_classes: int, embedding_size: int, lam: float = 0.5) -> None:
        super().__init__(num_classes, embedding_size)
        _check_lam(lam)
        self.lam = float(lam)

    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        return similarity.cosine(h, self.W)

    @staticmethod
    def functional_loss(
        sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor,
        lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor, state: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        return _attractive_repulsive_core(sim, labels, lam, one_minus_lam, "max_squared")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lam={self.lam}"


# A point on its own class vector gets this share of the softmax at initialisation.
INIT_CONFIDENCE = 0.99


@torch.no_grad()
def spread_class_vectors(W: torch.Tensor, gamma: float, confidence: float = INIT_CONFIDENCE) -> None:
    """Initialise Gaussian class vectors apart from each other, in place.

    Orthogonal directions (as far as K <= H allows) at the radius r where
    gamma |w_i - w_j|^2 = 2 gamma r^2 = log(confidence (K - 1) / (1 - confidence)): a
    representation on its class vector is classified with ``confidence``. With nn.Linear's
    small init the vectors start 0.8 apart, well inside one Gaussian width, and
    lam > 0.5 then collapses everything to one point (see docs/reproduction.md).
    """
    k = W.shape[0]
    nn.init.orthogonal_(W)
    W.div_(W.norm(dim=1, keepdim=True).clamp_min(1e-12))
    radius = math.sqrt(math.log(confidence * (k - 1) / (1.0 - confidence)) / (2.0 * gamma))
    W.mul_(radius)


class GaussianCOREL(LossHead):
    """Gaussian-COREL: s_gau(h, w) = -gamma |h - w|^2,

        L = mean_i [ -lam s_gau(h_i, w_{y_i}) + (1 - lam) logsumexp_k s_gau(h_i, w_k) ]

    computed with logsumexp (stable for any distance). gamma = 0.5 by default and
    fixed; ``learn_gamma=True`` learns it.

    An identity worth knowing: -gamma|h|^2 is common to every class and cancels
    inside the logsumexp, so at lam = 0.5 this loss equals 1/2 x cross-entropy with
    logits 2 gamma h.w_k - gamma |w_k|^2, i.e. CCE with a bias tied to the class
    vectors. Only lam > 0.5 adds attraction beyond what CCE already has.
    """

    name = "gaussian"
    fixed_gamma: torch.Tensor

    def __init__(
        self, num_classes: int, embedding_size: int, lam: float = 0.5, gamma: float = 0.5,
        learn_gamma: bool = False,
    ) -> None:
        super().__init__(num_classes, embedding_size)
        _check_lam(lam)
        if not (math.isfinite(gamma) and gamma > 0):
            raise ValueError(f"gamma must be a positive number; got {gamma!r}")
        self.lam = float(lam)
        spread_class_vectors(self.W, gamma)
        # A fixed gamma is kept as is (exact); a learned one as log(gamma), which
        # keeps it positive under gradient steps.
        self.learn_gamma = learn_gamma
        if learn_gamma:
            self.log_gamma = nn.Parameter(torch.tensor(math.log(gamma)))
        else:
            self.register_buffer("fixed_gamma", torch.tensor(float(gamma), dtype=torch.float64))

    @property
    def gamma(self) -> torch.Tensor:
        return self.log_gamma.exp() if self.learn_gamma else self.fixed_gamma

    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        similarity.check_pair(h, self.W)
        # gamma > 0 by construction: fixed ones are checked in __init__, learned ones are exp().
        return similarity._gaussian(h, self.W, self.gamma.to(h.dtype))

    @staticmethod
    def functional_loss(
        sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor,
        lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor, state: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        return _attractive_repulsive_core(sim, labels, lam, one_minus_lam, "logsumexp")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lam={self.lam}, gamma={float(self.gamma.detach()):.4g}"


LOSSES: dict[str, type[LossHead]] = {
    "cce": CCE,
    "center": CenterLoss,
    "cosine": CosineCOREL,
    "gaussian": GaussianCOREL,
}


if set(LOSSES) != set(DECLARATIONS):  # a head for every declared loss, and no other
    raise ImportError(f"corel.losses: heads {sorted(LOSSES)} differ from the declared losses "
                      f"{sorted(DECLARATIONS)} (corel.loss_catalog)")


def build_loss(name: str, num_classes: int, dim: int, **params: Any) -> LossHead:
    """Build a loss head by registry name; ``params`` are the ones that preset takes.

    Parameters a preset does not use (``lam`` for CCE, ``gamma`` for Cosine-COREL,
    ...) are ignored, so one spec can be passed to any preset.
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(LOSSES)}")
    accepted = declaration(name).params
    return LOSSES[name](num_classes, dim, **{k: v for k, v in params.items() if k in accepted})
