"""Where a run's tensors live: the device it is given, and its data moved there."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

import torch

from corel.data import Dataset

SPLITS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The given device, else CUDA when this machine has a GPU, else CPU; a GPU always with
    its index (``cuda`` is ``cuda:0`` on a one-GPU worker), as tensors on it report theirs,
    so that ``tensor.device == run.device`` holds for a tensor on the run's device."""
    picked = torch.device(device if device is not None else
                          "cuda" if torch.cuda.is_available() else "cpu")
    if picked.type == "cuda" and picked.index is None:
        picked = torch.device("cuda", torch.cuda.current_device())
    return picked


# Data takes at most this share of the device's free memory to be held there for a run;
# the rest is left to the model, its gradients, Adam's moments and the activations.
RESIDENT_SHARE = 0.5


def data_bytes(data: Dataset) -> int:
    """The bytes of every split's tensors."""
    return sum(getattr(data, name).numel() * getattr(data, name).element_size() for name in SPLITS)


def fits_on_device(data: Dataset, device: torch.device) -> bool:
    """Whether ``data`` is held on ``device`` for the whole run: always on the CPU; on a
    GPU where it takes at most :data:`RESIDENT_SHARE` of the free memory."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return data_bytes(data) <= RESIDENT_SHARE * free


def to_device(data: Dataset, device: torch.device, resident: bool | None = None) -> Dataset:
    """``data`` for a run on ``device`` (the same object on the CPU).

    Where it fits (:func:`fits_on_device`; ``resident`` overrides), every split is moved
    there once, so that no batch crosses from the host. Otherwise the inputs stay on the
    host in pinned (page-locked) memory, which :class:`Batches` copies from asynchronously
    a batch at a time, and only the labels move.
    """
    if device.type == "cpu":
        return data
    if resident is None:
        resident = fits_on_device(data, device)
    moved = copy.copy(data)
    for name in SPLITS:
        tensor = getattr(data, name)
        if resident or name.startswith("y_"):
            setattr(moved, name, tensor.to(device))
        else:
            setattr(moved, name, tensor.cpu().pin_memory())
    return moved


class Batches:
    """One pass's training batches, in the order of ``permutation``, on ``device``:
    iterate for (start, x, y) per batch of ``batch_size`` rows.

    The labels are gathered once for the pass (:attr:`labels`, in pass order; a batch's are
    a slice of them). Inputs held on the device (or on the CPU, for a CPU run): one
    ``index_select`` per batch, into one of two buffers that the pass reuses, so that
    no batch allocates. Inputs held on the host (:func:`to_device`): gathered into one
    of two pinned staging buffers, then copied with ``non_blocking=True``, so that the copy
    of one batch overlaps the work on the previous one; a buffer is written again only
    once its last copy has finished.

    A batch's tensors are valid until the next batch but one is taken (the loops use
    each batch in its own step and keep only detached results).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, device: torch.device, batch_size: int,
                 permutation: torch.Tensor):
        self.x, self.device, self.batch_size = x, device, batch_size
        # Held on the host for a GPU run (to_device), rather than on the run's device. Not
        # ``x.device != device``: a tensor on the GPU says cuda:0 where a device may say cuda.
        self.host = x.device.type == "cpu" and device.type != "cpu"
        self.order_host = permutation
        self.order = permutation.to(device)
        self.labels = y.index_select(0, self.order)
        """The pass's labels in its order (on the device)."""
        shape = (batch_size, *x.shape[1:])
        # Used in turn: a host copy from one overlaps the step on the other. (A step's
        # backward has used its batch before the next one is gathered.)
        self._buffers = [torch.empty(shape, dtype=x.dtype, device=x.device, pin_memory=self.host)
                         for _ in range(2)]
        self._copied: list[Any] = [None, None]

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        n, size = len(self.order), self.batch_size
        for turn, start in enumerate(range(0, n, size)):
            stop = min(start + size, n)
            yield start, self._take(turn % 2, start, stop), self.labels[start:stop]

    def _take(self, turn: int, start: int, stop: int) -> torch.Tensor:
        buffer = self._buffers[turn][: stop - start]
        if not self.host:
            # index_select: the same rows as x[idx], gathered ~2.5x faster.
            return torch.index_select(self.x, 0, self.order[start:stop], out=buffer)
        if self._copied[turn] is not None:
            self._copied[turn].synchronize()
        torch.index_select(self.x, 0, self.order_host[start:stop], out=buffer)
        xb = buffer.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._copied[turn] = event
        return xb


def effective_precision(device: torch.device, precision: str) -> str:
    """The precision a run asking for ``precision`` trains in on ``device``: bf16 where the
    device can (every CPU, through autocast; a GPU that supports bfloat16), else fp32
    (``auto`` and ``int8`` too: they choose a frozen encoder's features' path, and the head
    trains in fp32)."""
    if precision != "bf16" or (device.type == "cuda" and not torch.cuda.is_bf16_supported()):
        return "fp32"
    return precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast on ``device`` for a bf16 run (matrix products and convolutions in
    bfloat16, the rest as autocast decides); nothing for fp32."""
    if precision == "bf16":
        # A CUDA graph's capture must not use autocast's cache of cast weights (torch's
        # CUDA graphs notes); eager steps keep it. The casts are the same either way.
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                              cache_enabled=False if capturing else None)
    return contextlib.nullcontext()


_EXACT_LOCK = threading.Lock()
_exact_spans = 0  # the blocks under ieee_float32 now, in every thread
_exact_restore: list[tuple[Any, str, Any]] = []  # (target, attribute, the value before)


@contextlib.contextmanager
def ieee_float32(device: torch.device) -> Iterator[None]:
    """Float32 products and convolutions in IEEE float32 on a CUDA ``device`` for the span
    of the block, then the process's own settings back.

    PyTorch lets cuDNN run float32 convolutions in TF32 by default (10 of float32's 23
    mantissa bits in the inputs), so a "fp32" CNN run on an Ampere or later GPU would record
    a precision it did not train in, and serve rows further from the CPU's than float32's
    rounding. A run's ``fp32`` means float32; ``bf16`` is the faster precision on offer.
    Nothing changes on a CPU, or under autocast (whose bfloat16 products are not float32
    ones). The settings are the process's: overlapping blocks (threads serving requests)
    share one span, the first sets them and the last puts them back.
    """
    if device.type != "cuda":
        yield
        return
    global _exact_spans
    with _EXACT_LOCK:
        if _exact_spans == 0:
            _exact_restore[:] = _set_ieee_float32()
        _exact_spans += 1
    try:
        yield
    finally:
        with _EXACT_LOCK:
            _exact_spans -= 1
            if _exact_spans == 0:
                for target, name, value in _exact_restore:
                    setattr(target, name, value)


def _set_ieee_float32() -> list[tuple[Any, str, Any]]:
    """Set cuBLAS's and cuDNN's float32 work to IEEE float32; what to put back."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    exact: Any = False
    targets: tuple[Any, Any] = (matmul, cudnn)
    name = "allow_tf32"  # the flags every torch release has
    try:
        saved = (matmul.allow_tf32, cudnn.allow_tf32)
    except RuntimeError:
        # torch >= 2.9 refuses to read them once someone set its per-backend precisions:
        # then use those.
        conv: Any = getattr(cudnn, "conv")  # noqa: B009 (not in every torch's stubs)
        targets, name, exact = (matmul, conv), "fp32_precision", "ieee"
        saved = (matmul.fp32_precision, conv.fp32_precision)
    for target in targets:
        setattr(target, name, exact)
    return [(target, name, value) for target, value in zip(targets, saved, strict=True)]


def device_name(device: torch.device) -> str:
    """What a run records as the device it trained on: ``cpu``, or ``cuda:0 (NVIDIA H200)``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return device.type
