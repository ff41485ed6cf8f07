"""pytorch-metric-learning's losses (Musgrave et al., 2020) as corel heads: ArcFace, CosFace,
NormalizedSoftmax, ProxyAnchor (a class or proxy matrix, scored by cosine), SupCon, a mined
triplet loss and MultiSimilarity (pair-based: they predict with the nearest class mean).

They are written as functions of the cosine similarities so that they run in corel's
loops, serve and export as its own heads do. Each gives pytorch-metric-learning's loss
value and gradients on the same embeddings, labels and parameters
(tests/corel/losses/test_peers.py checks it against its objects).

Their options (margin, scale, ...) are written once, in their declarations
(:mod:`corel.loss_catalog`): an option left out or None takes the declared default, and one
outside the declared range is refused as the API refuses it (:meth:`LossHead.declared_option`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from corel import similarity
from corel.loss_catalog import declaration
from corel.losses.head import LossHead


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


class ArcFace(_CosineClassHead):
    """ArcFace (Deng et al., 2019): scale * cos(theta_y + margin) for the own class (margin
    in degrees), scale * cos(theta_k) for the others, softmax cross-entropy."""

    name = "arcface"

    def __init__(self, num_classes: int, embedding_size: int, margin: float | None = None,
                 scale: float | None = None) -> None:
        super().__init__(num_classes, embedding_size)
        self.margin: float = self.declared_option("margin", margin)
        self.scale: float = self.declared_option("scale", scale)

    @classmethod
    def functional_options(cls, values: Mapping[str, float | str]) -> dict[str, float | str]:
        return {"margin_rad": math.radians(float(values["margin"])), "scale": values["scale"]}

    @staticmethod
    def functional_loss(sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, lam: Any,
                        one_minus_lam: Any, state: Mapping[str, Any]) -> torch.Tensor:
        return arcface_loss(sim, labels, state["margin_rad"], state["scale"])


Number = float | torch.Tensor
"""An option's value: a float, or a 0-d tensor (a member's own, under ``torch.vmap``)."""


def arcface_loss(cos: torch.Tensor, labels: torch.Tensor, margin_rad: Number, scale: Number) -> torch.Tensor:
    target = cos.gather(1, labels.unsqueeze(1))
    angles = torch.acos(target.clamp(-1, 1))
    # cos(theta + m) while theta + m <= pi, then a line that keeps the loss decreasing
    sin_m = torch.sin(margin_rad) if isinstance(margin_rad, torch.Tensor) else math.sin(margin_rad)
    modified = torch.where(angles <= math.pi - margin_rad, torch.cos(angles + margin_rad),
                           torch.cos(angles) - margin_rad * sin_m)
    logits = cos + F.one_hot(labels, cos.shape[1]).to(cos.dtype) * (modified - target)
    return F.cross_entropy(logits * scale, labels)


class CosFace(_CosineClassHead):
    """CosFace (Wang et al., 2018): scale * (cos(theta_y) - margin) for the own class."""

    name = "cosface"

    def __init__(self, num_classes: int, embedding_size: int, margin: float | None = None,
                 scale: float | None = None) -> None:
        super().__init__(num_classes, embedding_size)
        self.margin: float = self.declared_option("margin", margin)
        self.scale: float = self.declared_option("scale", scale)

    @staticmethod
    def functional_loss(sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, lam: Any,
                        one_minus_lam: Any, state: Mapping[str, Any]) -> torch.Tensor:
        return cosface_loss(sim, labels, state["margin"], state["scale"])


def cosface_loss(cos: torch.Tensor, labels: torch.Tensor, margin: Number, scale: Number) -> torch.Tensor:
    logits = cos - margin * F.one_hot(labels, cos.shape[1]).to(cos.dtype)
    return F.cross_entropy(logits * scale, labels)


class NormalizedSoftmax(_CosineClassHead):
    """NormalizedSoftmax (Zhai & Wu, 2019): cross-entropy of cos(h, w_k) / temperature."""

    name = "normsoftmax"

    def __init__(self, num_classes: int, embedding_size: int, temperature: float | None = None) -> None:
        super().__init__(num_classes, embedding_size)
        self.temperature: float = self.declared_option("temperature", temperature)

    @staticmethod
    def functional_loss(sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, lam: Any,
                        one_minus_lam: Any, state: Mapping[str, Any]) -> torch.Tensor:
        return normsoftmax_loss(sim, labels, state["temperature"])


def normsoftmax_loss(cos: torch.Tensor, labels: torch.Tensor, temperature: Number) -> torch.Tensor:
    return F.cross_entropy(cos / temperature, labels)


def _logsumexp_add_one(x: torch.Tensor, keep: torch.Tensor, dim: int) -> torch.Tensor:
    """log(1 + sum_{keep} exp(x)) along ``dim``; 0 where nothing is kept (the sum is then
    empty). Shifted by m = max(0, the largest kept x), whose own derivative cancels (it is
    detached): m + log(exp(-m) + sum_{keep} exp(x - m)). The 1 in the sum is exp(-m); no
    concatenated column of zeros and no mask of the empty rows afterwards (1.8x
    torch.logsumexp over the concatenation, forward and backward, on (3, 128, 128))."""
    x = x.masked_fill(~keep, torch.finfo(x.dtype).min)  # exp(x - m) is 0 where not kept
    m = x.amax(dim=dim, keepdim=True).clamp_min(0).detach()
    return m.squeeze(dim) + ((x - m).exp().sum(dim=dim) + (-m.squeeze(dim)).exp()).log()


class ProxyAnchor(_CosineClassHead):
    """ProxyAnchor (Kim et al., 2020): one proxy per class (W); each proxy pulls the batch's
    samples of its class and pushes the others, with margin delta and scale alpha."""

    name = "proxyanchor"

    def __init__(self, num_classes: int, embedding_size: int, margin: float | None = None,
                 alpha: float | None = None) -> None:
        super().__init__(num_classes, embedding_size)
        nn.init.kaiming_normal_(self.W, mode="fan_out")  # as pytorch-metric-learning's proxies
        self.margin: float = self.declared_option("margin", margin)
        self.alpha: float = self.declared_option("alpha", alpha)

    @property
    def scale(self) -> float:
        return self.alpha

    @staticmethod
    def functional_loss(sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, lam: Any,
                        one_minus_lam: Any, state: Mapping[str, Any]) -> torch.Tensor:
        return proxyanchor_loss(sim, labels, state["margin"], state["alpha"])


def proxyanchor_loss(cos: torch.Tensor, labels: torch.Tensor, margin: Number, alpha: Number) -> torch.Tensor:
    """ProxyAnchor of a batch's cosine similarities to the proxies (N, K)."""
    pos = F.one_hot(labels, cos.shape[1]).bool()
    pos_term = _logsumexp_add_one(-alpha * (cos - margin), pos, dim=0)
    neg_term = _logsumexp_add_one(alpha * (cos + margin), ~pos, dim=0)
    with_pos = pos.any(0).sum()
    return pos_term.sum() / with_pos + neg_term.sum() / cos.shape[1]


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
        self.W.copy_(class_means(h, labels, self.W))

    def extra_repr(self) -> str:
        opts = ", ".join(f"{o.field}={getattr(self, o.keyword)}" for o in declaration(self.name).options)
        return f"{super().extra_repr()}, {opts}"


def class_means(h: torch.Tensor, labels: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The mean of each class's unit-length representations h (N, H), in the dtype and shape
    of ``like`` (K, H): zero for a class absent from ``labels``."""
    unit = F.normalize(h.to(like.dtype), dim=1, eps=1e-12)
    sums = torch.zeros_like(like).index_add_(0, labels, unit)
    counts = torch.bincount(labels, minlength=like.shape[0]).clamp_min(1).to(unit.dtype)
    return sums / counts.unsqueeze(1)


def _unit(h: torch.Tensor) -> torch.Tensor:
    """A pair-based loss's representations: unit length (its similarities are unit @ unit.T)."""
    return F.normalize(h, dim=1, eps=1e-12)


def _pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positive, negative) masks of a batch: same label but not oneself; another label."""
    same = labels.unsqueeze(1) == labels.unsqueeze(0)
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    return same & ~eye, ~same


def _mean_nonzero(losses: torch.Tensor) -> torch.Tensor:
    """The mean of the positive entries (pytorch-metric-learning's AvgNonZeroReducer); 0
    (connected to the graph, with zero gradients) when there is none. Of a fixed shape, with
    no branch on a value: the count stays a tensor (at least 1, where the sum is 0 anyway)."""
    keep = losses > 0
    return (losses * keep).sum() / keep.sum().clamp_min(1)


class SupCon(_ClassMeanHead):
    """Supervised contrastive loss (Khosla et al., 2020) on cosine similarities / temperature."""

    name = "supcon"

    def __init__(self, num_classes: int, embedding_size: int, temperature: float | None = None) -> None:
        super().__init__(num_classes, embedding_size)
        self.temperature: float = self.declared_option("temperature", temperature)

    @staticmethod
    def functional_loss(sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, lam: Any,
                        one_minus_lam: Any, state: Mapping[str, Any]) -> torch.Tensor:
        unit = _unit(h)
        return supcon_loss(unit @ unit.T, labels, state["temperature"])


def supcon_loss(cos: torch.Tensor, labels: torch.Tensor, temperature: Number) -> torch.Tensor:
    """SupCon of a batch's cosine similarities; 0 (with zero gradients) for a batch without
    both a positive and a negative pair, as pytorch-metric-learning's. No branch on a value."""
    pos, neg = _pairs(labels)
    mat = cos / temperature
    mat = mat - mat.max(dim=1, keepdim=True).values.detach()
    denominator = torch.logsumexp(mat.masked_fill(~(pos | neg), torch.finfo(mat.dtype).min),
                                  dim=1, keepdim=True)
    posf = pos.to(mat.dtype)
    mean_log_prob_pos = (posf * (mat - denominator)).sum(1) / (
        posf.sum(1) + torch.finfo(mat.dtype).tiny)
    return _mean_nonzero(-mean_log_prob_pos) * (pos.any() & neg.any()).to(mat.dtype)


class TripletMargin(_ClassMeanHead):
    """Triplet margin loss on unit-length representations (Euclidean distance), over the
    triplets a TripletMarginMiner keeps (``miner``; ``none``: every triplet of the batch);
    the mean over the triplets that violate the margin."""

    name = "triplet"

    def __init__(self, num_classes: int, embedding_size: int, margin: float | None = None,
                 miner: str | None = None) -> None:
        super().__init__(num_classes, embedding_size)
        self.margin: float = self.declared_option("margin", margin)
        self.miner: str = self.declared_option("miner", miner)

    @staticmethod
    def functional_loss(sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, lam: Any,
                        one_minus_lam: Any, state: Mapping[str, Any]) -> torch.Tensor:
        return triplet_loss(_unit(h), labels, state["margin"], state["miner"])


def triplet_loss(h: torch.Tensor, labels: torch.Tensor, margin: Number, miner: str) -> torch.Tensor:
    """The triplet margin loss of unit-length representations h (N, H) over the triplets
    ``miner`` keeps. Of a fixed shape: no branch on a tensor's value (the miner is a name,
    the same for every member of a stack; the margin may be each member's own)."""
    # The mean over the kept triplets (a, p, n) of ap - an + margin, where kept means the
    # miner's choice and a positive violation (an < ap + margin). Which triplets are kept
    # carries no gradient, so the sum is taken over the (B, B) distances, each weighted by
    # how many kept triplets its pair is in, and those counts come from each anchor's
    # sorted distances (a binary search per pair) instead of the (B, B, B) triplets: the
    # same loss and gradient (a triplet exactly on a boundary aside), at batch 128 about
    # a tenth of the time.
    pos, neg = _pairs(labels)
    dist = torch.cdist(h, h)
    if miner == "easy":  # an > ap + margin: none violates the margin
        return (h * 0).sum()
    with torch.no_grad():
        d = dist.detach()
        inf = torch.full_like(d, float("inf"))
        negatives = torch.where(neg, d, inf).sort(dim=1).values  # per anchor, ascending
        positives = torch.where(pos, d, inf).sort(dim=1).values
        m = margin

        def count(sorted_: torch.Tensor, bound: torch.Tensor, inclusive: bool) -> torch.Tensor:
            """Per (a, x): how many of anchor a's sorted distances lie below ``bound``
            (or at it, ``inclusive``)."""
            return torch.searchsorted(sorted_, bound.contiguous(), right=inclusive).to(d.dtype)

        n_pos = pos.sum(1, keepdim=True).to(d.dtype)
        if miner == "semihard":  # ap < an < ap + m
            per_ap = count(negatives, d + m, False) - count(negatives, d, True)
            per_an = count(positives, d, False) - count(positives, d - m, True)
        elif miner == "hard":  # an <= ap, and an < ap + m: an <= ap where m > 0, an < ap at m = 0
            wide = torch.as_tensor(m > 0, device=d.device)
            per_ap = torch.where(wide, count(negatives, d, True), count(negatives, d, False))
            per_an = n_pos - torch.where(wide, count(positives, d, False), count(positives, d, True))
        else:  # all, none: an < ap + m
            per_ap = count(negatives, d + m, False)
            per_an = n_pos - count(positives, d - m, True)
        per_ap = per_ap * pos  # per (a, p): its kept triplets
        per_an = per_an * neg  # per (a, n)
        n = per_ap.sum()
    # No triplet kept: 0, with zero gradients (no branch on the count's value).
    return (((dist * per_ap).sum() - (dist * per_an).sum()) / n.clamp_min(1) + m) * (n > 0).to(dist.dtype)


class MultiSimilarity(_ClassMeanHead):
    """Multi-similarity loss (Wang et al., 2019) over every pair of the batch: positive pairs
    weighted by alpha, negative ones by beta, around the threshold ``base``."""

    name = "multisimilarity"

    def __init__(self, num_classes: int, embedding_size: int, alpha: float | None = None,
                 beta: float | None = None, base: float | None = None) -> None:
        super().__init__(num_classes, embedding_size)
        self.alpha: float = self.declared_option("alpha", alpha)
        self.beta: float = self.declared_option("beta", beta)
        self.base: float = self.declared_option("base", base)

    @staticmethod
    def functional_loss(sim: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, lam: Any,
                        one_minus_lam: Any, state: Mapping[str, Any]) -> torch.Tensor:
        unit = _unit(h)
        return multisimilarity_loss(unit @ unit.T, labels, state["alpha"], state["beta"], state["base"])


def multisimilarity_loss(cos: torch.Tensor, labels: torch.Tensor, alpha: Number, beta: Number,
                         base: Number) -> torch.Tensor:
    """Multi-similarity of a batch's pairwise cosine similarities (N, N); a batch without pairs
    (one row) gives 0: both terms are 0 where nothing is kept. No branch on a value."""
    pos, neg = _pairs(labels)
    pos_loss = _logsumexp_add_one(alpha * (base - cos), pos, dim=1) / alpha
    neg_loss = _logsumexp_add_one(beta * (cos - base), neg, dim=1) / beta
    return (pos_loss + neg_loss).mean()
