"""The FFNN's layers (Linear, then LeakyReLU, repeated) as one autograd node; the
Gaussian-COREL similarity and loss as another.

Autograd records five nodes for each Linear + LeakyReLU (and one for the Flatten), and
each costs per-step Python and C++ dispatch that, for the paper's 784-128-128 FFNN at
batch 128, adds up to a good share of the step. :class:`LeakyMLP` computes the same
products with the same kernels in the same order as autograd does (``addmm`` forward;
``leaky_relu_backward``, ``grad.t().mm(input)`` for the weight, ``grad.sum(0)`` for the
bias and ``grad.mm(weight)`` for the input backward), so its outputs and gradients are bit
for bit autograd's (``tests/corel/test_fused.py``); it only saves the bookkeeping.

:func:`leaky_mlp` decides when it applies: training with gradients, in no transform,
trace, export, ``torch.compile`` or autocast, where the plain modules run instead.

:class:`GaussianAR` does the same for the Gaussian-COREL head (the product's default
loss): the squared distances, the similarities and the attractive-repulsive loss as one
node. Autograd records about a dozen nodes for them (the squared distances'
:class:`SquaredDistance`, the gamma product, the gather, logsumexp, the weighted sum and
the mean), and at the paper's sizes their bookkeeping costs more than their arithmetic.
Its backward makes autograd's calls in autograd's order (``tests/corel/test_fused.py`` checks the gradients bit for bit);
:func:`gaussian_ar` decides when it applies, as :func:`leaky_mlp` does.

:class:`SharedLinear` is a stack's first layer on the members' shared inputs (one
``baddbmm`` over the inputs broadcast to the members, whose rounding is each member's own
``addmm``'s), with the backward that one wide product's autograd takes (``corel.train.stacked``).

Where :mod:`corel.native` is built, both run as its C++ twins of these nodes, which make
the same calls in the same order (the same numbers bit for bit) without the per-call
Python; these Python nodes run where it is not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from corel import native as _native

__all__ = [
    "GaussianAR", "LeakyMLP", "SharedLinear", "SquaredDistance", "fusable", "gaussian_ar", "leaky_mlp",
    "plain_autograd", "shared_linear", "squared_distance_backward", "squared_distances",
]


class LeakyMLP(torch.autograd.Function):
    """``leaky(... leaky(x W1^T + b1, s) ... W_L^T + b_L, s)`` for 2-D x; ``params`` =
    (W1, b1, ..., W_L, b_L)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slope: float, *params: torch.Tensor) -> torch.Tensor:
        outputs = []
        a = x
        for weight, bias in zip(params[::2], params[1::2], strict=True):
            # In place on addmm's fresh result, as LeakyReLU(inplace=True) would: for a
            # positive slope the sign of the output is the sign of the input, which is all
            # the backward needs (leaky_relu_backward's self_is_result).
            a = torch.nn.functional.leaky_relu_(torch.addmm(bias, a, weight.t()), slope)
            outputs.append(a)
        ctx.slope = slope
        ctx.save_for_backward(x, *outputs, *params)
        return a

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        layers = (len(saved) - 1) // 3
        inputs, params = saved[: layers + 1], saved[layers + 1 :]
        grads: list[torch.Tensor | None] = [None] * len(params)
        for i in reversed(range(layers)):
            grad = torch.ops.aten.leaky_relu_backward(grad, inputs[i + 1], ctx.slope, True)
            if ctx.needs_input_grad[2 + 2 * i]:
                grads[2 * i] = grad.t().mm(inputs[i])
            if ctx.needs_input_grad[3 + 2 * i]:
                grads[2 * i + 1] = grad.sum(0)
            if i > 0 or ctx.needs_input_grad[0]:
                grad = grad.mm(params[2 * i])
        return (grad if ctx.needs_input_grad[0] else None, None, *grads)


class SharedLinear(torch.autograd.Function):
    """M linear layers on one input: x (N, D), W (M, out, D), b (M, out) -> (M, N, out),
    member m's ``x W_m^T + b_m``.

    The forward is one ``baddbmm`` over x broadcast to the members: with MKL on an AVX2 CPU
    each member's rows come out as its solo run's ``addmm`` rounds them (elsewhere, to
    rounding), and it runs faster there than
    the members' weights side by side as one (N, D) x (D, M out) product, whose speed on 2
    cores also swings between runs (``bench/sweep_throughput.py``). Autograd's backward of
    that ``baddbmm`` would take each weight's gradient as (D x N) x (N x out) and copy it
    into W's layout; this one takes them as one (M out x N) x (N x D) product in W's own
    layout, the calls autograd makes for the side-by-side product, so the gradients are
    those of that wide layer bit for bit. corel.native's stacked step makes the same calls.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, W)
        return _shared_forward(x, W, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, W = ctx.saved_tensors
        members, out, dim = W.shape
        flat = grad.transpose(0, 1).reshape(x.shape[0], members * out)  # (N, M out)
        grad_x = flat.mm(W.reshape(members * out, dim)) if ctx.needs_input_grad[0] else None
        grad_w = flat.t().mm(x).view(members, out, dim) if ctx.needs_input_grad[1] else None
        grad_b = flat.sum(0).view(members, out) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def shared_linear(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """:class:`SharedLinear` where a gradient is wanted and :func:`plain_autograd` holds;
    else its forward's plain ``baddbmm`` (the same values; autograd's own backward then)."""
    if (W.requires_grad or b.requires_grad or x.requires_grad) and plain_autograd(x):
        out: torch.Tensor = SharedLinear.apply(x, W, b)
        return out
    return _shared_forward(x, W, b)


def _shared_forward(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.baddbmm(b.unsqueeze(1), x.expand(W.shape[0], *x.shape), W.transpose(1, 2))


def fusable(layers: nn.Sequential) -> tuple[float, list[nn.Linear]] | None:
    """(slope, linears) when ``layers`` is Flatten?, then (Linear, LeakyReLU) pairs with
    one positive slope and biases; None otherwise (dropout, another activation)."""
    children = list(layers)
    if children and isinstance(children[0], nn.Flatten) and (children[0].start_dim, children[0].end_dim) == (1, -1):
        children = children[1:]
    if not children or len(children) % 2:
        return None
    linears, slopes = children[::2], children[1::2]
    if not all(isinstance(m, nn.Linear) and m.bias is not None for m in linears):
        return None
    if not all(isinstance(m, nn.LeakyReLU) for m in slopes):
        return None
    values = {float(m.negative_slope) for m in slopes if isinstance(m, nn.LeakyReLU)}
    if len(values) != 1 or not next(iter(values)) > 0:
        return None
    return next(iter(values)), linears  # type: ignore[return-value]


def leaky_mlp(x: torch.Tensor, slope: float, linears: list[nn.Linear]) -> torch.Tensor | None:
    """The layers on x (N, ...) flattened, as one :class:`LeakyMLP` node, or None where the
    plain modules should run: without gradients, under ``torch.func`` transforms, a trace,
    an export or autocast."""
    if not any(m.weight.requires_grad for m in linears) or not plain_autograd(x):
        return None
    params = [t for m in linears for t in (m.weight, m.bias)]
    if any(p.dtype != x.dtype or p.device != x.device for p in params):
        return None
    native = _native.module()
    if native is not None:
        compiled: torch.Tensor = native.leaky_mlp(x.flatten(1), slope, params)
        return compiled
    out: torch.Tensor = LeakyMLP.apply(x.flatten(1), slope, *params)
    return out


def plain_autograd(x: torch.Tensor) -> bool:
    """True where a fused node may replace the plain operations on x: with gradients, and
    in no ``torch.func`` transform, trace, script, export, ``torch.compile`` (which traces
    the plain operations whole, where the compiled node would break its graph) or autocast."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if (torch._C._are_functorch_transforms_active() or torch.jit.is_tracing()
            or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()):
        return False
    return not torch.is_autocast_enabled(x.device.type)


def squared_distance_backward(grad: torch.Tensor, h: torch.Tensor, W: torch.Tensor, need_h: bool = True,
                              need_w: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of ``sum(grad * |h_i - w_k|^2)`` with respect to h and W (each where
    asked for): ``2 sum_k grad_ik (h_i - w_k)`` and ``2 sum_i grad_ik (w_k - h_i)``.

    As matrix products (``addmm``; for a stack, one for each member on a CPU) rather than
    cdist's own backward, which forms every difference h_i - w_k, divides it by its
    distance and sums it (``bench/distance_backward.py`` times the two). The sums are taken about
    the class vectors' mean c, ``(h_i - c) sum_k grad_ik - sum_k grad_ik (w_k - c)``, not
    about the origin: what the expansion loses to rounding scales with the vectors it
    multiplies, and |h_i - c| is the size of the distances themselves where |h_i| may be
    far larger (:func:`corel.similarity.gaussian`). At zero distance (h_i = w_k) the
    term is exactly 0, as the squared distance's derivative is.
    """
    twice = grad * 2.0
    centre = W.mean(-2, keepdim=True)
    h_c, w_c = h - centre, W - centre
    grad_h = _minus_product(h_c * twice.sum(-1, keepdim=True), twice, w_c) if need_h else None
    # W's as its transpose, (H x N) @ (N x K): MKL (AVX2) rounds that form alike alone and
    # in a stack's batch, where (K x N) @ (N x H) comes out a few ulps apart (the layers'
    # weight gradients, which autograd takes in the same form, match alike).
    grad_w = (_minus_product((w_c * twice.sum(-2).unsqueeze(-1)).mT, h_c.mT, twice).mT.contiguous()
              if need_w else None)
    return grad_h, grad_w


def _cdist_squared(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """The squared distances' values, from the differences (cdist without its
    matrix-product shortcut), then squared: every forward here takes them so."""
    return torch.cdist(h, W, compute_mode="donot_use_mm_for_euclid_dist").square()


def _minus_product(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``base - a @ b``: ``addmm`` for a pair (2-D), one ``baddbmm`` for a stack (3-D). In
    the forms :func:`squared_distance_backward` takes them, MKL on this project's AVX2
    machines rounds a stacked member's products as its solo run's, bit for bit
    (``bench/sweep_throughput.py`` prints the difference)."""
    if base.dim() == 2:
        return torch.addmm(base, a, b, alpha=-1)
    return torch.baddbmm(base, a, b, alpha=-1)


class SquaredDistance(torch.autograd.Function):
    """``cdist(h, W)**2``, the squared distances of h (N, H) to W (K, H) (or of a stack,
    (M, N, H) and (M, K, H)), taken from the differences as
    :func:`corel.similarity.gaussian` takes them, with :func:`squared_distance_backward`
    as its backward."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, W)
        return _cdist_squared(h, W)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, W = ctx.saved_tensors
        return squared_distance_backward(grad, h, W, ctx.needs_input_grad[0], ctx.needs_input_grad[1])


def squared_distances(h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """``cdist(h, W)**2``: one :class:`SquaredDistance` node where a gradient is wanted
    and the plain operations are not needed (:func:`plain_autograd`), else cdist and
    square (the same values; autograd's own backward then)."""
    if (h.requires_grad or W.requires_grad) and plain_autograd(h):
        return SquaredDistance.apply(h, W)
    return _cdist_squared(h, W)


class GaussianAR(torch.autograd.Function):
    """(loss, sim) of Gaussian-COREL: ``sim = -gamma * cdist(h, W)**2`` (the differences'
    norms, as :func:`corel.similarity.gaussian`) and the batch mean
    ``mean_i [-lam sim[i, y_i] + one_minus_lam logsumexp_k sim[i, k]]``.

    h (N, H), W (K, H), gamma 0-d; or a stack of M members: h (M, N, H), W (M, K, H),
    gamma (M, 1, 1), lam and one_minus_lam (M, 1), and the loss (M,). ``labels`` (N,) are
    shared and already validated.
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, W: torch.Tensor, gamma: torch.Tensor, labels: torch.Tensor,
                lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor) -> tuple[torch.Tensor, ...]:
        squared = _cdist_squared(h, W)
        neg_gamma = -gamma
        sim = neg_gamma * squared
        index = labels.expand(sim.shape[:-1]).unsqueeze(-1)
        lse = torch.logsumexp(sim, dim=-1)
        loss = (-lam * sim.gather(-1, index).squeeze(-1) + one_minus_lam * lse).mean(-1)
        ctx.save_for_backward(h, W, squared, neg_gamma, sim, lse, index)
        ctx.lam, ctx.one_minus_lam = lam, one_minus_lam
        ctx.set_materialize_grads(False)
        return loss, sim

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor | None, grad_sim: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, ...]:
        h, W, squared, neg_gamma, sim, lse, index = ctx.saved_tensors
        grad = grad_sim
        if grad_loss is not None:
            # The mean's, the weighted sum's, then logsumexp's and the gather's backward.
            # A stack's lambdas may be float64: autograd rounds each product to sim's dtype.
            rows = grad_loss.unsqueeze(-1).expand(sim.shape[:-1]) / sim.shape[-2]
            attract = (rows * (-ctx.lam)).to(sim.dtype)
            repulse = (rows * ctx.one_minus_lam).to(sim.dtype)
            from_lse = repulse.unsqueeze(-1) * (sim - lse.unsqueeze(-1)).exp()
            from_loss = from_lse.scatter_add_(-1, index, attract.unsqueeze(-1))
            grad = from_loss if grad is None else grad + from_loss
        if grad is None:
            return None, None, None, None, None, None
        grad_gamma = None
        if ctx.needs_input_grad[2]:
            grad_gamma = -(grad * squared).sum_to_size(neg_gamma.shape)
        # The gamma product's, then the squared distances' backward.
        grad_h, grad_w = squared_distance_backward(
            grad * neg_gamma, h, W, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return grad_h, grad_w, grad_gamma, None, None, None


def gaussian_ar(
    h: torch.Tensor, W: torch.Tensor, gamma: torch.Tensor, labels: torch.Tensor,
    lam: float | torch.Tensor, one_minus_lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(loss, sim) as one :class:`GaussianAR` node, or None where the plain operations
    should run (see :func:`leaky_mlp`), or where the tensors differ in dtype or device."""
    if not plain_autograd(h):
        return None
    if any(t.dtype != h.dtype for t in (W, gamma)):
        return None
    tensors = [W, gamma, labels] + [t for t in (lam, one_minus_lam) if isinstance(t, torch.Tensor)]
    if any(t.device != h.device for t in tensors):
        return None
    native = _native.module()
    if native is not None:
        # The floats as floats, the tensors (a stack's lambdas) as tensors, as the Python node.
        weights = [t if isinstance(t, torch.Tensor) else None for t in (lam, one_minus_lam)]
        floats = [0.0 if isinstance(t, torch.Tensor) else float(t) for t in (lam, one_minus_lam)]
        loss, sim = native.gaussian_ar(h, W, gamma, labels, *floats, *weights)
        return loss, sim
    loss, sim = GaussianAR.apply(h, W, gamma, labels, lam, one_minus_lam)
    return loss, sim
