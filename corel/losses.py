"""Attractive-repulsive (AR) losses: CCE, Center loss, Cosine-COREL, Gaussian-COREL; and
the peers from pytorch-metric-learning (ArcFace, CosFace, NormalizedSoftmax, ProxyAnchor,
SupCon, a mined triplet loss, MultiSimilarity) as heads of the same kind.

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
from corel.fused import gaussian_ar
from corel.loss_catalog import DECLARATIONS, LossDeclaration, declaration, declare, undeclare

__all__ = [
    "CCE",
    "LOSSES",
    "REPULSIONS",
    "ArcFace",
    "CenterLoss",
    "CosFace",
    "CosineCOREL",
    "GaussianCOREL",
    "LossHead",
    "MultiSimilarity",
    "NormalizedSoftmax",
    "ProxyAnchor",
    "SupCon",
    "TripletMargin",
    "attractive_repulsive",
    "build_loss",
    "center_loss_term",
    "class_counts",
    "register_loss",
    "spread_class_vectors",
]

REPULSIONS = ("logsumexp", "max_squared")


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
    check_labels(labels, n, k)
    _check_lam(lam)
    return _attractive_repulsive_core(sim, labels, lam, 1.0 - lam, repulsion)


def _attractive_repulsive_core(
    sim: torch.Tensor,
    labels: torch.Tensor,
    lam: float | torch.Tensor,
    one_minus_lam: float | torch.Tensor,
    repulsion: str,
) -> torch.Tensor:
    """:func:`attractive_repulsive` without its checks, for the stacked trainer too.

    ``lam`` and ``1 - lam`` may be 0-d tensors (one member under ``torch.vmap``), or, for
    a stack of M members' similarities ``sim`` (M, N, K) with shared ``labels`` (N,),
    (M, 1) tensors: the result is then the M members' batch means. ``1 - lam`` is passed
    in so that a caller can form it in double precision, as the float path does.
    """
    index = labels.expand(sim.shape[:-1]).unsqueeze(-1)
    attract = sim.gather(-1, index).squeeze(-1)
    if repulsion == "logsumexp":
        repulse = torch.logsumexp(sim, dim=-1)
    elif repulsion == "max_squared":
        own = F.one_hot(labels, sim.shape[-1]).bool()  # (N, K): the same for every member
        repulse = sim.masked_fill(own, float("-inf")).amax(dim=-1).square()
    else:
        raise ValueError(f"repulsion must be one of {', '.join(REPULSIONS)}; got {repulsion!r}")
    return (-lam * attract + one_minus_lam * repulse).mean(-1)


def center_loss_term(h: torch.Tensor, labels: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """mean_i |h_i - c_{y_i}|^2 / 2 (Wen et al., 2016, Eq. 2, averaged over the batch)."""
    similarity.check_pair(h, centers)
    if h.shape[0] == 0:
        raise ValueError("the batch is empty: h has no rows")
    check_labels(labels, h.shape[0], centers.shape[0])
    return _center_core(h, labels, centers)


def class_counts(labels: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """How many of ``labels`` fall in each class, as ``dtype``: ``torch.bincount``'s counts
    without its wait. On a GPU ``bincount`` reads the largest label back to the host to
    size its result, a synchronisation in every Center-loss step that stalled each run on
    the whole GPU's queue (47 s a CNN epoch against 7 s for the other losses, 30 runs
    sharing an H200); adding ones queues like any other kernel, and sums of ones are exact.
    (Out of place, so that it also runs under ``torch.vmap`` with each member's labels.)"""
    return torch.zeros(num_classes, dtype=dtype, device=labels.device).index_add(
        0, labels, torch.ones(labels.shape, dtype=dtype, device=labels.device))


def _center_core(h: torch.Tensor, labels: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    # h (..., N, H) and centers (..., K, H): a stack of members' terms where h is 3-D, with
    # labels shared (N,) or each member's own (M, N).
    if labels.dim() == 1:
        own = centers.index_select(-2, labels)
    else:
        own = centers.gather(-2, labels.unsqueeze(-1).expand(*labels.shape, centers.shape[-1]))
    return 0.5 * (h - own).square().sum(-1).mean(-1)


def _cross_entropy(sim: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """F.cross_entropy's batch mean, or for a stack of members' sim (M, N, K), each one's."""
    if sim.dim() == 2:
        return F.cross_entropy(sim, labels)
    rows = F.cross_entropy(sim.flatten(0, -2), labels.expand(sim.shape[:-1]).flatten(),
                           reduction="none")
    return rows.view(sim.shape[:-1]).mean(-1)


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
            check_labels(labels, h.shape[0], self.num_classes)
        lam = getattr(self, "lam", 0.5)  # a loss without lambda (CCE) ignores it
        return self.functional_loss(sim, h, labels, lam, 1.0 - lam, dict(self.named_buffers()))

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


class CCE(LossHead):
    """Categorical cross-entropy: s = h . w_k + b_k, ordinary softmax cross-entropy.

    This is the AR loss with the dot product, logsumexp repulsion and lam = 0.5,
    multiplied by 2; lambda does not apply.
    """

    name = "cce"
    stacks_without_vmap = True

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
        return _cross_entropy(sim, labels)


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
        if isinstance(lam, torch.Tensor) and lam.dim() == 2:  # a stack's (M, 1) lambdas
            lam = lam.squeeze(1)
        return _cross_entropy(sim, labels) + lam * _center_core(h, labels, state["centers"])

    @torch.no_grad()
    def after_batch(self, h: torch.Tensor, labels: torch.Tensor) -> None:
        h = h.detach().to(self.centers.dtype)
        counts = class_counts(labels, self.num_classes, h.dtype)
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
    stacks_without_vmap = True

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
    stacks_without_vmap = True
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

    def loss_and_similarities(
        self, h: torch.Tensor, labels: torch.Tensor, *, check: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """In training, one fused node (:class:`corel.fused.GaussianAR`) with autograd's
        values and gradients bit for bit; elsewhere the similarities, then the loss."""
        if h.dim() == 2 and h.shape[0] > 0:  # else the plain path, which says what is wrong
            similarity.check_pair(h, self.W)
            if check:
                check_labels(labels, h.shape[0], self.num_classes)
            fused = gaussian_ar(h, self.W, self.gamma.to(h.dtype), labels, self.lam, 1.0 - self.lam)
            if fused is not None:
                return fused
        return super().loss_and_similarities(h, labels, check=check)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lam={self.lam}, gamma={float(self.gamma.detach()):.4g}"


# ----------------------------------------------------------------------------------------
# pytorch-metric-learning's losses (Musgrave et al., 2020), written as functions of the
# cosine similarities so that they run in corel's loops, serve and export as its own heads
# do. Each gives pytorch-metric-learning's loss value and gradients on the same embeddings,
# labels and parameters (tests/corel/test_peer_losses.py checks it against its objects).


class _CosineClassHead(LossHead):
    """A head with a class (or proxy) matrix W scored by cosine similarity; predicts with it."""

    def __init__(self, num_classes: int, embedding_size: int) -> None:
        super().__init__(num_classes, embedding_size)
        nn.init.normal_(self.W)  # pytorch-metric-learning's default weight init

    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        return similarity.cosine(h, self.W)

    def _options(self) -> str:
        return ", ".join(f"{o.field}={getattr(self, o.field)}" for o in declaration(self.name).options)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._options()}"


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number; got {value!r}")
    return float(value)


class ArcFace(_CosineClassHead):
    """ArcFace (Deng et al., 2019): scale * cos(theta_y + margin) for the own class (margin
    in degrees), scale * cos(theta_k) for the others, softmax cross-entropy."""

    name = "arcface"

    def __init__(self, num_classes: int, embedding_size: int, margin: float = 28.6,
                 scale: float = 64.0) -> None:
        super().__init__(num_classes, embedding_size)
        if not (isinstance(margin, int | float) and 0.0 <= margin < 90.0):
            raise ValueError(f"margin must be in [0, 90) degrees; got {margin!r}")
        self.margin, self.scale = float(margin), _positive("scale", scale)

    def loss(self, sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, *,
             check: bool = True) -> torch.Tensor:
        if check:
            check_labels(labels, h.shape[0], self.num_classes)
        return arcface_loss(sim, labels, math.radians(self.margin), self.scale)


def arcface_loss(cos: torch.Tensor, labels: torch.Tensor, margin_rad: float, scale: float) -> torch.Tensor:
    target = cos.gather(1, labels.unsqueeze(1))
    angles = torch.acos(target.clamp(-1, 1))
    # cos(theta + m) while theta + m <= pi, then a line that keeps the loss decreasing
    modified = torch.where(angles <= math.pi - margin_rad, torch.cos(angles + margin_rad),
                           torch.cos(angles) - margin_rad * math.sin(margin_rad))
    logits = cos + F.one_hot(labels, cos.shape[1]).to(cos.dtype) * (modified - target)
    return F.cross_entropy(logits * scale, labels)


class CosFace(_CosineClassHead):
    """CosFace (Wang et al., 2018): scale * (cos(theta_y) - margin) for the own class."""

    name = "cosface"

    def __init__(self, num_classes: int, embedding_size: int, margin: float = 0.35,
                 scale: float = 64.0) -> None:
        super().__init__(num_classes, embedding_size)
        if not (isinstance(margin, int | float) and 0.0 <= margin < 2.0):
            raise ValueError(f"margin must be in [0, 2); got {margin!r}")
        self.margin, self.scale = float(margin), _positive("scale", scale)

    def loss(self, sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, *,
             check: bool = True) -> torch.Tensor:
        if check:
            check_labels(labels, h.shape[0], self.num_classes)
        return cosface_loss(sim, labels, self.margin, self.scale)


def cosface_loss(cos: torch.Tensor, labels: torch.Tensor, margin: float, scale: float) -> torch.Tensor:
    logits = cos - margin * F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(logits * scale, labels)


class NormalizedSoftmax(_CosineClassHead):
    """NormalizedSoftmax (Zhai & Wu, 2019): cross-entropy of cos(h, w_k) / temperature."""

    name = "normsoftmax"

    def __init__(self, num_classes: int, embedding_size: int, temperature: float = 0.05) -> None:
        super().__init__(num_classes, embedding_size)
        self.temperature = _positive("temperature", temperature)

    def loss(self, sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, *,
             check: bool = True) -> torch.Tensor:
        if check:
            check_labels(labels, h.shape[0], self.num_classes)
        return F.cross_entropy(sim / self.temperature, labels)


def _logsumexp_add_one(x: torch.Tensor, keep: torch.Tensor, dim: int) -> torch.Tensor:
    """log(1 + sum_{keep} exp(x)) along ``dim``; 0 where nothing is kept."""
    x = x.masked_fill(~keep, torch.finfo(x.dtype).min)
    zeros = torch.zeros_like(x.select(dim, 0)).unsqueeze(dim)
    out = torch.logsumexp(torch.cat([x, zeros], dim=dim), dim=dim)
    return out.masked_fill(~keep.any(dim=dim), 0.0)


class ProxyAnchor(_CosineClassHead):
    """ProxyAnchor (Kim et al., 2020): one proxy per class (W); each proxy pulls the batch's
    samples of its class and pushes the others, with margin delta and scale alpha."""

    name = "proxyanchor"

    def __init__(self, num_classes: int, embedding_size: int, margin: float = 0.1,
                 alpha: float = 32.0) -> None:
        super().__init__(num_classes, embedding_size)
        nn.init.kaiming_normal_(self.W, mode="fan_out")  # as pytorch-metric-learning's proxies
        if not (isinstance(margin, int | float) and 0.0 <= margin <= 1.0):
            raise ValueError(f"margin must be in [0, 1]; got {margin!r}")
        self.margin, self.alpha = float(margin), _positive("alpha", alpha)

    @property
    def scale(self) -> float:
        return self.alpha

    def loss(self, sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, *,
             check: bool = True) -> torch.Tensor:
        if check:
            check_labels(labels, h.shape[0], self.num_classes)
        pos = F.one_hot(labels, self.num_classes).bool()
        pos_term = _logsumexp_add_one(-self.alpha * (sim - self.margin), pos, dim=0)
        neg_term = _logsumexp_add_one(self.alpha * (sim + self.margin), ~pos, dim=0)
        with_pos = pos.any(0).sum()
        return pos_term.sum() / with_pos + neg_term.sum() / self.num_classes


class _ClassMeanHead(LossHead):
    """A pair-based loss: no class vectors to train. It predicts with the nearest class mean
    (cosine) of the training representations, which the training loop computes after every
    epoch (:meth:`set_class_means`) and keeps in ``W``, a buffer saved with the checkpoint."""

    uses_class_means = True
    W: torch.Tensor  # type: ignore[assignment]  # a buffer here, not a Parameter

    def __init__(self, num_classes: int, embedding_size: int) -> None:
        super().__init__(num_classes, embedding_size)
        del self.W
        self.register_buffer("W", torch.zeros(num_classes, embedding_size))

    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        return similarity.cosine(h, self.W)

    @torch.no_grad()
    def set_class_means(self, h: torch.Tensor, labels: torch.Tensor) -> None:
        """W <- the mean of each class's unit-length representations (zero for an absent class)."""
        unit = F.normalize(h.to(self.W.dtype), dim=1, eps=1e-12)
        sums = torch.zeros_like(self.W).index_add_(0, labels, unit)
        counts = torch.bincount(labels, minlength=self.num_classes).clamp_min(1).to(unit.dtype)
        self.W.copy_(sums / counts.unsqueeze(1))

    def pair_loss(self, cos: torch.Tensor, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, *,
             check: bool = True) -> torch.Tensor:
        if check:
            check_labels(labels, h.shape[0], self.num_classes)
        unit = F.normalize(h, dim=1, eps=1e-12)
        return self.pair_loss(unit @ unit.T, unit, labels)

    def extra_repr(self) -> str:
        opts = ", ".join(f"{o.field}={getattr(self, o.keyword)}" for o in declaration(self.name).options)
        return f"{super().extra_repr()}, {opts}"


def _pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positive, negative) masks of a batch: same label but not oneself; another label."""
    same = labels.unsqueeze(1) == labels.unsqueeze(0)
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    return same & ~eye, ~same


def _mean_nonzero(losses: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The mean of the positive entries (pytorch-metric-learning's AvgNonZeroReducer); 0
    (connected to the graph) when there is none."""
    keep = losses > 0
    n = keep.sum()
    if int(n) == 0:
        return (h * 0).sum()
    return (losses * keep).sum() / n


class SupCon(_ClassMeanHead):
    """Supervised contrastive loss (Khosla et al., 2020) on cosine similarities / temperature."""

    name = "supcon"

    def __init__(self, num_classes: int, embedding_size: int, temperature: float = 0.1) -> None:
        super().__init__(num_classes, embedding_size)
        self.temperature = _positive("temperature", temperature)

    def pair_loss(self, cos: torch.Tensor, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos, neg = _pairs(labels)
        if not (bool(pos.any()) and bool(neg.any())):
            return (h * 0).sum()
        mat = cos / self.temperature
        mat = mat - mat.max(dim=1, keepdim=True).values.detach()
        denominator = torch.logsumexp(mat.masked_fill(~(pos | neg), torch.finfo(mat.dtype).min),
                                      dim=1, keepdim=True)
        posf = pos.to(mat.dtype)
        mean_log_prob_pos = (posf * (mat - denominator)).sum(1) / (
            posf.sum(1) + torch.finfo(mat.dtype).tiny)
        return _mean_nonzero(-mean_log_prob_pos, h)


class TripletMargin(_ClassMeanHead):
    """Triplet margin loss on unit-length representations (Euclidean distance), over the
    triplets a TripletMarginMiner keeps (``miner``; ``none``: every triplet of the batch);
    the mean over the triplets that violate the margin."""

    name = "triplet"

    def __init__(self, num_classes: int, embedding_size: int, margin: float = 0.05,
                 miner: str = "semihard") -> None:
        super().__init__(num_classes, embedding_size)
        if not (isinstance(margin, int | float) and 0.0 <= margin <= 2.0):
            raise ValueError(f"margin must be in [0, 2]; got {margin!r}")
        if miner not in ("none", "all", "hard", "semihard", "easy"):
            raise ValueError(f"miner must be one of none, all, hard, semihard, easy; got {miner!r}")
        self.margin, self.miner = float(margin), miner

    def pair_loss(self, cos: torch.Tensor, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos, neg = _pairs(labels)
        dist = torch.cdist(h, h)
        ap, an = dist.unsqueeze(2), dist.unsqueeze(1)  # [a, p, n]
        triplets = pos.unsqueeze(2) & neg.unsqueeze(1)
        if self.miner != "none":
            gap = (an - ap).detach()  # the miner's triplet margin
            if self.miner == "easy":
                triplets = triplets & (gap > self.margin)
            else:
                triplets = triplets & (gap <= self.margin)
                if self.miner == "hard":
                    triplets = triplets & (gap <= 0)
                elif self.miner == "semihard":
                    triplets = triplets & (gap > 0)
        violation = F.relu(ap - an + self.margin) * triplets
        return _mean_nonzero(violation, h)


class MultiSimilarity(_ClassMeanHead):
    """Multi-similarity loss (Wang et al., 2019) over every pair of the batch: positive pairs
    weighted by alpha, negative ones by beta, around the threshold ``base``."""

    name = "multisimilarity"

    def __init__(self, num_classes: int, embedding_size: int, alpha: float = 2.0,
                 beta: float = 50.0, base: float = 0.5) -> None:
        super().__init__(num_classes, embedding_size)
        if not (isinstance(base, int | float) and -1.0 <= base <= 1.0):
            raise ValueError(f"base must be in [-1, 1]; got {base!r}")
        self.alpha, self.beta = _positive("alpha", alpha), _positive("beta", beta)
        self.base = float(base)

    def pair_loss(self, cos: torch.Tensor, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos, neg = _pairs(labels)
        if not (bool(pos.any()) or bool(neg.any())):
            return (h * 0).sum()
        pos_loss = _logsumexp_add_one(self.alpha * (self.base - cos), pos, dim=1) / self.alpha
        neg_loss = _logsumexp_add_one(self.beta * (cos - self.base), neg, dim=1) / self.beta
        return (pos_loss + neg_loss).mean()


LOSSES: dict[str, type[LossHead]] = {
    "cce": CCE,
    "center": CenterLoss,
    "cosine": CosineCOREL,
    "gaussian": GaussianCOREL,
    "arcface": ArcFace,
    "cosface": CosFace,
    "normsoftmax": NormalizedSoftmax,
    "proxyanchor": ProxyAnchor,
    "supcon": SupCon,
    "triplet": TripletMargin,
    "multisimilarity": MultiSimilarity,
}


if set(LOSSES) != set(DECLARATIONS):  # a head for every declared loss, and no other
    raise ImportError(f"corel.losses: heads {sorted(LOSSES)} differ from the declared losses "
                      f"{sorted(DECLARATIONS)} (corel.loss_catalog)")


def register_loss(decl: LossDeclaration, head: type[LossHead]) -> None:
    """Add a loss to corel in one place: its declaration and the head that trains it.

    From then on the spec accepts and validates it, training, sweeps, serving, export, the
    reports and ``GET /losses`` know it. A package can register its losses in every process
    (API, workers) through an entry point of the group ``corel.losses`` naming a function
    that calls this.
    """
    if not (isinstance(head, type) and issubclass(head, LossHead)):
        raise ValueError(f"the head of loss {decl.name!r} must be a LossHead subclass; got {head!r}")
    declare(decl)
    LOSSES[decl.name] = head


def unregister_loss(name: str) -> None:
    """Remove a registered loss (for tests); the built-in ones stay."""
    undeclare(name)
    LOSSES.pop(name, None)


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="corel.losses"):
        ep.load()()


def build_loss(name: str, num_classes: int, dim: int, **params: Any) -> LossHead:
    """Build a loss head by registry name; ``params`` are spec fields.

    The shared parameters a loss does not read (``lam`` for CCE, ``gamma`` for
    Cosine-COREL, ...) are ignored, so one spec can be passed to any loss; a loss's own
    options (margin, scale, ...) that are None or absent take the loss's default, and are
    passed under the head's keyword (ProxyAnchor's ``scale`` is its ``alpha``).
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(LOSSES)}")
    decl = declaration(name)
    kwargs = {k: v for k, v in params.items() if k in decl.params}
    for option in decl.options:
        value = params.get(option.field)
        kwargs[option.keyword] = option.default if value is None else value
    return LOSSES[name](num_classes, dim, **kwargs)


_load_entry_points()
