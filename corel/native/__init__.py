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
or where the caller turned it off (:func:`using`: the training engine's options,
:class:`corel.train.EngineOptions`, do it for a run); the Python nodes run then. Builds live
in the directory the caller names (default: ``<sys.prefix>/corel-native``, inside the
virtual environment). Nothing here reads the environment: ``python -m corel.native`` (its
CLI) and the service's settings pass what they read.
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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["build", "build_path", "forget", "module", "using"]

SOURCE = Path(__file__).with_name("fused.cpp")
NAME = "corel_native"  # the PYBIND11_MODULE's name: its init function is PyInit_corel_native


Directory = str | os.PathLike[str] | None

# (on, build directory) for the code running now: set by using(), read by module().
_CHOICE: ContextVar[tuple[bool, str | None]] = ContextVar("corel_native", default=(True, None))


def _command(source: Path, target: Path, cxx: str) -> list[str]:
    # torch's headers and libraries as torch.utils.cpp_extension finds them (without
    # importing it: it needs setuptools, which a service-only environment may lack).
    root = Path(torch.__file__).parent
    include = [str(root / "include"), str(root / "include" / "torch" / "csrc" / "api" / "include"),
               sysconfig.get_paths()["include"]]
    libraries = [str(root / "lib")]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        cxx, "-O2", "-std=c++20", "-shared", "-fPIC", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(f"-I{p}" for p in include), str(source), "-o", str(target),
        *(f"-L{p}" for p in libraries), *(f"-Wl,-rpath,{p}" for p in libraries),
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
    ]


def root(directory: Directory = None) -> Path:
    """The directory builds live in: ``directory``, or ``<sys.prefix>/corel-native``."""
    return Path(directory) if directory else Path(sys.prefix) / "corel-native"


@functools.cache
def _digest(source: str) -> str:
    key = hashlib.sha256()
    key.update(Path(source).read_bytes())
    for part in (torch.__version__, str(torch.version.git_version), sys.version,
                 sysconfig.get_config_var("EXT_SUFFIX") or ""):
        key.update(part.encode())
    return key.hexdigest()[:16]


def build_path(directory: Directory = None) -> Path:
    """Where this environment's build of the current source lives in ``directory`` (see
    :func:`root`), whether or not built."""
    return root(directory) / f"{NAME}-{_digest(str(SOURCE))}.so"


def build(directory: Directory = None, *, force: bool = False, cxx: str = "g++") -> Path:
    """Compile ``fused.cpp`` with ``cxx`` for this Python and torch (about 40 seconds on 2
    cores) into ``directory`` unless already built; returns the built file. Raises
    RuntimeError with the compiler's output when it fails."""
    target = build_path(directory)
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compiled beside the target, then renamed: a reader never sees half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        partial = Path(scratch) / target.name
        command = _command(SOURCE, partial, cxx)
        print(f"corel.native: compiling {SOURCE.name} -> {target}", flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"corel.native: the compiler failed ({shlex.join(command[:1])}, exit "
                               f"{done.returncode}):\n{done.stderr[-4000:]}")
        os.replace(partial, target)
    forget()
    return target


@contextmanager
def using(on: bool = True, directory: Directory = None) -> Iterator[None]:
    """Within the block (this thread or task), :func:`module` is the build in ``directory``,
    or None where ``on`` is False."""
    token = _CHOICE.set((on, str(directory) if directory else None))
    try:
        yield
    finally:
        _CHOICE.reset(token)


def module() -> ModuleType | None:
    """The built extension (``gaussian_ar``, ``leaky_mlp``, ``squared_distance_backward``,
    ``gaussian_mlp_step``, ``stacked_gaussian_mlp_step``), or None (see the module)."""
    on, directory = _CHOICE.get()
    return _load(directory) if on else None


def forget() -> None:
    """Drop what was loaded and hashed: the next :func:`module` looks again."""
    _load.cache_clear()
    _digest.cache_clear()


@functools.cache
def _load(directory: str | None) -> ModuleType | None:
    path = build_path(directory)
    if not path.exists():
        return None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    if spec is None:
        return None
    extension = importlib.util.module_from_spec(spec)
    loader.exec_module(extension)
    return extension
