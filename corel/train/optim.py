"""Adam, the paper's optimiser, as torch's fused kernel without the per-step Python around it.

``torch.optim.Adam(fused=True)`` spends more time in ``Optimizer.step``'s Python (hooks,
profiler records, regrouping the tensors by device and dtype, the state look-ups of
``_init_group``) than in its one kernel when the model is as small as the paper's FFNN.
:class:`FusedAdam` is that optimiser, with the same state, ``state_dict`` and kernel: its
``step`` hands the same lists to the same ``torch._fused_adam_`` call once every parameter
has its state, so the weights and moments it leaves are bit for bit those of
``torch.optim.Adam(fused=True)`` (``tests/corel/test_fused.py``). The first step (which
creates the state), and anything unusual (a closure, step hooks, a profiler recording,
several groups, AMSGrad, weight decay, a parameter without a gradient), go through
``torch.optim.Adam.step``, with torch's profiler record and hooks.
Its ``zero_grad`` sets the gradients to None as torch's does, without the bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer

__all__ = ["FusedAdam", "adam", "step_together"]


class FusedAdam(torch.optim.Adam):
    """``torch.optim.Adam(params, lr, fused=True)`` with a lean ``step`` (see the module)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float) -> None:
        super().__init__(params, lr=lr, fused=True)

    def lean_state(self) -> tuple[list[torch.Tensor], ...] | None:
        """(params, exp_avgs, exp_avg_sqs, steps) where the next step may take the fused
        kernel straight away: one group without hooks, AMSGrad, weight decay, maximize or
        differentiable, every parameter with its state (after the first step), on one
        device and dtype, and no global hook or profiler recording; None otherwise. The
        gradients are not looked at (:meth:`step` checks them; :mod:`corel.train.native_step` makes
        them)."""
        if (len(self.param_groups) != 1 or self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks
                or _global_hooks() or torch.autograd._profiler_enabled()):
            return None
        group = self.param_groups[0]
        if group["amsgrad"] or group["weight_decay"] or group["maximize"] or group["differentiable"]:
            return None
        params: list[torch.Tensor] = group["params"]
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = self.state.get(p)
            if not state:
                return None
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if len({(p.device, p.dtype) for p in params}) != 1:
            return None  # torch groups them by device and dtype; one kernel call each
        return params, exp_avgs, exp_avg_sqs, steps

    def _lean_lists(self) -> tuple[list[torch.Tensor], ...] | None:
        lists = self.lean_state()
        if lists is None:
            return None
        params, exp_avgs, exp_avg_sqs, steps = lists
        grads = [p.grad for p in params]
        if any(g is None or g.is_sparse for g in grads):
            return None
        return params, grads, exp_avgs, exp_avg_sqs, steps  # type: ignore[return-value]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``set_to_none=True`` (the default): every gradient to None, without the profiler
        record and the per-device grouping of torch's (15 us of a 0.8 ms FFNN step)."""
        if not set_to_none or not hasattr(self, "_zero_grad_profile_name"):
            super().zero_grad(set_to_none)
            return
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Adam's step. With no hooks (global or this optimiser's) and no profiler
        recording, the fused kernel straight away; otherwise torch's step, with its
        profiler record and hooks."""
        lists = self._lean_lists() if closure is None else None
        if lists is None:
            return self._torch_step(closure)
        _fused_step(self.param_groups[0], *lists)
        return None

    # torch wraps an optimiser class's step in its profiler record and hook loop (11 us of
    # Python a step even with neither); this one does both itself (above), so it is marked
    # as wrapped already.
    step.hooked = True  # type: ignore[attr-defined]

    def _torch_step(self, closure: Callable[[], float] | None) -> Any:
        """torch.optim.Adam.step with torch's profiler record and hooks around it."""
        plain = torch.optim.Adam.step
        if getattr(plain, "hooked", False):  # a plain Adam made before wrapped it already
            return plain(self, closure)
        return torch.optim.Optimizer.profile_hook_step(plain)(self, closure)


def _fused_step(group: dict[str, Any], params: list[torch.Tensor], grads: list[torch.Tensor],
                exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor], steps: list[torch.Tensor]) -> None:
    """What torch.optim.adam._fused_adam does for one device and dtype, with ``group``'s
    lr, betas and eps."""
    beta1, beta2 = group["betas"]
    with torch.no_grad():
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(
            params, grads, exp_avgs, exp_avg_sqs, [], steps,
            amsgrad=False, lr=group["lr"], beta1=float(beta1), beta2=float(beta2),
            weight_decay=0.0, eps=group["eps"], maximize=False, grad_scale=None, found_inf=None,
        )


def step_together(optimizers: Sequence[torch.optim.Optimizer]) -> bool:
    """Each of ``optimizers``' steps, as one fused kernel call over all their tensors (the
    kernel updates each tensor by itself: the same numbers as their steps one by one), where
    every one is a :class:`FusedAdam` whose step may be lean and they share lr, betas, eps,
    device and dtype; False, with nothing done, otherwise (each then steps by itself)."""
    lists = []
    for optimizer in optimizers:
        lean = optimizer._lean_lists() if isinstance(optimizer, FusedAdam) else None
        if lean is None:
            return False
        lists.append(lean)
    groups = [optimizer.param_groups[0] for optimizer in optimizers]
    first = groups[0]
    if not isinstance(first["lr"], float) or any(
            (g["lr"], tuple(g["betas"]), g["eps"]) != (first["lr"], tuple(first["betas"]), first["eps"])
            for g in groups):
        return False
    if len({(p.device, p.dtype) for lean in lists for p in lean[0]}) != 1:
        return False
    _fused_step(first, *([t for lean in lists for t in lean[k]] for k in range(5)))
    return True


def _global_hooks() -> bool:
    """Whether any step hook is registered for every optimiser
    (``torch.optim.optimizer.register_optimizer_step_pre_hook`` and its post twin)."""
    return bool(getattr(torch_optimizer, "_global_optimizer_pre_hooks", None)
                or getattr(torch_optimizer, "_global_optimizer_post_hooks", None))


def adam(params: Iterable[torch.Tensor], lr: float) -> torch.optim.Adam:
    """Adam (the paper's optimiser) with lr ``lr``: :class:`FusedAdam` where torch has the
    fused kernel for these tensors, else the plain ``torch.optim.Adam``."""
    tensors = list(params)
    try:
        return FusedAdam(tensors, lr)
    except (RuntimeError, ValueError):
        return torch.optim.Adam(tensors, lr=lr)
