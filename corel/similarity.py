"""Similarity functions s(h, w_k) between representations and class vectors.

Every function takes representations ``h`` of shape (N, H) and class vectors
``W`` of shape (K, H) and returns the (N, K) matrix of similarities; the
prediction of every COREL variant is ``argmax_k s(h, w_k)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from corel.fused import squared_distances

__all__ = ["SIMILARITIES", "check_pair", "cosine", "dot", "gaussian"]

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


def _transposed(W: torch.Tensor) -> torch.Tensor:
    """W^T (..., H, K) laid out in memory as such (a copy of the K class vectors), not a
    transposed view: MKL multiplies a few rows (a small batch) by a transposed view with
    other rounding on 1 thread than on 2 on some CPUs (an AMD EPYC with AVX-512, even in its
    strict mode), by this layout alike; a run's figures must not depend on its worker's
    share of the host."""
    return W.transpose(-2, -1).contiguous()


def dot(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """s_dot(h, w_k) = h . w_k — the similarity behind cross-entropy (CCE)."""
    check_pair(h, W)
    return h @ _transposed(W)


def cosine(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """s_cos(h, w_k) = h . w_k / (|h| |w_k|), in [-1, 1] (Cosine-COREL)."""
    check_pair(h, W)
    return F.normalize(h, dim=-1, eps=_EPS) @ _transposed(F.normalize(W, dim=-1, eps=_EPS))


def gaussian(h: torch.Tensor, W: torch.Tensor, gamma: float | torch.Tensor = 0.5) -> torch.Tensor:
    """s_gau(h, w_k) = -gamma |h - w_k|^2 (Gaussian-COREL), gamma > 0.

    The distance is taken from the differences h - w_k (``cdist`` without its
    matrix-product shortcut) rather than expanded as |h|^2 - 2 h.w_k + |w_k|^2:
    the expansion cancels catastrophically when |h| is large and h is close to
    w_k (at |h| ~ 500 a point on its class vector came out 0.03 away in float32).
    At zero distance the gradient is 0, as it is for the squared distance. The gradient
    is taken as matrix products about the class vectors' mean
    (:func:`corel.fused.squared_distance_backward`).
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


SIMILARITIES = {"dot": dot, "cosine": cosine, "gaussian": gaussian}
