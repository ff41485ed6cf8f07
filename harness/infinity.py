"""Infinity (PyPI's ``infinity-emb``), the text-embedding server a user would pick, as a peer
of corel's ``/embed`` in the benchmarks: in an environment of its own, serving the same
all-MiniLM-L6-v2 files offline, started and stopped by pid.

Infinity pins ``sentence-transformers<4``, ``numpy<2`` and ``uvicorn<0.33``, which corel's own
environment does not satisfy, so :func:`environment` makes a virtual environment for it the
first time (from PyPI, with this environment's torch release, which pip takes from the
machine's cache where it has it) and reuses it after. Version 0.0.78 with its ``server`` and
``torch`` extras; its own dynamic batching (``--batch-size``), the torch engine on the CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from harness.servers import free_port, terminate
from harness.wait import http_status, wait_until

VERSION = "0.0.78"
"""The infinity-emb release measured (the newest on PyPI on 2026-12-04)."""


def environment(root: Path, torch_version: str | None = None) -> Path:
    """The ``infinity_emb`` command of a virtual environment under ``root`` (made and
    installed the first time: a few minutes; ``root/.installed`` marks it done)."""
    import torch

    bin_dir = root / "bin"
    done = root / ".installed"
    if not done.exists():
        venv.create(root, with_pip=True, clear=True)
        wanted = torch_version or torch.__version__.split("+")[0]
        subprocess.run([str(bin_dir / "pip"), "install", "--quiet", f"torch=={wanted}",
                        f"infinity-emb[server,torch]=={VERSION}"], check=True)
        done.write_text(f"torch {wanted}, infinity-emb {VERSION}\n")
    return bin_dir / "infinity_emb"


@dataclass
class Infinity:
    """``infinity_emb v2`` serving ``model`` (a sentence-transformers folder) as ``name`` on
    the CPU, offline; ``url``: its API (``POST /embeddings``, OpenAI's shape)."""

    command: Path
    model: Path
    log: Path
    name: str = "minilm"
    batch_size: int = 32
    threads: int | None = None
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Infinity:
        port = free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = str(self.threads)
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(self.command), "v2", "--model-id", str(self.model), "--served-model-name", self.name,
                 "--engine", "torch", "--device", "cpu", "--batch-size", str(self.batch_size),
                 "--no-bettertransformer", "--host", "127.0.0.1", "--port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"infinity_emb exited with {self.proc.returncode}; its log: {self.log}")
            try:
                return http_status(f"{self.url}/models") == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 300, f"infinity_emb to serve {self.model}", interval=0.5)
        return self

    def embed(self, texts: list[str], client: httpx.Client | None = None) -> list[list[float]]:
        body = {"model": self.name, "input": texts}
        r = (client.post("/embeddings", json=body) if client is not None
             else httpx.post(f"{self.url}/embeddings", json=body, timeout=120))
        r.raise_for_status()
        return [d["embedding"] for d in r.json()["data"]]

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        terminate(self.proc)


if __name__ == "__main__":  # make the environment ahead of a benchmark: python -m harness.infinity DIR
    print(environment(Path(sys.argv[1])))
