"""A group of specs that differ only in loss parameters and seed, as one stacked model.

A sweep over lambda (or gamma, or alpha) trains many runs with the same data,
model, batch size, lr and seed: the same initial weights, the same batches in the
same order. :class:`StackedRun` trains such a group at once:

* the members' tensors are stacked on a leading member axis
  (``torch.func.stack_module_state``);
* one forward pass runs every member on the shared batch: the FFNN as batched
  matrix products, other encoders under ``torch.vmap(functional_call(...))``,
  and the heads' similarities and losses (the functions of :mod:`corel.similarity`
  and :mod:`corel.losses`) under ``torch.vmap`` with per-member lam/gamma/alpha and the
  per-member options of pytorch-metric-learning's losses (margin, scale, ...); a pair-based
  loss's class means (what it predicts with) are set member by member after each epoch;
* the members' losses are summed before ``backward``, which hands every member
  exactly the gradient of its own loss;
* one Adam over the stacked tensors is, element for element, M Adams with the
  same lr; Center loss moves each member's centers with its own alpha.

Members may also differ in seed (the paper's protocol repeats every row with 3 seeds):
a seed gives a member its own initial weights, which stacking keeps anyway, and its own
batch order. The group then draws one data order per distinct seed (a *stream*); each
member trains on its stream's batches, gathered into an (M, N, ...) input, and the FFNN's
first layer becomes a batched product. Members of one seed still share their batches.

So member i ends as ``corel.train.solo.fit(spec_i)`` would have left it, up to
floating-point rounding: stacked matrix products, and the batched cross-entropy's
mean, may round differently from single ones, and differently again with another
CPU's kernels. Training amplifies that as it amplifies any rounding: over ~300 float32
Adam steps a one-ulp difference can reach ~1e-3, and Gaussian-COREL at lam < 0.5
(float32: lam <= 0.5) is chaotic, so a solo run whose first layer is nudged by one
ulp drifts ~1e-3 away within a few epochs even in float64. To check the equivalence
itself, train in float64 (``fit_group(specs, data=data.astype(torch.float64))``): at
lam >= 0.5 members then agree with their solo runs to 1e-13 or better on any CPU.

:meth:`StackedRun.member_run` hands member i back as an ordinary
:class:`corel.train.solo.Run`; its checkpoint is what the solo run would have
written, and ``fit(spec_i, checkpoint=...)`` resumes it alone.

Models with dropout (the paper's text models) stack too: each member draws its masks from
its own stream (:func:`corel.encoders.paper.dropout_generator`, seeded by its seed), as its solo
run does; the FFNN's as batched products still (each member's masks drawn in turn, of its solo
run's shape), the Text CNN's member by member. ``learn_gamma`` is supported (gamma is then a
stacked parameter).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state

from corel import losses, similarity
from corel.clustering import default_metric
from corel.data import Dataset, load_dataset
from corel.device import (
    Batches,
    autocast,
    effective_precision,
    ieee_float32,
    pick_device,
    to_device,
)
from corel.encoders.paper import FFNN, StreamDropout, dropout_generator, dropout_stream, has_dropout
from corel.fused import gaussian_ar, shared_linear
from corel.loss_catalog import declaration
from corel.losses import check_labels, class_counts
from corel.losses.peers import class_means
from corel.models import Classifier
from corel.spec import ExperimentSpec
from corel.train.callbacks import EpochMetrics, GroupCallback
from corel.train.checkpoints import (
    check_resumable,
    check_same_encoder,
    cpu_state,
    optimizer_state,
    recorded_features,
    restore_rng,
)
from corel.train.graphs import GraphedSteps
from corel.train.grouping import MAX_GROUP, MAY_DIFFER, as_spec, check_group, group_specs
from corel.train.guards import CHANCE_EPOCHS, GroupChanceGuard, chance_accuracy
from corel.train.lockstep import lockstep_epoch, lockstep_key
from corel.train.optim import adam
from corel.train.options import EngineOptions
from corel.train.pruning import Prune, configuration, keep, map_at_r
from corel.train.record import Record
from corel.train.solo import EVAL_BATCH, FitResult, Run, build_model, make_optimizer, pass_totals
from corel.train.steps import graphed_steps, pass_mode, stacked_native_layout, stacked_step

__all__ = ["StackedRun", "fit_group"]

_ADAM_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

# Where encoders other than the FFNN run member by member rather than under vmap. On a CPU,
# vmap's convolutions of M members (grouped convolutions) took 1.3-1.5x as long as the M
# members' own (a 3-member CNN group on Fashion-MNIST, 2-core AMD EPYC: 0.64-0.77x the speed
# of its runs one after another, 0.91-1.04x member by member); on a GPU one grouped kernel
# stands for M launches.
ENCODER_LOOP_DEVICES = ("cpu",)

Tensors = dict[str, torch.Tensor]


def _center_update(
    centers: torch.Tensor, h: torch.Tensor, labels: torch.Tensor, alpha: torch.Tensor
) -> torch.Tensor:
    """Wen et al.'s centroid step (Eq. 4), as :meth:`corel.losses.CenterLoss.after_batch`.

    mu_j <- mu_j - alpha * sum_{i: y_i = j} (mu_j - h_i) / (1 + n_j), returned, not in place.
    """
    h = h.to(centers.dtype)
    counts = class_counts(labels, centers.shape[0], h.dtype)
    sums = torch.zeros_like(centers).index_add(0, labels, h)
    delta = (counts.unsqueeze(1) * centers - sums) / (1.0 + counts).unsqueeze(1)
    return centers - alpha * delta


def _mlp_plan(encoder: nn.Module) -> list[tuple[str, Any]] | None:
    """The FFNN's layers as steps for :func:`_mlp_forward`; None for any other encoder."""
    if not isinstance(encoder, FFNN):
        return None
    plan: list[tuple[str, Any]] = []
    for name, layer in encoder.net.named_children():
        if isinstance(layer, nn.Flatten) and (layer.start_dim, layer.end_dim) == (1, -1):
            plan.append(("flatten", None))
        elif isinstance(layer, nn.Linear) and layer.bias is not None:
            plan.append(("linear", f"encoder.net.{name}"))
        elif isinstance(layer, nn.LeakyReLU):
            plan.append(("leaky_relu", layer.negative_slope))
        elif type(layer) is StreamDropout:  # the paper's text models: each member's own masks
            if layer.p > 0:
                plan.append(("dropout", float(layer.p)))
        else:  # anything new: the generic vmap path
            return None
    if not any(kind == "linear" for kind, _ in plan):
        return None
    return plan


def _mlp_forward(plan: list[tuple[str, Any]], params: Tensors, x: torch.Tensor,
                 shared: bool = True, streams: Sequence[torch.Generator] | None = None) -> torch.Tensor:
    """M stacked FFNNs on shared inputs x (N, ...), or on each member's own inputs x
    (M, N, ...) where ``shared`` is False, -> (M, N, out) with batched matrix products.

    The same function as ``vmap(functional_call(ffnn))``, arranged for speed: the first
    layer, whose input all members share, is :func:`corel.fused.shared_linear` (one
    ``baddbmm``, its weight gradient one product in the stacked parameter's own layout).
    Dropout (training): member i's masks drawn from ``streams[i]``, each of its solo run's
    shape, in its solo run's order, and applied as :class:`StreamDropout` applies them, so
    each member's inputs are its solo run's; no ``streams`` (evaluation): none.
    """
    # shared: x is the members' common input until the first linear layer (or dropout)
    for kind, arg in plan:
        if kind == "flatten":
            x = x.flatten(1 if shared else 2)
        elif kind == "dropout":
            if streams is None:
                continue
            rows = [x] * len(streams) if shared else x.unbind(0)
            keep = torch.stack([torch.empty_like(r).bernoulli_(1.0 - arg, generator=g)
                                for r, g in zip(rows, streams, strict=True)])
            x, shared = (x.unsqueeze(0) if shared else x) * keep * (1.0 / (1.0 - arg)), False
        elif kind == "linear":
            W, b = params[f"{arg}.weight"], params[f"{arg}.bias"]
            if shared:
                x, shared = shared_linear(x, W, b), False
            else:
                x = torch.baddbmm(b.unsqueeze(1), x, W.transpose(1, 2))
        else:
            x = F.leaky_relu(x, arg)
    return x


class StackedRun:
    """M members, differing only in lam/gamma/alpha, trained together.

    Build one with :meth:`start`. ``params`` and ``buffers`` hold every member's tensors stacked on a leading
    axis of size M, under the names of ``Classifier.state_dict()``; ``optimizer``
    is one Adam over ``params``. Each member's bookkeeping (history, best epoch, best
    weights, test accuracy) is a :class:`corel.train.record.Record`, as a solo run's is.
    """

    def __init__(
        self,
        specs: list[ExperimentSpec],
        data: Dataset,
        members: list[Classifier],
        device: torch.device,
        options: EngineOptions | None = None,
    ) -> None:
        self.specs = specs
        self.options = options or EngineOptions()
        self.data = data
        self.device = device
        self.members = members
        self.loss_name = specs[0].loss
        self.precision = effective_precision(device, specs[0].precision)
        # One data order per distinct seed (a stream); member i draws stream_of[i]'s batches.
        seeds = list(dict.fromkeys(s.seed for s in specs))
        self.shuffles = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.stream_of = [seeds.index(s.seed) for s in specs]
        self._stream_index = torch.tensor(self.stream_of, device=device)
        self.epoch = 0
        # One record per member: its history and best epoch, as a solo run keeps them.
        self.records = [Record(keep_last=spec.fewshot is not None) for spec in specs]
        # Members that failed to learn (index: why), marked by corel.train.guards.GroupChanceGuard.
        self.failed: dict[int, str] = {}
        # The training step as a CUDA graph, made on the first pass that takes one.
        self._graphed: GraphedSteps | None = None

        params, buffers = stack_module_state(members)
        self.params: Tensors = params
        self.buffers: Tensors = buffers
        self.optimizer = adam(self.params.values(), specs[0].lr)
        dtype = self._class_vectors(self.params, self.buffers).dtype

        def per_member(values: list[float]) -> torch.Tensor:
            # Rounded from double once, as a Python float is when it meets a float32 tensor.
            return torch.tensor(values, dtype=torch.float64).to(device=device, dtype=dtype)

        self.lam = per_member([s.lam for s in specs])
        self.one_minus_lam = per_member([1.0 - s.lam for s in specs])
        self.alpha = per_member([s.alpha for s in specs])
        # The head's own options (margin, scale, ...), as its functional loss reads them: the
        # numbers per member, the names (the triplet miner) one for the group (group_key).
        head = losses.LOSSES[self.loss_name]
        own = [head.functional_options(m.head.option_values()) for m in members]
        self.loss_choices = {k: v for k, v in own[0].items() if isinstance(v, str)}
        self.loss_options: Tensors = {k: per_member([float(o[k]) for o in own])
                                      for k in own[0] if k not in self.loss_choices}
        # The skeleton functional_call runs with; only its structure is used.
        self._template = members[0]
        self._state_keys = list(self._template.state_dict())
        self._mlp = _mlp_plan(self._template.encoder)
        # Each member's dropout stream, as its solo run draws its masks (None: no dropout).
        self.dropouts = ([dropout_generator(s.seed, device) for s in specs]
                         if has_dropout(self._template) else None)
        # What the step as one native call needs (corel.train.steps decides when it runs).
        self.native_layout = stacked_native_layout(self.loss_name, self.precision, self._mlp)
        self._vmapped_encoder = torch.vmap(self._member_encode, in_dims=(0, 0, None))
        self._vmapped_loss = torch.vmap(self._member_loss, in_dims=(0, 0, 0, 0, 0, 0, None))
        self._vmapped_predict = torch.vmap(self._member_predict, in_dims=(0, 0, 0))
        self._vmapped_center_update = torch.vmap(_center_update, in_dims=(0, 0, None, 0))
        # The same, where each member has its own inputs and labels (several seeds).
        self._vmapped_encoder_each = torch.vmap(self._member_encode, in_dims=(0, 0, 0))
        self._vmapped_loss_each = torch.vmap(self._member_loss, in_dims=(0, 0, 0, 0, 0, 0, 0))
        self._vmapped_center_update_each = torch.vmap(_center_update, in_dims=(0, 0, 0, 0))

    # ----------------------------------------------------------------------------------
    # Construction

    @classmethod
    def start(
        cls,
        specs: Sequence[ExperimentSpec | dict[str, Any]],
        data: Dataset,
        device: str | torch.device | None = None,
        checkpoints: Sequence[dict[str, Any]] | None = None,
        options: EngineOptions | None = None,
    ) -> StackedRun:
        """Build the group fresh, or resumed from one checkpoint per member.

        Each member's classifier is built exactly as :func:`corel.train.solo.start_run`
        builds it (``torch.manual_seed(spec.seed)``, then ``build_model``), then
        the members are stacked. ``checkpoints[i]`` is what ``Run.checkpoint()`` (or
        ``member_run(i).checkpoint()``) wrote for ``specs[i]``, all at the same epoch.
        """
        group = [as_spec(s) for s in specs]
        check_group(group)
        if checkpoints is not None:
            _check_checkpoints(group, checkpoints)
            for i, ckpt in enumerate(checkpoints):
                check_same_encoder(ckpt, data.preprocessing, f"checkpoint {i}")
        dev = pick_device(device)
        data = to_device(data, dev)
        members = []
        for i, spec in enumerate(group):
            torch.manual_seed(spec.seed)
            model = build_model(spec, data, dev)
            if checkpoints is not None:
                model.load_state_dict(checkpoints[i]["model"])
            members.append(model)
        run = cls(group, data, members, dev, options)
        if checkpoints is not None:
            run._restore(checkpoints)
        return run

    def _restore(self, checkpoints: Sequence[dict[str, Any]]) -> None:
        first = checkpoints[0]
        saved = [c["optimizer"] for c in checkpoints]
        # The moments stacked (new tensors); the rest (the step) copied from the first.
        own = optimizer_state(first["optimizer"])
        state: dict[int, dict[str, Any]] = {}
        for index, entry in own["state"].items():
            state[index] = {
                name: torch.stack([s["state"][index][name] for s in saved])
                if name in _ADAM_MOMENTS
                else value
                for name, value in entry.items()
            }
        self.optimizer.load_state_dict({"state": state, "param_groups": own["param_groups"]})
        self.epoch = int(first["epoch"])
        self.records = [Record.from_checkpoint(ckpt, keep_last=spec.fewshot is not None)
                        for ckpt, spec in zip(checkpoints, self.specs, strict=True)]
        for stream, shuffle in enumerate(self.shuffles):
            restore_rng(checkpoints[self.stream_of.index(stream)], shuffle, self.device)
        for dropout, ckpt in zip(self.dropouts or (), checkpoints, strict=False):
            if "dropout" in ckpt["rng"]:
                dropout.set_state(ckpt["rng"]["dropout"])

    @property
    def histories(self) -> list[list[EpochMetrics]]:
        """Every member's epochs so far."""
        return [r.history for r in self.records]

    @property
    def size(self) -> int:
        """The number of members M."""
        return len(self.specs)

    @property
    def uses_class_means(self) -> bool:
        """Whether the members' loss predicts with class means (:meth:`set_class_means`)."""
        return losses.LOSSES[self.loss_name].uses_class_means

    @property
    def epochs(self) -> int:
        """Epochs to train (the same for every member)."""
        return self.specs[0].epochs

    # ----------------------------------------------------------------------------------
    # One member's math, vmapped over the member axis

    def _gamma(self, params: Tensors, buffers: Tensors, dtype: torch.dtype) -> torch.Tensor:
        if "head.log_gamma" in params:
            return params["head.log_gamma"].exp().to(dtype)
        return buffers["head.fixed_gamma"].to(dtype)

    @staticmethod
    def _class_vectors(params: Tensors, buffers: Tensors) -> torch.Tensor:
        """The head's W: a parameter, or a buffer where the loop sets it (class means)."""
        return params["head.W"] if "head.W" in params else buffers["head.W"]

    def _similarities(self, params: Tensors, buffers: Tensors, h: torch.Tensor) -> torch.Tensor:
        """The head's s(h, w_k), as the loss head's ``similarities`` computes it: of one
        member under vmap (h (N, H)), or of every member at once (h (M, N, H))."""
        W = self._class_vectors(params, buffers)
        kind = declaration(self.loss_name).similarity
        stacked = h.dim() == 3
        if kind == "dot":  # the dot-product heads (CCE's) carry a bias
            bias = params["head.bias"]
            return similarity.dot(h, W) + (bias.unsqueeze(-2) if stacked else bias)
        if kind == "cosine":
            return similarity.cosine(h, W)
        # s_gau(h, w; gamma) = gamma * s_gau(h, w; 1): gamma is a per-member tensor here,
        # which similarity.gaussian's range check cannot look at under vmap. Both sides
        # round the same product, so this is bit for bit the head's value.
        gamma = self._gamma(params, buffers, h.dtype)
        return (gamma.view(-1, 1, 1) if stacked else gamma) * similarity.gaussian(h, W, 1.0)

    def _member_encode(self, params: Tensors, buffers: Tensors, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(self._template, {**params, **buffers}, (x,))
        return out

    def _member_loss(
        self,
        params: Tensors,
        buffers: Tensors,
        lam: torch.Tensor,
        one_minus_lam: torch.Tensor,
        options: Tensors,
        h: torch.Tensor,
        y: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, similarities) of one member from its representations h, as ``Classifier.loss``;
        or of every member at once, where the head's functional form takes a stack."""
        if self.loss_name == "gaussian" and self.precision == "fp32" and h.dim() == 3:
            # The stack as one fused node, as GaussianCOREL.loss_and_similarities does.
            gamma = self._gamma(params, buffers, h.dtype).view(-1, 1, 1)
            fused = gaussian_ar(h, params["head.W"], gamma, y, lam, one_minus_lam)
            if fused is not None:
                return fused
        with autocast(self.device, self.precision):  # bf16: as corel.train.solo.forward_loss
            sim = self._similarities(params, buffers, h)
        if self.precision != "fp32":
            h, sim = h.float(), sim.float()
        # The head's own functional form, as its loss() computes it.
        state: dict[str, Any] = {name.removeprefix("head."): t for name, t in buffers.items()
                                 if name.startswith("head.")}
        state.update(options)  # the member's own options (0-d under vmap) and the group's names
        state.update(self.loss_choices)
        loss = losses.LOSSES[self.loss_name].functional_loss(sim, h, y, lam, one_minus_lam, state)
        return loss, sim

    def _stacked_loss(self, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(losses (M,), similarities (M, N, K)) of every member at once, from labels y
        shared (N,) or each member's own (M, N): the head's own functional form on the
        stack, for heads that take one (``stacks_without_vmap``); what
        ``vmap(_member_loss)`` computes, without vmap's per-operation cost."""
        if not losses.LOSSES[self.loss_name].stacks_without_vmap:
            vmapped = self._vmapped_loss if y.dim() == 1 else self._vmapped_loss_each
            return vmapped(self.params, self.buffers, self.lam, self.one_minus_lam, self.loss_options, h, y)
        # The same member function, given the whole stack (h (M, N, H), lambdas (M, 1)).
        return self._member_loss(self.params, self.buffers, self.lam.unsqueeze(1),
                                 self.one_minus_lam.unsqueeze(1),
                                 {k: v.unsqueeze(1) for k, v in self.loss_options.items()}, h, y)

    def _member_predict(self, params: Tensors, buffers: Tensors, h: torch.Tensor) -> torch.Tensor:
        return self._similarities(params, buffers, h).argmax(dim=1)

    # ----------------------------------------------------------------------------------
    # Training and evaluation

    def encode(self, x: torch.Tensor, per_member: bool = False) -> torch.Tensor:
        """Every member's representations of the shared inputs x (N, ...), or of each
        member's own inputs x (M, N, ...) where ``per_member``: (M, N, hidden).

        The FFNN runs as batched matrix products (its first layer, on shared inputs, as one
        product for all members); other encoders run under ``vmap``, or member by member on
        the devices of :data:`ENCODER_LOOP_DEVICES`.
        """
        if self._mlp is not None:
            return self.encode_stack(self.params, x, per_member, self.training_streams())
        if self.device.type in ENCODER_LOOP_DEVICES or self.dropouts is not None:
            # Each member's own slices (unbind: one node, whose backward stacks the
            # gradients), so each member's encoder makes its solo run's calls.
            params = {k: v.unbind(0) for k, v in self.params.items()}
            buffers = {k: v.unbind(0) for k, v in self.buffers.items()}
            # With dropout, each member draws its masks from its own stream, as alone.
            streams: list[torch.Generator | None] = [None] * self.size
            if self.dropouts is not None:
                streams = list(self.dropouts)
            out = []
            for i in range(self.size):
                with dropout_stream(streams[i]):
                    out.append(self._member_encode({k: v[i] for k, v in params.items()},
                                                   {k: v[i] for k, v in buffers.items()}, x[i] if per_member else x))
            return torch.stack(out)
        vmapped = self._vmapped_encoder_each if per_member else self._vmapped_encoder
        return vmapped(self.params, self.buffers, x)

    def training_streams(self) -> list[torch.Generator] | None:
        """Each member's dropout stream while the stack trains; None in evaluation, or
        without dropout."""
        return self.dropouts if self._template.training else None

    def encode_stack(self, params: Tensors, x: torch.Tensor, per_member: bool,
                     streams: Sequence[torch.Generator] | None) -> torch.Tensor:
        """The FFNN of this stack's layers with the stacked weights ``params`` (of this
        stack, or of several stacks of the same layers, concatenated on the member axis:
        :mod:`corel.train.lockstep`) on the shared inputs x, or each member's; dropout's
        masks from ``streams``, one per member (:meth:`training_streams`)."""
        if self._mlp is None:
            raise ValueError("encode_stack runs the FFNN's plan; this stack's encoder is not one")
        return _mlp_forward(self._mlp, params, x, shared=not per_member, streams=streams)

    def _steps(self, batch_size: int
               ) -> tuple[torch.Tensor, torch.Tensor, Iterator[tuple[int, torch.Tensor, torch.Tensor]]]:
        """A pass's labels in its order ((n,) shared by every member, or (M, n)), the order
        itself (the rows' indices: (n,), or (streams, n)) and its steps (start, inputs,
        labels): shared inputs (N, ...) and labels (N,) where the group has one stream, else
        each member's (M, N, ...) and (M, N)."""
        return self._batches(batch_size, self.draw_orders())

    def draw_orders(self) -> list[torch.Tensor]:
        """A pass's order of the training rows for each stream (one ``randperm`` from each
        stream's generator, as :func:`corel.train.solo.train_pass` draws a solo run's)."""
        n = len(self.data.y_train)
        return [torch.randperm(n, generator=shuffle) for shuffle in self.shuffles]

    def _batches(self, batch_size: int, orders: list[torch.Tensor]
                 ) -> tuple[torch.Tensor, torch.Tensor, Iterator[tuple[int, torch.Tensor, torch.Tensor]]]:
        """:meth:`_steps` over the streams' ``orders`` (:meth:`draw_orders`)."""
        data = self.data
        streams = [Batches(data.x_train, data.y_train, self.device, batch_size, order) for order in orders]
        if len(streams) == 1:
            return streams[0].labels, streams[0].order, iter(streams[0])
        # Members in stream order with one member per stream need no gather of the stack.
        each = self.stream_of != list(range(len(streams)))
        labels = torch.stack([s.labels for s in streams])
        if each:
            labels = labels.index_select(0, self._stream_index)

        def steps() -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
            for parts in zip(*streams, strict=True):
                start, stop = parts[0][0], parts[0][0] + len(parts[0][2])
                x = torch.stack([xb for _, xb, _ in parts])
                yield start, x.index_select(0, self._stream_index) if each else x, labels[:, start:stop]

        return labels, torch.stack([s.order for s in streams]), steps()

    def train_pass(
        self, callbacks: Sequence[GroupCallback] = ()
    ) -> tuple[list[float], list[int]] | None:
        """One pass over the training set for every member: (summed losses, corrects).

        The order is one ``randperm`` from the shared shuffle generator, as in
        :func:`corel.train.solo.train_pass`. None if a callback asked to stop.
        """
        self._template.train()
        data = self.data
        n = len(data.y_train)
        check_labels(data.y_train, n, data.num_classes)
        batch_size = self.specs[0].batch_size
        labels, order, steps = self._steps(batch_size)
        per_member = labels.dim() == 2
        # Per step kept on the device, added up at the end of the pass, as the solo loop does.
        losses: list[torch.Tensor] = []
        predicted = torch.empty(self.size, n, dtype=torch.int64, device=self.device)
        mode = pass_mode(self.options, self.device, data.x_train)
        if mode == "capture" and self.dropouts is not None:
            mode = "off"  # the dropout streams are generators a CUDA graph would have to register
        graphed = graphed_steps(mode, self._graphed, self._indexed_step)
        if graphed is not None:
            self._graphed = graphed

        def results() -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
            """(start, losses, similarities) of each step, the losses kept past the next."""
            if graphed is not None:  # by row indices, replayed from a CUDA graph (corel.train.graphs)
                for start in range(0, n, batch_size):
                    loss, sim = graphed(order[..., start : start + batch_size])
                    yield start, loss.clone(), sim
            else:
                for start, xb, yb in steps:
                    yield start, *stacked_step(self, xb, yb, per_member)

        with ieee_float32(self.device):
            for step, (start, loss, sim) in enumerate(results()):
                losses.append(loss)
                torch.argmax(sim, 2, out=predicted[:, start : start + batch_size])
                if any(cb.on_batch_end(step) for cb in callbacks):
                    return None
        total_loss, correct = pass_totals(torch.stack(losses), predicted, labels, batch_size)
        return total_loss.tolist(), [int(c) for c in correct.tolist()]

    def autograd_step(self, xb: torch.Tensor, yb: torch.Tensor, per_member: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """One Adam step of every member on a batch through autograd (gradients zeroed by
        the caller, :func:`corel.train.steps.stacked_step`): (losses (M,), similarities),
        detached."""
        with autocast(self.device, self.precision):
            h = self.encode(xb, per_member)
        loss, sim = self._stacked_loss(h, yb)
        # d(sum_m L_m)/d(theta_m) = dL_m/d(theta_m): each member gets its own gradient.
        loss.sum().backward()
        self.optimizer.step()
        self.after_step(h.detach(), yb, per_member)
        return loss.detach(), sim.detach()

    def after_step(self, h: torch.Tensor, yb: torch.Tensor, per_member: bool) -> None:
        """The head's buffers after an optimizer step on a batch whose representations were
        ``h``: Center loss's centroids (Wen et al.'s step); nothing for the other heads."""
        if self.loss_name == "center":
            update = self._vmapped_center_update_each if per_member else self._vmapped_center_update
            with torch.no_grad():  # in place: a CUDA graph writes the tensor it recorded
                centers = self.buffers["head.centers"]
                centers.copy_(update(centers, h, yb, self.alpha))

    def _indexed_step(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`corel.train.steps.stacked_step` on the rows ``idx`` of the training data: (n,) shared by every
        member, or (streams, n), each stream's own (members then take their stream's)."""
        x, y = self.data.x_train, self.data.y_train
        if idx.dim() == 1:
            return stacked_step(self, x.index_select(0, idx), y.index_select(0, idx), False)
        flat = idx.reshape(-1)
        xb = x.index_select(0, flat).view(*idx.shape, *x.shape[1:])
        yb = y.index_select(0, flat).view(idx.shape)
        if self.stream_of != list(range(len(self.shuffles))):
            xb, yb = xb.index_select(0, self._stream_index), yb.index_select(0, self._stream_index)
        return stacked_step(self, xb, yb, True)

    @torch.no_grad()
    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """Every member's representations of the rows x (M, N, hidden), in eval mode, a chunk
        at a time, as ``corel.train.solo.represent``."""
        was_training = self._template.training
        self._template.eval()
        try:
            with ieee_float32(self.device):
                chunks = [self.encode(x[i : i + EVAL_BATCH].to(self.device, non_blocking=True))
                          for i in range(0, len(x), EVAL_BATCH)]
                return torch.cat(chunks, dim=1)
        finally:
            self._template.train(was_training)

    @torch.inference_mode()
    def accuracies(self, x: torch.Tensor, y: torch.Tensor) -> list[float]:
        """Every member's accuracy on (x, y), in eval mode, as ``corel.train.solo.accuracy``."""
        if len(y) == 0:
            return [float("nan")] * self.size
        h = self.represent(x)
        with ieee_float32(self.device):
            preds = self._vmapped_predict(self.params, self.buffers, h)
        return (preds == y).float().mean(dim=1).tolist()

    @torch.no_grad()
    def set_class_means(self) -> None:
        """For a pair-based loss (``uses_class_means``), after each epoch: each member's W <-
        the class means of its training representations, as the solo loop sets them
        (:func:`corel.losses.peers.class_means`, member by member)."""
        h, W = self.represent(self.data.x_train), self.buffers["head.W"]
        y = self.data.y_train.to(self.device)
        for i in range(self.size):
            W[i].copy_(class_means(h[i], y, W[i]))  # in place: a CUDA graph reads this tensor

    def run_epoch(self, callbacks: Sequence[GroupCallback] = ()) -> list[EpochMetrics] | None:
        """Train one epoch, then validate every member (and test those whose validation improved).

        ``seconds`` is the group's wall time for the epoch, the same for every member.
        """
        started = time.perf_counter()
        passed = self.train_pass(callbacks)
        if passed is None:
            return None
        return self.end_epoch(passed, started)

    def end_epoch(self, passed: tuple[list[float], list[int]], started: float) -> list[EpochMetrics]:
        """The rest of :meth:`run_epoch` after a pass that gave ``passed`` (summed losses,
        corrects): the epoch counted, each member validated (and tested where validation
        improved), its record updated; ``seconds`` counted from ``started``."""
        total_loss, correct = passed
        data = self.data
        n = len(data.y_train)
        self.epoch += 1
        if self.uses_class_means:  # a pair-based loss predicts with them
            self.set_class_means()
        val_acc = self.accuracies(data.x_val, data.y_val)
        improved = [r.improves(v) for r, v in zip(self.records, val_acc, strict=True)]
        test_acc = self.accuracies(data.x_test, data.y_test) if any(improved) else None
        seconds = time.perf_counter() - started
        return [
            record.observe(self.epoch, train_loss=total_loss[i] / n, train_accuracy=correct[i] / n,
                           val_accuracy=val_acc[i], seconds=seconds,
                           test_accuracy=test_acc[i] if test_acc is not None and improved[i] else None,
                           state=lambda i=i: self.member_state(i))  # type: ignore[misc]
            for i, record in enumerate(self.records)]

    # ----------------------------------------------------------------------------------
    # Members as ordinary runs

    def member_state(self, i: int) -> Tensors:
        """Member i's ``Classifier.state_dict()`` (same keys, same order), on the CPU."""
        stacked = {**self.params, **self.buffers}
        return cpu_state({k: stacked[k][i] for k in self._state_keys})

    def member_optimizer_state(self, i: int) -> dict[str, Any]:
        """Member i's slice of the stacked Adam, as ``make_optimizer(model).state_dict()`` has it."""
        full = self.optimizer.state_dict()
        state = {
            index: {
                name: value[i].clone() if name in _ADAM_MOMENTS else value.clone()
                for name, value in entry.items()
            }
            for index, entry in full["state"].items()
        }
        groups = [{**g, "params": list(g["params"])} for g in full["param_groups"]]
        return {"state": state, "param_groups": groups}

    def member_run(self, i: int) -> Run:
        """Member i as a :class:`corel.train.solo.Run`, as ``fit(specs[i])`` would hold it now.

        Its ``checkpoint()`` and ``best_checkpoint()`` are what that solo run would write
        at this epoch, and ``fit(specs[i], checkpoint=...)`` resumes it alone. It is a
        snapshot: its model and optimizer are copies (the model object is reused by the
        next ``member_run(i)``), and training the group further does not change it.
        """
        model = self.members[i]
        model.load_state_dict(self.member_state(i))
        optimizer = make_optimizer(model, self.specs[i].lr)
        optimizer.load_state_dict(self.member_optimizer_state(i))
        shuffle = torch.Generator().manual_seed(self.specs[i].seed)
        shuffle.set_state(self.shuffles[self.stream_of[i]].get_state())
        dropout = None
        if self.dropouts is not None:
            dropout = dropout_generator(self.specs[i].seed, self.device)
            dropout.set_state(self.dropouts[i].get_state())
        return Run(
            spec=self.specs[i],
            data=self.data,
            model=model,
            optimizer=optimizer,
            shuffle=shuffle,
            device=self.device,
            epoch=self.epoch,
            record=self.records[i].snapshot(),
            options=self.options,
            dropout=dropout,
        )

    def checkpoints(self) -> list[dict[str, Any]]:
        """Every member's resumable checkpoint, in the format of ``Run.checkpoint()``."""
        return [self.member_run(i).checkpoint() for i in range(self.size)]


def fit_group(
    specs: Sequence[ExperimentSpec | dict[str, Any]],
    callbacks: Iterable[GroupCallback] = (),
    *,
    data: Dataset | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    checkpoints: Sequence[dict[str, Any]] | None = None,
    chance_epochs: int = CHANCE_EPOCHS,
    options: EngineOptions | None = None,
    prune: Prune | dict[str, Any] | None = None,
    rung_judged: bool = False,
) -> list[FitResult]:
    """:func:`corel.train.fit` for a group: one :class:`FitResult` per spec, in order.

    Every callback sees every epoch; one that returns True stops the whole group, and
    every result is then ``stopped``. A member that :func:`corel.train.not_learning`
    judges failed (``chance_epochs=0``: none) is marked in ``group.failed`` before the
    callbacks see the epoch, rides along with the others, and ends with its verdict in
    ``FitResult.failed``; the group stops when every member has failed. ``options``: the
    engine's switches, as :func:`corel.train.fit` takes them. ``prune``
    (:class:`corel.train.pruning.Prune`, or its fields): successive halving at each rung;
    a pruned member's result has ``pruned`` (its rung and why) and the history up to it,
    and the group goes on with the survivors, rebuilt from their checkpoints, each as it
    would have gone on in the whole group (callbacks hear ``on_prune``). A group resumed
    from ``checkpoints`` taken at a rung is judged there first, before its next epoch, as
    the uninterrupted group was (its callbacks may have stopped it between the epoch and
    the judgement); ``rung_judged=True`` says that judgement was already made and the
    checkpoints are the survivors', so it is not made again.
    """
    options = options or EngineOptions()
    checked = [as_spec(s) for s in specs]
    check_group(checked)
    if data is None:
        data = load_dataset(checked[0], data_dir, features_dir=options.features_dir,
                            on_features=options.on_features, features_store=options.features_store,
                            features_path=recorded_features(checkpoints[0] if checkpoints else None))
    halving = None if prune is None else Prune.of(prune, checked[0].epochs, len(checked))
    group = StackedRun.start(checked, data, device=device, checkpoints=checkpoints, options=options)
    lane = _Lane(group, list(range(group.size)), [_guard(group, chance_epochs), *callbacks])
    results: dict[int, FitResult] = {}
    _train_lanes([lane], halving, results, options, judge_first=bool(checkpoints) and not rung_judged)
    return [results[i] for i in range(len(checked))]


def fit_sweep(
    specs: Sequence[ExperimentSpec | dict[str, Any]],
    callbacks: Iterable[GroupCallback] = (),
    *,
    data: Dataset | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    chance_epochs: int = CHANCE_EPOCHS,
    options: EngineOptions | None = None,
    prune: Prune | dict[str, Any] | None = None,
    max_members: int = MAX_GROUP,
) -> list[FitResult]:
    """A sweep whose specs need several stacked groups (other losses, other models: see
    :func:`corel.train.grouping.group_specs`), trained in one process, the groups in lockstep
    (each trains an epoch, then the next), and pruned **across** groups: at each rung every
    configuration of every group is judged together, as :func:`fit_group` judges one
    group's, and a group whose configurations all go ends there. One :class:`FitResult`
    per spec, in order. Each group is the stack :func:`fit_group` trains, so a member ends
    as it would in its own group, pruned or not: bit for bit in float64 where each group
    takes its own passes; groups over the same FFNN and batches (every loss's over one
    encoder's features) take each pass together (:mod:`corel.train.lockstep`, where
    ``options.lockstep``), a member then as in its own group to the rounding of a wider
    batched product. ``callbacks`` hear
    every group's epochs (``group`` says which); one returning True stops that group.
    ``data``: the dataset every spec trains on (otherwise it is loaded once for groups
    that differ only in their loss, once per other group).
    """
    options = options or EngineOptions()
    checked = [as_spec(s) for s in specs]
    if not checked:
        raise ValueError("a sweep needs at least one spec")
    epochs = {s.epochs for s in checked}
    if prune is not None and len(epochs) > 1:
        raise ValueError(f"a pruned sweep's specs must train the same epochs (its rungs are "
                         f"shared); these train {sorted(epochs)}")
    halving = None if prune is None else Prune.of(prune, checked[0].epochs, len(checked))
    cbs = list(callbacks)
    lanes = []
    loaded: dict[str, Dataset] = {}  # the loaders read no loss field: groups of other losses share it
    for members in group_specs(checked, max_members):
        mine = [checked[i] for i in members]
        check_group(mine)
        if data is None:
            key = mine[0].model_dump_json(exclude={"loss", *MAY_DIFFER})
            if key not in loaded:
                loaded[key] = load_dataset(mine[0], data_dir, features_dir=options.features_dir,
                                           on_features=options.on_features,
                                           features_store=options.features_store)
        group = StackedRun.start(mine, data if data is not None else loaded[key], device=device, options=options)
        lanes.append(_Lane(group, list(members), [_guard(group, chance_epochs), *cbs]))
    results: dict[int, FitResult] = {}
    _train_lanes(lanes, halving, results, options)
    return [results[i] for i in range(len(checked))]


def _guard(group: StackedRun, chance_epochs: int) -> GroupChanceGuard:
    y_val = group.data.y_val
    return GroupChanceGuard(chance_accuracy(y_val), chance_epochs, len(y_val))


@dataclass
class _Lane:
    """A stacked group in flight: ``position[i]``, the caller's spec index of its member i."""

    group: StackedRun
    position: list[int]
    callbacks: list[GroupCallback]
    stopped: bool = False
    done: bool = False


def _train_lanes(lanes: list[_Lane], halving: Prune | None, results: dict[int, FitResult],
                 options: EngineOptions, judge_first: bool = False) -> None:
    """Train ``lanes`` in lockstep to their last epoch, judging every live member together
    at each rung; each member's result into ``results`` (by the caller's position).
    ``judge_first``: the lanes were resumed at an epoch that may be a rung not yet judged."""
    with options.applied():
        if judge_first and halving is not None:
            _judge(lanes, halving, results, options)
        while live := [lane for lane in lanes if not lane.done]:
            # Lanes whose stacks can take this pass together do (corel.train.lockstep).
            bunches: dict[Any, list[_Lane]] = {}
            for lane in live:
                if lane.group.epoch >= lane.group.epochs:
                    lane.done = True
                    continue
                key = lockstep_key(lane.group) if options.lockstep else None
                bunches.setdefault(("alone", id(lane)) if key is None else key, []).append(lane)
            for bunch in bunches.values():
                if len(bunch) == 1:
                    epochs = [bunch[0].group.run_epoch(bunch[0].callbacks)]
                else:
                    epochs = lockstep_epoch([lane.group for lane in bunch], [lane.callbacks for lane in bunch])
                for lane, metrics in zip(bunch, epochs, strict=True):
                    if metrics is None or any([bool(cb.on_epoch_end(metrics, lane.group)) for cb in lane.callbacks]):
                        lane.stopped = lane.done = True
            if halving is not None:
                _judge(live, halving, results, options)
    for lane in lanes:
        for i, at in enumerate(lane.position):
            results[at] = FitResult.from_run(lane.group.member_run(i), lane.stopped, lane.group.failed.get(i))


def _judge(lanes: list[_Lane], halving: Prune, results: dict[int, FitResult], options: EngineOptions) -> None:
    """The rung, if the lanes not stopped stand at one and hold more than one member."""
    judged = [lane for lane in lanes if not lane.stopped]
    if (judged and judged[0].group.epoch in halving.rungs(judged[0].group.epochs)
            and sum(lane.group.size for lane in judged) > 1):
        _prune(judged, halving, results, options)


def _prune(lanes: list[_Lane], halving: Prune, results: dict[int, FitResult], options: EngineOptions) -> None:
    """One rung across ``lanes``: judge all their members together, end those that go (into
    ``results``), and rebuild each lane's stack from its survivors' checkpoints; a lane left
    with none is done."""
    scores = [row for lane in lanes for row in _rung_scores(lane.group, halving.metric)]
    configs = [configuration(s) for lane in lanes for s in lane.group.specs]
    kept_all, why_all = keep(scores, configs, halving.eta)
    if len(kept_all) == len(configs):
        return
    offset = 0
    for lane in lanes:
        group, n = lane.group, lane.group.size
        kept = [k - offset for k in kept_all if offset <= k < offset + n]
        why = {j - offset: w for j, w in why_all.items() if offset <= j < offset + n}
        mine = scores[offset:offset + n]
        offset += n
        if len(kept) == n:
            continue
        rung = group.epoch
        for i in range(n):
            if i not in kept:
                figures = dict(zip(halving.metric, mine[i], strict=True))
                results[lane.position[i]] = FitResult.from_run(
                    group.member_run(i), False, group.failed.get(i),
                    pruned={"rung": rung, "reason": why[i], "metrics": figures})
        for cb in lane.callbacks:
            cb.on_prune(group, kept, why, rung)
        if not kept:
            lane.position, lane.done = [], True  # every member went: nothing left to finish
            continue
        survivors = StackedRun.start([group.specs[i] for i in kept], group.data, device=group.device,
                                     checkpoints=[group.member_run(i).checkpoint() for i in kept],
                                     options=options)
        survivors.failed.update({new: group.failed[old] for new, old in enumerate(kept) if old in group.failed})
        lane.group, lane.position = survivors, [lane.position[i] for i in kept]


def _rung_scores(group: StackedRun, metrics: Sequence[str]) -> list[tuple[float, ...]]:
    """Each member's figures at this epoch on ``metrics`` (corel.train.pruning.METRICS)."""
    columns = []
    for metric in metrics:
        if metric == "val_accuracy":
            columns.append([h[-1].val_accuracy for h in group.histories])
        else:
            with torch.no_grad():
                h = group.encode(group.data.x_val)
            geometry = default_metric(group.loss_name)
            columns.append([map_at_r(h[i].double(), group.data.y_val, geometry) for i in range(group.size)])
    return [tuple(row) for row in zip(*columns, strict=True)]


def _check_checkpoints(
    specs: Sequence[ExperimentSpec], checkpoints: Sequence[dict[str, Any]]
) -> None:
    if len(checkpoints) != len(specs):
        raise ValueError(
            f"got {len(checkpoints)} checkpoints for {len(specs)} specs; need one per member"
        )
    for i, (spec, ckpt) in enumerate(zip(specs, checkpoints, strict=True)):
        check_resumable(ckpt, spec, f"checkpoint {i}")
    first = checkpoints[0]
    for i, ckpt in enumerate(checkpoints):
        if int(ckpt["epoch"]) != int(first["epoch"]):
            raise ValueError(
                f"checkpoint {i} is at epoch {ckpt['epoch']}, checkpoint 0 at {first['epoch']}; "
                "a group resumes only from checkpoints of the same epoch"
            )
        seed = specs[i].seed
        same_seed = next(j for j, s in enumerate(specs) if s.seed == seed)
        if not torch.equal(ckpt["rng"]["shuffle"], checkpoints[same_seed]["rng"]["shuffle"]):
            raise ValueError(f"checkpoint {i} has another data order than checkpoint {same_seed}, "
                             f"of the same seed {seed}")
        steps = {k: v["step"] for k, v in ckpt["optimizer"]["state"].items()}
        first_steps = {k: v["step"] for k, v in first["optimizer"]["state"].items()}
        if steps.keys() != first_steps.keys() or any(
            not torch.equal(torch.as_tensor(v), torch.as_tensor(first_steps[k]))
            for k, v in steps.items()
        ):
            raise ValueError(
                f"checkpoint {i} has taken another number of optimizer steps than checkpoint 0"
            )
