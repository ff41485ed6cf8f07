"""Which step a training pass takes: decided here, once, for both loops.

A step is one Adam step on one batch: forward, loss, backward, update (and a head's buffer
update: Center loss's centroids). Each of the ways below answers "not here" where it does
not apply, and the step goes on to the next:

1. **A CUDA graph's replay** (:mod:`.graphs`): the pass's mode is :func:`pass_mode`, from the
   run's :class:`~corel.train.options.EngineOptions`; ``capture`` on a CUDA device with the
   training data held there (inputs crossing from the host a batch at a time cannot be
   recorded). The graph replays the step below, recorded once.
2. **One native call** (:mod:`.native_step`): a Gaussian-COREL FFNN with a fixed gamma in the
   fp32 precision on a CPU, where ``corel.native`` is built and the options leave it on,
   with the lean Adam; it returns None anywhere else (its module lists where).
3. **Autograd over the fused nodes**: ``loss.backward()`` and ``optimizer.step()``; the FFNN's
   forward and Gaussian-COREL's loss are each one node of :mod:`corel.fused` where
   :func:`corel.fused.plain_autograd` holds (native or Python nodes, the same numbers), and
   plain PyTorch operations otherwise (no gradients, ``torch.func`` transforms, autocast).

:func:`solo_step` is a solo run's step (2, else 3) and :func:`stacked_step` a stacked
group's (2, else the group's own autograd step, 3); the loops ask :func:`pass_mode` and
:func:`graphed_steps` whether their passes go through 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from corel.device import autocast
from corel.models import Classifier
from corel.train.graphs import GraphedSteps
from corel.train.native_step import gaussian_mlp_step, stacked_gaussian_mlp_step, stacked_layers
from corel.train.options import EngineOptions, GraphMode

if TYPE_CHECKING:
    from corel.train.stacked import StackedRun

__all__ = ["forward_loss", "graphed_steps", "pass_mode", "solo_step", "stacked_native_layout", "stacked_step"]

Result = tuple[torch.Tensor, torch.Tensor]


def pass_mode(options: EngineOptions, device: torch.device, x: torch.Tensor) -> GraphMode:
    """How a pass on ``device`` over training inputs ``x`` takes its steps: ``capture`` (a
    CUDA graph), ``eager`` (the graphed path without capture, on any device: tests) or
    ``off`` (the plain loop)."""
    if options.cuda_graphs == "eager":
        return "eager"
    if options.cuda_graphs == "capture" and device.type == "cuda" and x.device.type == "cuda":
        return "capture"
    return "off"


def graphed_steps(
    mode: GraphMode, held: GraphedSteps | None, step: Callable[[torch.Tensor], Result],
) -> GraphedSteps | None:
    """The run's :class:`GraphedSteps` for a pass in ``mode``: the one it ``held`` (a graph
    lives across passes), else a new one over ``step(idx)``; None for the plain loop."""
    if mode == "off":
        return None
    return held if held is not None else GraphedSteps(step, capture=mode == "capture")


def forward_loss(
    model: Classifier, x: torch.Tensor, y: torch.Tensor, *, check: bool = True,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, h, similarities) of a batch in the run's precision: for bf16 the encoder
    and the similarities under bfloat16 autocast, the loss (its reductions) in float32
    from their float32 casts; for fp32 ``model.loss``."""
    if precision == "fp32":
        return model.loss(x, y, check=check)
    device = x.device
    with autocast(device, precision):
        h = model.encoder(x)
        sim = model.head.similarities(h)
    h, sim = h.float(), sim.float()
    return model.head.loss(sim, h, y, check=check), h, sim


def solo_step(
    model: Classifier, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
    *, check: bool, precision: str = "fp32",
) -> Result:
    """One step of a solo run: (loss, the similarities it was computed from, before the
    step), detached on the model's device. One native call where it covers the step, else
    autograd over :func:`forward_loss`."""
    optimizer.zero_grad(set_to_none=True)
    if precision == "fp32":
        done = gaussian_mlp_step(model, optimizer, x, y, check=check)
        if done is not None:
            return done
    loss, h, sim = forward_loss(model, x, y, check=check, precision=precision)
    loss.backward()
    optimizer.step()
    model.head.after_batch(h.detach(), y)
    return loss.detach(), sim.detach()


def stacked_native_layout(loss_name: str, precision: str,
                          plan: list[tuple[str, Any]] | None) -> tuple[float, list[str]] | None:
    """What the native stacked step needs of a group (:func:`.native_step.stacked_layers`),
    or None where it never applies: a loss other than Gaussian-COREL, or bf16."""
    if loss_name != "gaussian" or precision != "fp32":
        return None
    return stacked_layers(plan)


def stacked_step(group: StackedRun, xb: torch.Tensor, yb: torch.Tensor, per_member: bool) -> Result:
    """One step of every member of ``group``: (losses (M,), similarities), detached. One
    native call where it covers the step, else the group's autograd step."""
    group.optimizer.zero_grad(set_to_none=True)
    done = stacked_gaussian_mlp_step(group.native_layout, group.params, group.buffers, group.optimizer,
                                     group.lam, group.one_minus_lam, xb, yb)
    if done is not None:
        return done
    return group.autograd_step(xb, yb, per_member)
