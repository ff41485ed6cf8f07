"""Stacks of other losses over the same encoder and data, trained in lockstep: one pass,
each batch read once, every stack's encoder run as one stack.

A sweep of every loss (:func:`corel.train.stacked.fit_sweep`) trains one stack per loss: the
heads differ (CCE's bias, Gaussian-COREL's gamma, Center loss's centroids, the peers' class
means), so their members cannot share one set of stacked tensors. Their encoders can: the
same FFNN over the same features, with the same batch order wherever the seeds are the same.
:func:`lockstep_pass` trains such stacks together, step by step:

* each stack draws its pass's order from its own generators, as alone (the orders are
  equal, since their seeds and states are: :func:`lockstep_key` says which stacks qualify);
* each batch is gathered once; the encoders of the stacks run as one stack (or a few runs of
  stacks, so that one batched product's weights stay within :data:`CHUNK_ELEMENTS`): their
  stacked weights slices of one tensor on the member axis, one batched product per layer
  (:meth:`corel.train.stacked.StackedRun.encode_stack`);
* each stack's loss is its own head's on its members' slice of the representations; the
  losses of a run's stacks are summed before one ``backward``, which hands each member
  exactly the gradient of its own loss (the whole's gradient split into views);
* each stack's own Adam steps its own tensors (one fused kernel call for a run's stacks
  where their Adams agree: :func:`corel.train.optim.step_together`), and its head updates
  its buffers.

Only over narrow inputs (:data:`MAX_INPUTS`: features, not Fashion-MNIST's pixels), where
it was measured faster than each stack in turn.

A stack whose step is one native call (Gaussian-COREL's, :mod:`corel.train.native_step`)
takes that call on the shared batch instead. So a member ends as it would in its own stack,
up to the rounding of a wider batched product (tests/corel/train/test_lockstep.py: to
1e-10 in float64), and the figures of each stack's epoch are the ones :meth:`StackedRun.run_epoch` reports.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

from corel.device import Batches, autocast, ieee_float32
from corel.losses import check_labels
from corel.train.callbacks import EpochMetrics, GroupCallback
from corel.train.native_step import stacked_gaussian_mlp_step
from corel.train.optim import step_together
from corel.train.solo import pass_totals
from corel.train.steps import pass_mode

if TYPE_CHECKING:  # corel.train.stacked calls this module to train its lanes
    from corel.train.stacked import StackedRun

__all__ = ["lockstep_epoch", "lockstep_key", "lockstep_pass"]

Passed = tuple[list[float], list[int]]


# The widest input a stack takes its passes in lockstep with. Over features, in lockstep was
# 1.04-1.16x the speed of each stack in turn (WordLlama's 256, 4 epochs), 1.26-1.31x (the
# paper's 50-d GloVe means, with dropout) and 1.01x (MiniLM's 384, bench/encoders.py's warm sweep);
# over Fashion-MNIST's 784 pixels (the seven peers, six members each) 0.88-0.97x, the same
# kernels each slower (a 2-core Intel Xeon with AMX, 2026-12-06).
MAX_INPUTS = 512


def lockstep_key(group: StackedRun) -> Hashable | None:
    """Stacks with equal keys can take their next pass together (:func:`lockstep_pass`);
    None: this one takes its own. Equal keys: the same training tensors, batch size,
    device and precision, an FFNN of the same layers and shapes (with dropout: each
    member's masks from its own stream, as alone), the plain loop (no CUDA graph), and the same streams (seeds, in order) at the same
    generator states, so that each draws the same order; inputs of at most
    :data:`MAX_INPUTS` features."""
    plan = group._mlp
    if plan is None:
        return None
    data = group.data
    if pass_mode(group.options, group.device, data.x_train) != "off":
        return None
    names = _encoder_names(plan)
    if group.params[names[0]].shape[-1] > MAX_INPUTS:
        return None
    shapes = tuple((name, tuple(group.params[name].shape[1:]), group.params[name].dtype) for name in names)
    streams = tuple(bytes(shuffle.get_state().numpy()) for shuffle in group.shuffles)
    return (id(data.x_train), id(data.y_train), group.specs[0].batch_size, str(group.device), group.precision,
            tuple((kind, arg) for kind, arg in plan), shapes, streams)


def _encoder_names(plan: Sequence[tuple[str, object]]) -> list[str]:
    return [f"{arg}.{part}" for kind, arg in plan if kind == "linear" for part in ("weight", "bias")]


def lockstep_pass(groups: Sequence[StackedRun],
                  callbacks: Sequence[Sequence[GroupCallback]]) -> list[Passed | None]:
    """One pass over the training set for every stack of ``groups`` (equal
    :func:`lockstep_key`), in lockstep: for each, what :meth:`StackedRun.train_pass` returns
    (summed losses, corrects; None where one of its ``callbacks`` asked to stop: that stack
    takes no further step, the others go on)."""
    first = groups[0]
    data, device = first.data, first.device
    n = len(data.y_train)
    batch_size = first.specs[0].batch_size
    check_labels(data.y_train, n, data.num_classes)  # one training set for every stack
    orders = [group.draw_orders() for group in groups]
    for group, drawn in zip(groups, orders, strict=True):
        if not all(torch.equal(a, b) for a, b in zip(drawn, orders[0], strict=True)):
            raise RuntimeError(f"stack of {group.loss_name!r} drew another order than the first")
        group._template.train()
    streams = [Batches(data.x_train, data.y_train, device, batch_size, order) for order in orders[0]]
    several = len(streams) > 1
    # Each stack's labels in pass order: (n,) shared, or (M, n) its members' streams'.
    stream_labels = torch.stack([s.labels for s in streams]) if several else streams[0].labels
    labels = [stream_labels.index_select(0, g._stream_index) if several else stream_labels for g in groups]
    predicted = [torch.empty(g.size, n, dtype=torch.int64, device=device) for g in groups]
    losses: list[list[torch.Tensor]] = [[] for _ in groups]
    live = list(range(len(groups)))
    shared: list[_Shared] = []
    with ieee_float32(device):
        for step, parts in enumerate(zip(*streams, strict=True)):
            start = parts[0][0]
            stop = start + len(parts[0][2])
            x = torch.stack([xb for _, xb, _ in parts]) if several else parts[0][1]
            ys = {i: labels[i][..., start:stop] for i in live}
            for i, (loss, sim) in _step([groups[i] for i in live], live, x, ys, several, shared).items():
                losses[i].append(loss)
                torch.argmax(sim, 2, out=predicted[i][:, start:stop])
            live = [i for i in live if not any([cb.on_batch_end(step) for cb in callbacks[i]])]
            if not live:
                break
    out: list[Passed | None] = [None] * len(groups)
    for i in live:
        total_loss, correct = pass_totals(torch.stack(losses[i]), predicted[i], labels[i], batch_size)
        out[i] = total_loss.tolist(), [int(c) for c in correct.tolist()]
    return out


class _Shared:
    """The encoder tensors of stacks that step together, each name's in one storage: every
    stack's stacked weight is a slice of it (its ``data`` rebound, the same tensor for its
    optimiser), so the stacks' encoders run as one stack with no copy, and the gradient of
    the whole splits into each stack's slices as views."""

    def __init__(self, groups: list[StackedRun]) -> None:
        self.groups = groups
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for group in groups:
            self.bounds.append((start, start + group.size))
            start += group.size
        self.whole: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name in _encoder_names(groups[0]._mlp or []):
                whole = torch.cat([g.params[name].detach() for g in groups])
                for group, (a, b) in zip(groups, self.bounds, strict=True):
                    group.params[name].data = whole[a:b]
                self.whole[name] = whole
        # The stacks' rows in the stack of several streams' inputs: each member's stream.
        self.streams = torch.cat([g._stream_index for g in groups])

    def forward(self, x: torch.Tensor, several: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Every member's representations of the batch (its stream's, where ``several``),
        and the leaves they were computed from (their gradients: :meth:`hand_gradients`)."""
        lead = self.groups[0]
        leaves = {name: whole.detach().requires_grad_(True) for name, whole in self.whole.items()}
        xs = x.index_select(0, self.streams) if several else x
        streams = None
        if lead.training_streams() is not None:  # each member's dropout masks from its own stream
            streams = [stream for g in self.groups for stream in g.training_streams() or ()]
        with autocast(lead.device, lead.precision):
            h = lead.encode_stack(leaves, xs, several, streams)
        return h, leaves

    def hand_gradients(self, leaves: dict[str, torch.Tensor]) -> None:
        """Each stack's slices of the whole's gradients, as its weights' own (views)."""
        for name, leaf in leaves.items():
            grad = leaf.grad
            for group, (a, b) in zip(self.groups, self.bounds, strict=True):
                group.params[name].grad = None if grad is None else grad[a:b]


# How much of the first layer's stacked weight one batched product takes (elements): on a
# 2-core Intel Xeon, 42 members' products forward and backward over Fashion-MNIST's 784
# pixels (128 rows, 128 units) took 23-30 ms at once against 17-18 ms as seven of six
# members; over 256-d features 33 members at once were as fast as three of eleven.
CHUNK_ELEMENTS = 1_200_000


def _chunks(stacks: list[StackedRun]) -> list[list[StackedRun]]:
    """The stacks, in order, in runs whose first layers' stacked weights hold at most
    :data:`CHUNK_ELEMENTS` elements together (a stack larger than that is a run of its own)."""
    name = _encoder_names(stacks[0]._mlp or [])[0]
    out: list[list[StackedRun]] = []
    held = 0
    for group in stacks:
        size = group.params[name].numel()
        if out and held + size <= CHUNK_ELEMENTS:
            out[-1].append(group)
            held += size
        else:
            out.append([group])
            held = size
    return out


def _step(groups: list[StackedRun], positions: list[int], x: torch.Tensor, ys: dict[int, torch.Tensor],
          several: bool, shared: list[_Shared]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """One Adam step of every member of ``groups`` on the batch ``x`` (N, ...), or each
    stream's (S, N, ...) where ``several``: (losses, similarities) by position, detached.
    ``shared``: the encoders of the stacks that stepped together last, in runs (:func:`_chunks`;
    kept while they are the same stacks)."""
    done: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    merged: list[tuple[int, StackedRun]] = []
    for at, group in zip(positions, groups, strict=True):
        group.optimizer.zero_grad(set_to_none=True)
        if group.native_layout is not None:  # Gaussian-COREL's step as one native call, where built
            own = x.index_select(0, group._stream_index) if several else x
            native = stacked_gaussian_mlp_step(group.native_layout, group.params, group.buffers, group.optimizer,
                                               group.lam, group.one_minus_lam, own, ys[at])
            if native is not None:
                done[at] = native
                continue
        merged.append((at, group))
    if not merged:
        return done
    stacks = [group for _, group in merged]
    if [id(g) for chunk in shared for g in chunk.groups] != [id(g) for g in stacks]:
        shared[:] = [_Shared(chunk) for chunk in _chunks(stacks)]
    position = {id(group): at for at, group in merged}
    for chunk in shared:  # a whole step a run, while its tensors are in the caches
        h, leaves = chunk.forward(x, several)
        parts = h.split([g.size for g in chunk.groups])
        results = [g._stacked_loss(hg, ys[position[id(g)]]) for g, hg in zip(chunk.groups, parts, strict=True)]
        # d(sum of every member's loss)/d(theta_m) = dL_m/d(theta_m): each member its own gradient.
        torch.stack([loss.sum() for loss, _ in results]).sum().backward()
        chunk.hand_gradients(leaves)
        if not step_together([group.optimizer for group in chunk.groups]):  # one kernel call where they agree
            for group in chunk.groups:
                group.optimizer.step()
        for group, hg, (loss, sim) in zip(chunk.groups, parts, results, strict=True):
            at = position[id(group)]
            group.after_step(hg.detach(), ys[at], several)
            done[at] = loss.detach(), sim.detach()
    return done


def lockstep_epoch(groups: Sequence[StackedRun],
                   callbacks: Sequence[Sequence[GroupCallback]]) -> list[list[EpochMetrics] | None]:
    """:meth:`StackedRun.run_epoch` for every stack of ``groups`` (equal :func:`lockstep_key`),
    their passes in lockstep; each stack's epoch ``seconds`` counts from the shared pass's
    start to its own validation's end."""
    started = time.perf_counter()
    passes = lockstep_pass(groups, callbacks)
    return [None if passed is None else group.end_epoch(passed, started)
            for group, passed in zip(groups, passes, strict=True)]
