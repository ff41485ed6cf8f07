"""Attractive-repulsive (AR) losses: CCE, Cosine-COREL and Gaussian-COREL, and the AR loss
as a plain function.

The paper (Kenyon-Dean et al., 2019) writes the loss of a sample i with label y_i
as

    L_AR = mean_i [ -lam * attract(s, h_i, y_i) + (1 - lam) * repulse(s, h_i, W) ]

with lam in (0, 1]. The equation lives in a plain function, :func:`attractive_repulsive`;
the ``nn.Module`` presets below only own their parameters (W, bias, gamma) and call it.

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

import torch
import torch.nn.functional as F
from torch import nn

from corel import similarity
from corel.fused import gaussian_ar
from corel.losses.head import LossHead, _check_lam, check_labels

REPULSIONS = ("logsumexp", "max_squared")


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


def _cross_entropy(sim: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """F.cross_entropy's batch mean, or for a stack of members' sim (M, N, K), each one's."""
    if sim.dim() == 2:
        return F.cross_entropy(sim, labels)
    rows = F.cross_entropy(sim.flatten(0, -2), labels.expand(sim.shape[:-1]).flatten(),
                           reduction="none")
    return rows.view(sim.shape[:-1]).mean(-1)


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
