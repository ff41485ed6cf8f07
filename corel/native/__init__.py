"""corel's fused autograd nodes compiled, and the training steps built from them:
``fused.cpp`` beside this file, built once per environment by ``python -m corel.native
build`` (``make install`` runs it). The steps (:mod:`corel.train.native_step`) run a whole Adam step of
a Gaussian-COREL FFNN, solo or stacked, as one call without an autograd graph.

The C++ nodes make the same ATen calls in the same order as their Python twins in
:mod:`corel.fused`, so a run gives the same numbers bit for bit with or without them
(``tests/corel/test_fused.py`` checks both against autograd on the plain modules). They
save the per-operation Python of a step: on a 2-core CPU, where a small operation's
Python costs as much as its arithmetic, that is about a tenth of the paper's FFNN step.

:func:`module` is the built extension, or None where it was not built for this Python,
this torch and this source (a build is keyed by all three, so a stale one never loads),
or where ``COREL_NATIVE`` is ``0`` (or ``off``, ``false``, ``no``, as the service's settings
read it; empty or unset: on); the Python nodes run then. ``COREL_NATIVE_DIR`` says where
builds live (default: ``<sys.prefix>/corel-native``, inside the virtual environment).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["build", "build_path", "module"]

OFF = ("0", "off", "false", "no")  # COREL_CUDA_GRAPHS's words (corel.train.graphs)

SOURCE = Path(__file__).with_name("fused.cpp")
NAME = "corel_native"  # the PYBIND11_MODULE's name: its init function is PyInit_corel_native


def _command(source: Path, target: Path) -> list[str]:
    # torch's headers and libraries as torch.utils.cpp_extension finds them (without
    # importing it: it needs setuptools, which a service-only environment may lack).
    root = Path(torch.__file__).parent
    include = [str(root / "include"), str(root / "include" / "torch" / "csrc" / "api" / "include"),
               sysconfig.get_paths()["include"]]
    libraries = [str(root / "lib")]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        os.environ.get("CXX", "g++"), "-O2", "-std=c++20", "-shared", "-fPIC", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(f"-I{p}" for p in include), str(source), "-o", str(target),
        *(f"-L{p}" for p in libraries), *(f"-Wl,-rpath,{p}" for p in libraries),
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
    ]


def build_path() -> Path:
    """Where this environment's build of the current source lives (whether or not built)."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    for part in (torch.__version__, str(torch.version.git_version), sys.version,
                 sysconfig.get_config_var("EXT_SUFFIX") or ""):
        key.update(part.encode())
    root = Path(os.environ.get("COREL_NATIVE_DIR") or Path(sys.prefix) / "corel-native")
    return root / f"{NAME}-{key.hexdigest()[:16]}.so"


def build(*, force: bool = False) -> Path:
    """Compile ``fused.cpp`` for this Python and torch (about 40 seconds on 2 cores) unless
    already built; returns the built file. Raises RuntimeError with the compiler's output
    when it fails."""
    target = build_path()
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compiled beside the target, then renamed: a reader never sees half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        partial = Path(scratch) / target.name
        command = _command(SOURCE, partial)
        print(f"corel.native: compiling {SOURCE.name} -> {target}", flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"corel.native: the compiler failed ({shlex.join(command[:1])}, exit "
                               f"{done.returncode}):\n{done.stderr[-4000:]}")
        os.replace(partial, target)
    module.cache_clear()
    return target


def enabled() -> bool:
    """Whether ``COREL_NATIVE`` leaves the compiled nodes on (unset or empty: on)."""
    return os.environ.get("COREL_NATIVE", "").strip().lower() not in OFF


@functools.cache
def module() -> ModuleType | None:
    """The built extension (``gaussian_ar``, ``leaky_mlp``, ``squared_distance_backward``,
    ``gaussian_mlp_step``, ``stacked_gaussian_mlp_step``), or None (see the module)."""
    if not enabled():
        return None
    path = build_path()
    if not path.exists():
        return None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    if spec is None:
        return None
    extension = importlib.util.module_from_spec(spec)
    loader.exec_module(extension)
    return extension
