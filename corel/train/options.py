"""The engine's switches, passed by whoever trains (``fit(..., options=...)``, the worker
from its settings, the library's CLI from its environment): nothing in the engine reads
the environment itself.

* ``cuda_graphs``: ``"capture"`` (the default): a pass's full batches on a CUDA device are
  replayed from a CUDA graph (:mod:`corel.train.graphs`; nothing changes on a CPU);
  ``"off"``; ``"eager"``: the graphed pass's path, every step eagerly, on any device (what
  the CPU tests check).
* ``native``: corel's compiled nodes and steps (:mod:`corel.native`) where they are built
  (default on); off, the Python nodes run (the same numbers, slower).
* ``native_dir``: where the builds live (default ``<sys.prefix>/corel-native``).
* ``features_dir``: where frozen pretrained encoders' features are kept between processes
  (default: none; each process computes them once, :mod:`corel.encoders.features`).
* ``keep_frozen_outputs``: a fine-tuned encoder's frozen lower part computes each row's
  output once and keeps it (:mod:`corel.encoders.finetune`; default on); off, every step runs it.
* ``on_features``: called ``(encoder, done, total)`` while a frozen encoder's features of
  the data are computed (:func:`corel.encoders.features_progress`; not when they come from
  a cache): the worker shows it as the run's phase.
* ``features_store``: where those features are kept for every host (the service's artifact
  store; :mod:`corel.encoders.kept`): a run on another host reads them, and computes none.
* ``lockstep``: a sweep's stacks of other losses over the same FFNN and batches take each
  pass together, their encoders as one stack (:mod:`corel.train.lockstep`; default on); off,
  each stack takes its own pass in turn (the same members, to rounding).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, get_args

from corel import native
from corel.encoders.kept import FeatureStore

__all__ = ["GRAPH_MODES", "EngineOptions", "GraphMode", "parse_cuda_graphs", "parse_switch"]

GraphMode = Literal["capture", "off", "eager"]
GRAPH_MODES: tuple[GraphMode, ...] = get_args(GraphMode)

ON = ("", "1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")


def parse_switch(value: str, name: str) -> bool:
    """An on/off word as a bool: empty, 1, on, true, yes are on; 0, off, false, no off."""
    word = value.strip().lower()
    if word in ON:
        return True
    if word in OFF:
        return False
    raise ValueError(f"{name}={value!r}: allowed are 1, on, true, yes (or empty: on) and 0, off, false, no")


def parse_cuda_graphs(value: str, name: str = "COREL_CUDA_GRAPHS") -> GraphMode:
    """A CUDA graphs setting as a mode: ``capture`` (``1``, or empty), ``off`` (``0``) or
    ``eager``; a ``ValueError`` names the values allowed for any other (the service's
    settings check it when they are read, so a worker refuses to start on it)."""
    word = value.strip().lower()
    if word == "eager" or word in GRAPH_MODES:
        return word  # type: ignore[return-value]
    try:
        return "capture" if parse_switch(word, name) else "off"
    except ValueError:
        raise ValueError(f"{name}={value!r}: allowed are 1 (the default: CUDA graphs on CUDA devices), "
                         "0 (off) and eager (their path without capture, on any device)") from None


@dataclass(frozen=True)
class EngineOptions:
    """How the engine trains (see the module); the defaults are the product's."""

    cuda_graphs: GraphMode = "capture"
    native: bool = True
    native_dir: str | os.PathLike[str] | None = None
    features_dir: str | os.PathLike[str] | None = None
    keep_frozen_outputs: bool = True
    on_features: Callable[[str, int, int], None] | None = field(default=None, compare=False)
    features_store: FeatureStore | None = field(default=None, compare=False)
    lockstep: bool = True

    def __post_init__(self) -> None:
        if self.cuda_graphs not in GRAPH_MODES:
            raise ValueError(f"cuda_graphs={self.cuda_graphs!r}: allowed are {', '.join(GRAPH_MODES)}")

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The switches that act below the loop (corel.native's nodes, called from the
        models' forward passes) set for the block: this thread's training only."""
        with native.using(self.native, self.native_dir):
            yield
