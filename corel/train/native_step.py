"""A whole training step in one compiled call, where :mod:`corel.native` covers it.

The paper's FFNN with the product's default head (Gaussian-COREL, gamma fixed) and Adam:
:func:`gaussian_mlp_step` runs the forward pass, the loss, the backward pass and Adam's
update as one C++ call (``gaussian_mlp_step`` in ``corel/native/fused.cpp``), which makes
the ATen calls that ``loss.backward()`` and :class:`corel.train.optim.FusedAdam` make on the
fused nodes of :mod:`corel.fused`, in their order, without building an autograd graph.
:func:`stacked_gaussian_mlp_step` does the same for a stack of such members
(:class:`corel.train.stacked.StackedRun`), with the calls autograd makes for the stacked FFNN's
plain operations. So the weights, gradients, moments, losses and similarities they leave
are bit for bit the autograd step's (``tests/corel/train/test_native_step.py``); they save the graph's
bookkeeping and the step's Python (on a 2-core AMD EPYC a solo epoch ran 1.15-1.4x as
fast, a 10-member stack 1.01-1.11x, over two sessions' runs: ``bench/native_nodes.py``).

They return None wherever the autograd step should run instead: no native build, another
encoder or head, a learned gamma, a frozen parameter, hooks on the encoder or the
parameters, an optimiser other than a lean :class:`~corel.train.optim.FusedAdam` (its first
step, which creates the state, included), bf16, a GPU (where the step is replayed as a
CUDA graph, :mod:`corel.train.graphs`, which takes away the same overhead), and where
:mod:`corel.fused` would not fuse either (no gradients, ``torch.func`` transforms,
traces, export, autocast).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules import module as torch_module

from corel import native as _native
from corel.encoders.paper import FFNN
from corel.fused import plain_autograd
from corel.losses import GaussianCOREL, LossHead, check_labels
from corel.models import Classifier
from corel.train.optim import FusedAdam

__all__ = ["gaussian_mlp_step", "stacked_gaussian_mlp_step", "stacked_layers"]


def gaussian_mlp_step(
    model: Classifier, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *, check: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One Adam step of ``model`` on the batch (x, y) as one native call: (loss,
    similarities), as :func:`corel.train.solo._step` returns them; or None where the autograd
    step should run (see the module). ``check``: validate the labels first."""
    native = _native.module()
    if native is None or not isinstance(optimizer, FusedAdam):
        return None
    encoder, head = model.encoder, model.head
    fused = encoder.fused_layers if type(encoder) is FFNN else None
    if fused is None or type(head) is not GaussianCOREL or head.learn_gamma:
        return None
    slope, linears = fused
    layers = [t for m in linears for t in (m.weight, m.bias)]
    W = head.W
    if (x.shape[0] == 0 or x.device.type != "cpu" or x.dtype != W.dtype or x.device != W.device or not plain_autograd(x)
            or _hooked(encoder, [*layers, W])):
        return None
    adam = _adam_arguments(optimizer, [*layers, W])
    if adam is None:
        return None
    if check:
        check_labels(y, x.shape[0], head.num_classes)
    loss, sim = native.gaussian_mlp_step(x.flatten(1), y, slope, layers, W, head.fixed_gamma, head.lam,
                                         1.0 - head.lam, *adam)
    return loss, sim


def stacked_layers(plan: list[tuple[str, Any]] | None) -> tuple[float, list[str]] | None:
    """(slope, the linear layers' names) of a stacked FFNN's plan (``corel.train.stacked._mlp_plan``)
    that :func:`stacked_gaussian_mlp_step` can take: Flatten, then (Linear, LeakyReLU) pairs
    with one slope; None otherwise."""
    if not plan or plan[0][0] != "flatten" or len(plan) % 2 != 1:
        return None
    pairs = list(zip(plan[1::2], plan[2::2], strict=True))
    if any(a[0] != "linear" or b[0] != "leaky_relu" for a, b in pairs):
        return None
    slopes = {float(b[1]) for _, b in pairs}
    if len(slopes) != 1:
        return None
    return next(iter(slopes)), [a[1] for a, _ in pairs]


def stacked_gaussian_mlp_step(
    layout: tuple[float, list[str]] | None, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer, lam: torch.Tensor, one_minus_lam: torch.Tensor,
    x: torch.Tensor, y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One Adam step of a stack of Gaussian-COREL FFNNs (:class:`corel.train.stacked.StackedRun`'s
    ``params``, ``buffers``, ``optimizer`` and per-member ``lam``, ``one_minus_lam`` (M,)) on
    shared inputs x (N, ...) and labels y (N,), or each member's (M, N, ...) and (M, N), as
    one native call: (losses (M,), similarities (M, N, K)), bit for bit the autograd step's;
    None where that should run. ``layout``: :func:`stacked_layers` of the run's plan."""
    native = _native.module()
    if native is None or layout is None or not isinstance(optimizer, FusedAdam) or "head.log_gamma" in params:
        return None
    slope, names = layout
    layers = [params[f"{name}.{kind}"] for name in names for kind in ("weight", "bias")]
    W = params["head.W"]
    if (y.numel() == 0 or x.device.type != "cpu" or x.dtype != W.dtype
            or not plain_autograd(x) or _hooked(None, [*layers, W])):
        return None
    adam = _adam_arguments(optimizer, [*layers, W])
    if adam is None:
        return None
    gamma = buffers["head.fixed_gamma"].to(W.dtype).view(-1, 1, 1)
    loss, sim = native.stacked_gaussian_mlp_step(x, y, slope, layers, W, gamma, lam.unsqueeze(1),
                                                 one_minus_lam.unsqueeze(1), *adam)
    return loss, sim


def _adam_arguments(optimizer: FusedAdam, tensors: list[torch.Tensor]) -> list[Any] | None:
    """The native steps' Adam arguments (moments, steps, lr, betas, eps) where the
    optimiser's next step may be lean (:meth:`FusedAdam.lean_state`) and its parameters
    are exactly ``tensors``, in that order, with a float lr; None otherwise."""
    state = optimizer.lean_state()
    if state is None:
        return None
    params, exp_avgs, exp_avg_sqs, steps = state
    if len(params) != len(tensors) or any(a is not b for a, b in zip(params, tensors, strict=True)):
        return None  # the optimiser holds other tensors, or these in another order
    group = optimizer.param_groups[0]
    if not isinstance(group["lr"], float):
        return None  # a tensor lr takes torch's other kernel
    beta1, beta2 = group["betas"]
    return [exp_avgs, exp_avg_sqs, steps, float(group["lr"]), float(beta1), float(beta2), float(group["eps"])]


def _hooked(encoder: torch.nn.Module | None, params: list[torch.Tensor]) -> bool:
    """Whether anything would watch the autograd step that this one skips: the encoder's
    forward hooks (its call is replaced), global module hooks, the parameters' gradient
    hooks, or a parameter that takes no gradient; a head whose ``after_batch`` does
    something (Gaussian-COREL's does nothing); or autograd's anomaly mode, which checks
    each backward node's output."""
    if torch.is_anomaly_enabled():
        return True
    if encoder is not None and (encoder._forward_hooks or encoder._forward_pre_hooks):
        return True
    if (torch_module._global_forward_hooks
            or torch_module._global_forward_pre_hooks or GaussianCOREL.after_batch is not LossHead.after_batch):
        return True
    return any(not p.requires_grad or p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None)
               for p in params)
