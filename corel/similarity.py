"""Similarity functions s(h, w_k) between representations and class vectors.

Every function takes representations ``h`` of shape (N, H) and class vectors
``W`` of shape (K, H) and returns the (N, K) matrix of similarities; the
prediction of every COREL variant is ``argmax_k s(h, w_k)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["SIMILARITIES", "SquaredDistances", "check_pair", "cosine", "dot", "gaussian", "squared_distances"]

# Below this norm a vector counts as zero; its cosine similarity is then 0.
_EPS = 1e-12


def check_pair(h: torch.Tensor, W: torch.Tensor) -> None:
    """Raise ValueError unless h is (N, H) and W is (K, H), both floating point.

    A stack of M such pairs, h (M, N, H) and W (M, K, H), is checked the same way (the
    stacked trainer scores every member at once); the leading sizes must agree.
    """
    if not isinstance(h, torch.Tensor) or not isinstance(W, torch.Tensor):
        raise ValueError("h and W must be torch tensors")
    if h.dim() < 2:
        raise ValueError(f"h must have shape (N, H); got {tuple(h.shape)}")
    if W.dim() < 2:
        raise ValueError(f"W must have shape (K, H); got {tuple(W.shape)}")
    if h.dim() != W.dim() or h.shape[:-2] != W.shape[:-2]:
        raise ValueError(f"h must have shape (N, H) and W (K, H) (or the same stack of them); "
                         f"got h {tuple(h.shape)} and W {tuple(W.shape)}")
    if h.shape[-1] != W.shape[-1]:
        raise ValueError(
            f"h and W must share the feature dimension H; got h {tuple(h.shape)} "
            f"and W {tuple(W.shape)}"
        )
    if not (h.is_floating_point() and W.is_floating_point()):
        raise ValueError(f"h and W must be floating point; got {h.dtype} and {W.dtype}")


def dot(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """s_dot(h, w_k) = h . w_k — the similarity behind cross-entropy (CCE)."""
    check_pair(h, W)
    return h @ W.transpose(-2, -1)


def cosine(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """s_cos(h, w_k) = h . w_k / (|h| |w_k|), in [-1, 1] (Cosine-COREL)."""
    check_pair(h, W)
    return F.normalize(h, dim=-1, eps=_EPS) @ F.normalize(W, dim=-1, eps=_EPS).transpose(-2, -1)


def gaussian(h: torch.Tensor, W: torch.Tensor, gamma: float | torch.Tensor = 0.5) -> torch.Tensor:
    """s_gau(h, w_k) = -gamma |h - w_k|^2 (Gaussian-COREL), gamma > 0.

    The squared distance comes from the differences h - w_k (:func:`squared_distances`)
    rather than expanded as |h|^2 - 2 h.w_k + |w_k|^2:
    the expansion cancels catastrophically when |h| is large and h is close to
    w_k (at |h| ~ 500 a point on its class vector came out 0.03 away in float32).
    At zero distance the gradient is 0, as it is for the squared distance.
    """
    check_pair(h, W)
    g = torch.as_tensor(gamma, dtype=h.dtype, device=h.device)
    if g.numel() != 1 or not bool(g > 0):
        raise ValueError(f"gamma must be a positive scalar; got {gamma!r}")
    return _gaussian(h, W, g)


def _gaussian(h: torch.Tensor, W: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """:func:`gaussian` without its checks, for a head whose gamma is positive by
    construction (reading a tensor's sign to check it would wait for a GPU every step)."""
    return -gamma * squared_distances(h, W)


# Up to this many differences (N x K x H, over a stack too: ~1 MB of float32) are
# materialised and summed; beyond, cdist measures the distances without holding them.
# Writing and reading a tensor of differences much larger than a core's cache costs more
# in memory traffic than cdist's slower loop on machines with little bandwidth per core
# (a stack of 10 members: 1.6 M differences, 6.5 MB, twice as slow as cdist forward and
# backward on a 2-core EPYC VM); the paper's batch of 128 against 10 classes fits.
MATERIALISED_DIFFERENCES = 1 << 18


def squared_distances(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """|h_n - w_k|^2 for h (..., N, H) and W (..., K, H): (..., N, K), from the
    differences, never expanded as |h|^2 - 2 h.w + |w|^2 (see :func:`gaussian`).

    For a small problem (:data:`MATERIALISED_DIFFERENCES`) the differences are summed
    directly, with gradients as one autograd node, :class:`SquaredDistances`, whose
    backward reuses them (d/dh_n = 2 sum_k g_nk (h_n - w_k)). Otherwise, and under
    ``torch.func`` transforms, a trace or an export, ``cdist`` without its matrix-product
    shortcut, squared.
    """
    if torch.is_autocast_enabled(h.device.type):  # in float32 under autocast, as cdist is
        h, W = h.float(), W.float()
    size = h.shape[-2] * W.shape[-2] * h.shape[-1] * math.prod(h.shape[:-2])
    if (size > MATERIALISED_DIFFERENCES or torch._C._are_functorch_transforms_active()
            or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()):
        return torch.cdist(h, W, compute_mode="donot_use_mm_for_euclid_dist").square()
    if torch.is_grad_enabled() and (h.requires_grad or W.requires_grad):
        out: torch.Tensor = SquaredDistances.apply(h, W)
        return out
    return (h.unsqueeze(-2) - W.unsqueeze(-3)).square().sum(-1)


class SquaredDistances(torch.autograd.Function):
    """|h_n - w_k|^2 as one node: the forward keeps the differences for the backward."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        diff = h.unsqueeze(-2) - W.unsqueeze(-3)  # (..., N, K, H)
        ctx.save_for_backward(diff)
        return diff.square().sum(-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        (diff,) = ctx.saved_tensors
        # d|h - w|^2 = 2 (h - w) . (dh - dw)
        weighted = diff * (2.0 * grad).unsqueeze(-1)
        grad_h = weighted.sum(-2) if ctx.needs_input_grad[0] else None
        grad_w = -weighted.sum(-3) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w


SIMILARITIES = {"dot": dot, "cosine": cosine, "gaussian": gaussian}
