"""A training pass's full batches on a CUDA device taken from one CUDA graph (the default;
``EngineOptions(cuda_graphs="off")`` turns it off; :mod:`corel.train.steps` decides).

At the paper's sizes a GPU step is launch-bound: on an H100 a FFNN step at batch 128 ran at
0.1% of the chip's float32 rate, and a CNN step took about 2.9 ms, most of it the launch of
a few hundred small kernels (``docs/runs/2026-11-26-h100``). A CUDA graph records a step's
kernels once and launches them all with one call. :class:`GraphedSteps` takes a step
function ``step(idx)`` that gathers its batch by row indices ``idx`` from data held on the
device, takes the whole training step (forward, backward, Adam, a head's buffer update) and
returns detached tensors; it runs the first :data:`WARMUP` full batches eagerly (on a side
stream, as CUDA graph capture asks), captures the next full batch's step, and from then on
copies each full batch's indices into the graph's own index tensor and replays it. A short
last batch runs eagerly. The graph lives as long as its run, across passes.

The kernels replayed are those the eager step launches, on the same tensors, so a graphed
pass computes what the eager pass computes. What a step keeps between steps must be
changed in place (parameters, Adam's state, Center's centers), never rebound: a graph
writes the tensors it recorded. Where capture fails (a loss that waits for the host, say),
the run warns once and goes on eagerly.

The modes (:class:`corel.train.EngineOptions`' ``cuda_graphs``): ``capture`` (the default)
captures on CUDA devices (on a CPU nothing changes); ``off``; ``eager`` takes the graphed
pass's path, every step eagerly, on any device (what the CPU tests check). It became
the default after its tests (``tests/gpu/test_graphs.py``: a graphed run ends where the
eager one ends, in float64) passed on an H100 on 2026-11-27, where a Fashion-MNIST FFNN
run trained 11x as fast with it (``docs/runs/2026-11-27-h100/bench.txt``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

__all__ = ["WARMUP", "GraphedSteps"]

WARMUP = 3
"""Full-batch steps taken eagerly before the capture (lazy initialisations: cuBLAS handles,
Adam's state on a run's first steps)."""

Step = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


class GraphedSteps:
    """``step(idx)`` for each batch of a run's passes, replayed from a CUDA graph for every
    full batch after the first :data:`WARMUP` (see the module). ``capture=False``: every
    step eagerly. The outputs of a replayed step are the graph's own tensors, valid until
    the next call: take what you keep from them before then."""

    def __init__(self, step: Step, capture: bool = True) -> None:
        self.step = step
        self.capture = capture
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed: str | None = None
        self._full: torch.Size | None = None  # a full batch's index shape (the first one's)
        self._warm = 0
        self._idx: torch.Tensor | None = None
        self._stream: torch.cuda.Stream | None = None
        self._outputs: tuple[torch.Tensor, ...] = ()

    @property
    def replaying(self) -> bool:
        return self.graph is not None

    def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._full is None:
            self._full = idx.shape
        if idx.shape != self._full or not self.capture or self.failed is not None:
            return self.step(idx)
        if self.graph is not None:
            assert self._idx is not None
            self._idx.copy_(idx)
            self.graph.replay()
            return self._outputs
        if self._warm < WARMUP:
            self._warm += 1
            return self._on_side_stream(idx)
        return self._capture(idx)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream the warm-up steps run on and the capture records on: one stream for
        both, so that the libraries' per-stream state (cuBLAS's workspace, say) is made
        before the capture, not during it."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def _on_side_stream(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        side = self._side_stream(idx.device)
        side.wait_stream(torch.cuda.current_stream(idx.device))
        with torch.cuda.stream(side):
            outputs = self.step(idx)
        torch.cuda.current_stream(idx.device).wait_stream(side)
        return outputs

    def _capture(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self._idx = idx.clone()
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: a service's other threads (serving /embed, say) may use the GPU
            # while this one records; the step's backward, on autograd's own thread, is
            # recorded all the same (it runs on the stream being captured).
            with torch.cuda.graph(graph, stream=self._side_stream(idx.device),
                                  capture_error_mode="thread_local"):
                outputs = self.step(self._idx)
        except Exception as exc:  # any fault: the run goes on eagerly
            self.failed = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"CUDA graph capture of the training step failed ({self.failed}); "
                          "this run goes on without graphs", RuntimeWarning, stacklevel=3)
            return self.step(idx)
        # Recording ran nothing: this batch's step is the first replay.
        self.graph, self._outputs = graph, outputs
        graph.replay()
        return outputs
