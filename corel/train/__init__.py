"""The training engine: corel's one import path for training a spec, alone or stacked.

What is where (each module has one job):

* :mod:`.solo`: the solo loop, ``fit`` -> ``run_epoch`` -> ``train_pass`` -> one step, and
  :class:`Run`, a run's mutable state (:func:`start_run` builds it, fresh or resumed);
* :mod:`.stacked`: :func:`fit_group` and :class:`StackedRun`, a group of specs that differ
  only in loss parameters and seed trained as one stacked model (a sweep's rows);
* :mod:`.lockstep`: stacks of other losses over the same FFNN and batches (a sweep of
  every loss, :func:`fit_sweep`) taking each pass together, their encoders as one stack;
* :mod:`.grouping`: which specs may train together (:func:`group_specs`, :func:`group_key`);
* :mod:`.steps`: which step a pass takes (a CUDA graph's replay, one native call, the fused
  nodes, plain autograd), decided once for both loops;
* :mod:`.native_step`: the whole Adam step of a Gaussian-COREL FFNN as one call into
  ``corel.native``'s compiled code (solo and stacked);
* :mod:`.graphs`: a pass's steps captured once as a CUDA graph and replayed;
* :mod:`.optim`: the optimizer (Adam, with its one-kernel update where it applies);
* :mod:`.record`: a run's bookkeeping (history, best epoch and weights, test accuracy at
  the best epoch), one per solo run and one per stacked member;
* :mod:`.checkpoints`: the checkpoint format (resume, serve);
* :mod:`.callbacks`: what a loop reports (:class:`EpochMetrics`) and to whom;
* :mod:`.guards`: the "not learning" judgement, for both loops;
* :mod:`.options`: the engine's switches (:class:`EngineOptions`), passed by the caller.

One step of a sweep: the worker groups its specs (:func:`group_specs`) and calls
:func:`fit_group`; each epoch :meth:`StackedRun.run_epoch` runs ``train_pass``, which asks
:func:`.steps.choose` how to step; each step (``StackedRun._train_step``) is then either one
native call (:func:`.native_step.stacked_gaussian_mlp_step`) or the stacked forward (the
FFNN as batched products, other encoders under ``vmap``), every member's loss summed,
one ``backward`` (each member gets exactly its own gradient), one Adam over the stacked
tensors, and Center loss's centroid step; on a GPU the same step is replayed from a CUDA
graph. After the pass every member is validated (and tested where it improved), its
:class:`Record` observes the epoch, the guard marks members that do not learn, and the
callbacks see every member's metrics (the worker writes them and the checkpoints in one
transaction).
"""

from __future__ import annotations

from corel.train.callbacks import Callback, EpochMetrics, GroupCallback, GroupView, RunView
from corel.train.checkpoints import (
    CHECKPOINT_FORMAT,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    model_from_checkpoint,
)
from corel.train.grouping import group_key, group_specs
from corel.train.guards import (
    CHANCE_EPOCHS,
    ChanceGuard,
    GroupChanceGuard,
    NotLearningError,
    chance_accuracy,
    not_learning,
)
from corel.train.optim import adam
from corel.train.options import EngineOptions
from corel.train.pruning import Prune
from corel.train.solo import (
    FitResult,
    Run,
    accuracy,
    build_model,
    fit,
    make_optimizer,
    represent,
    run_epoch,
    start_run,
    train_pass,
    train_step,
)
from corel.train.stacked import StackedRun, fit_group, fit_sweep
from corel.train.steps import forward_loss

__all__ = [
    "CHANCE_EPOCHS",
    "CHECKPOINT_FORMAT",
    "Callback",
    "ChanceGuard",
    "EngineOptions",
    "EpochMetrics",
    "FitResult",
    "GroupCallback",
    "GroupChanceGuard",
    "GroupView",
    "NotLearningError",
    "Prune",
    "Run",
    "RunView",
    "StackedRun",
    "accuracy",
    "adam",
    "build_model",
    "chance_accuracy",
    "checkpoint_from_bytes",
    "checkpoint_to_bytes",
    "fit",
    "fit_group",
    "fit_sweep",
    "forward_loss",
    "group_key",
    "group_specs",
    "make_optimizer",
    "model_from_checkpoint",
    "not_learning",
    "represent",
    "run_epoch",
    "start_run",
    "train_pass",
    "train_step",
]
