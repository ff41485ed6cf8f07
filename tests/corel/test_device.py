"""corel.device: the float32 settings a CUDA run's span takes (``ieee_float32``). Plain
process settings, read and set without a GPU (tests/gpu shows what they do to a product
there); no figure here comes out of a kernel, so make test runs it once."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


@pytest.fixture
def backend_settings():
    """cuBLAS's and cuDNN's float32 settings as the process had them, put back after (they
    are plain process settings: they can be set and read without a GPU)."""
    saved = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    yield
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


def test_ieee_float32_turns_tf32_off_on_cuda_for_its_span_and_puts_the_settings_back(backend_settings):
    """(The GPU tests show what the settings do to a product and a convolution there.)"""
    import threading

    from corel.device import ieee_float32

    cuda = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    with ieee_float32(torch.device("cpu")):  # a CPU run leaves them alone
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    # Two threads' overlapping spans: TF32 stays off until the last one ends.
    first_in, second_done = threading.Event(), threading.Event()
    seen: list[tuple[bool, bool]] = []

    def first() -> None:
        with ieee_float32(cuda):
            first_in.set()
            second_done.wait(5)
            seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))

    worker = threading.Thread(target=first)
    worker.start()
    assert first_in.wait(5)
    with ieee_float32(cuda), ieee_float32(cuda):  # nested too
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
    second_done.set()
    worker.join(5)
    assert seen == [(False, False), (False, False)]
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    # A process that set torch's per-backend precisions alone (whose older flags then refuse
    # to be read) gets those set to IEEE float32 and put back: a fresh process of its own.
    code = """
import torch
from corel.device import ieee_float32
torch.backends.cuda.matmul.fp32_precision = "tf32"
torch.backends.cudnn.conv.fp32_precision = "tf32"
with ieee_float32(torch.device("cuda")):
    print(torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
print(torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["ieee ieee", "tf32 tf32"]
