"""A whole training step in one compiled call, where :mod:`corel.native` covers it.

The paper's FFNN with the product's default head (Gaussian-COREL, gamma fixed) and Adam:
:func:`gaussian_mlp_step` runs the forward pass, the loss, the backward pass and Adam's
update as one C++ call (``gaussian_mlp_step`` in ``corel/native/fused.cpp``), which makes
the ATen calls that ``loss.backward()`` and :class:`corel.optim.FusedAdam` make on the
fused nodes of :mod:`corel.fused`, in their order, without building an autograd graph.
So the weights, gradients, moments, loss and similarities it leaves are bit for bit the
autograd step's (``tests/corel/test_step.py``); it saves the graph's bookkeeping and the
step's Python (on a 2-core CPU, a good share of a 1 ms step).

It returns None wherever the autograd step should run instead: no native build, another
encoder or head, a learned gamma, a frozen parameter, hooks on the encoder or the
parameters, an optimiser other than a lean :class:`~corel.optim.FusedAdam` (its first
step, which creates the state, included), bf16, and where :mod:`corel.fused` would not
fuse either (no gradients, ``torch.func`` transforms, traces, export, autocast).
"""

from __future__ import annotations

import torch
from torch.nn.modules import module as torch_module

from corel import native as _native
from corel.fused import _plain_autograd
from corel.losses import GaussianCOREL, LossHead, check_labels
from corel.models import FFNN, Classifier
from corel.optim import FusedAdam

__all__ = ["gaussian_mlp_step"]


def gaussian_mlp_step(
    model: Classifier, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *, check: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One Adam step of ``model`` on the batch (x, y) as one native call: (loss,
    similarities), as :func:`corel.training._step` returns them; or None where the autograd
    step should run (see the module). ``check``: validate the labels first."""
    native = _native.module()
    if native is None or not isinstance(optimizer, FusedAdam):
        return None
    encoder, head = model.encoder, model.head
    if type(encoder) is not FFNN or encoder._fused is None or type(head) is not GaussianCOREL or head.learn_gamma:
        return None
    slope, linears = encoder._fused
    layers = [t for m in linears for t in (m.weight, m.bias)]
    W = head.W
    if (x.shape[0] == 0 or x.device.type != "cpu" or x.dtype != W.dtype or x.device != W.device or not _plain_autograd(x)
            or _hooked(encoder, [*layers, W])):
        return None
    state = optimizer.lean_state()
    if state is None:
        return None
    params, exp_avgs, exp_avg_sqs, steps = state
    if len(params) != len(layers) + 1 or any(a is not b for a, b in zip(params, [*layers, W], strict=False)):
        return None  # the optimiser holds other tensors, or these in another order
    group = optimizer.param_groups[0]
    if not isinstance(group["lr"], float):
        return None  # a tensor lr takes torch's other kernel
    if check:
        check_labels(y, x.shape[0], head.num_classes)
    beta1, beta2 = group["betas"]
    loss, sim = native.gaussian_mlp_step(
        x.flatten(1), y, slope, layers, W, head.fixed_gamma, head.lam, 1.0 - head.lam,
        exp_avgs, exp_avg_sqs, steps, float(group["lr"]), float(beta1), float(beta2), float(group["eps"]))
    return loss, sim


def _hooked(encoder: torch.nn.Module, params: list[torch.Tensor]) -> bool:
    """Whether anything would watch the autograd step that this one skips: the encoder's
    forward hooks (its call is replaced), global module hooks, the parameters' gradient
    hooks, or a parameter that takes no gradient; or a head whose ``after_batch`` does
    something (Gaussian-COREL's does nothing)."""
    if (encoder._forward_hooks or encoder._forward_pre_hooks or torch_module._global_forward_hooks
            or torch_module._global_forward_pre_hooks or GaussianCOREL.after_batch is not LossHead.after_batch):
        return True
    return any(not p.requires_grad or p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None)
               for p in params)
