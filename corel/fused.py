"""The FFNN's layers (Linear, then LeakyReLU, repeated) as one autograd node.

Autograd records five nodes for each Linear + LeakyReLU (and one for the Flatten), and
each costs per-step Python and C++ dispatch that, for the paper's 784-128-128 FFNN at
batch 128, adds up to a good share of the step. :class:`LeakyMLP` computes the same
products with the same kernels in the same order as autograd does (``addmm`` forward;
``leaky_relu_backward``, ``grad.t().mm(input)`` for the weight, ``grad.sum(0)`` for the
bias and ``grad.mm(weight)`` for the input backward), so its outputs and gradients are bit
for bit autograd's (``tests/corel/test_fused.py``); it only saves the bookkeeping.

:func:`leaky_mlp` decides when it applies: training with gradients, in no transform,
trace, export or autocast, where the plain modules run instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["LeakyMLP", "fusable", "leaky_mlp"]


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
    if not torch.is_grad_enabled() or not any(m.weight.requires_grad for m in linears):
        return None
    if (torch._C._are_functorch_transforms_active() or torch.jit.is_tracing()
            or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()):
        return None
    if torch.is_autocast_enabled(x.device.type):
        return None
    params = [t for m in linears for t in (m.weight, m.bias)]
    if any(p.dtype != x.dtype or p.device != x.device for p in params):
        return None
    out: torch.Tensor = LeakyMLP.apply(x.flatten(1), slope, *params)
    return out
