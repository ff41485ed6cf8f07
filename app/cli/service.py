"""Service commands of the ``corel`` CLI: serve, worker, db, reproduce."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

REPRODUCTION_DOC = "reproduction.md"
"""Where ``corel reproduce --all`` and ``--peers`` write their tables unless ``--doc`` names a
file: the working directory, never a checkout's docs (the project's own page is updated by
naming it)."""


def register(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the API; with no broker configured, also an embedded broker and worker",
        description="Start the HTTP API. On the embedded default (no COREL_BROKER_URL), the "
        "database is a SQLite file and the broker a SQLite-backed Celery transport in "
        "COREL_VAR_DIR (default ./var); migrations are applied and one Celery worker is "
        "started beside the API, so nothing else needs to run.",
    )
    serve.add_argument("--host", default=os.environ.get("COREL_HOST", "127.0.0.1"),
                       help="address to listen on (default: $COREL_HOST, else 127.0.0.1)")
    serve.add_argument("--port", type=int, default=int(os.environ.get("COREL_PORT", "8000")),
                       help="port to listen on (default: $COREL_PORT, else 8000)")
    serve.add_argument("--no-worker", action="store_true", help="do not start the embedded worker")
    serve.set_defaults(func=_serve)

    worker = sub.add_parser("worker", help="run a Celery worker (production)",
                            description="Run one Celery worker that trains queued experiments.")
    worker.add_argument("--concurrency", type=int, default=1)
    worker.add_argument("--pool", default="solo", choices=("solo", "prefork", "threads"))
    worker.set_defaults(func=_worker)

    rep = sub.add_parser(
        "reproduce",
        help="run the paper's sweep for a dataset x model and print its tables beside the paper's",
        description="Create a sweep (losses x lambdas x seeds) through a running service "
        "(--url) or through an embedded one started for the occasion, wait for it, and print "
        "the report: lambda tuning, test accuracy (mean +- std over seeds, paired t-test) and "
        "clustering scores, with the paper's Table 1 figures and the difference in points.",
    )
    rep.add_argument("--all", action="store_true",
                     help="the whole Table 1 matrix (every dataset x model): a tune sweep and a "
                     "final sweep per row, resumable, tables written into --doc")
    rep.add_argument("--peers", action="store_true",
                     help="every loss, the paper's four and pytorch-metric-learning's seven, on "
                     "MNIST, Fashion-MNIST and AG News (FFNN): a tune sweep per loss over its "
                     "grid, then its seeds; resumable, the table written into --doc")
    rep.add_argument("--budget", default="session", choices=("paper", "session", "smoke"),
                     help="with --all or --peers: epochs, seeds and grids per row (default: session)")
    rep.add_argument("--rows", help="with --all: only these rows of the budget, comma-separated "
                     "dataset/model keys (e.g. mnist/ffnn,fashion-mnist/ffnn)")
    rep.add_argument("--state",
                     help="with --all or --peers: the file that remembers the sweeps, so that "
                     "running the command again resumes (default: ./reproduce-state.json, "
                     "./reproduce-peers-state.json with --peers)")
    rep.add_argument("--doc", default=REPRODUCTION_DOC,
                     help="with --all or --peers: the Markdown file the tables go into, between "
                     "their budget's markers, the rest of it kept (default: ./reproduction.md in "
                     "the working directory; a checkout's docs/reproduction.md is the project's "
                     "own page, written only when named)")
    rep.add_argument("--dataset", choices=("fashion-mnist", "mnist", "ag-news", "digits"))
    rep.add_argument("--model", default="ffnn", choices=("ffnn", "cnn"))
    rep.add_argument("--losses", default="cce,center,cosine,gaussian",
                     help="comma-separated losses (default: all four)")
    rep.add_argument("--lambdas", default="0.15,0.5,0.85", help="comma-separated lambdas")
    rep.add_argument("--seeds", type=int, default=3, help="number of seeds (0..N-1)")
    rep.add_argument("--epochs", type=int, default=30)
    rep.add_argument("--lr", type=float, default=1e-4)
    rep.add_argument("--batch-size", type=int, default=128)
    rep.add_argument("--train-subset", type=int, help="use only the first N training samples")
    rep.add_argument("--no-clustering", action="store_true", help="skip the clustering tables")
    rep.add_argument("--url", default=os.environ.get("COREL_URL"),
                     help="a running service (default: start an embedded one in COREL_VAR_DIR)")
    rep.add_argument("--token", default=os.environ.get("COREL_API_TOKEN"))
    rep.add_argument("--out", help="also write the Markdown report to this file")
    rep.set_defaults(func=_reproduce)

    db = sub.add_parser("db", help="database migrations", description="Alembic migrations.")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="apply migrations up to head (or a revision)")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=_db_upgrade)
    check = db_sub.add_parser("check", help="fail if the models and migrations disagree")
    check.set_defaults(func=_db_check)

    gc = sub.add_parser(
        "gc", help="remove the artifacts no row references",
        description="Remove from the artifact store (COREL_ARTIFACTS) every artifact that no "
        "row references and that is older than the grace period: what a process that died "
        "between writing an artifact and committing its row left behind. SQLite gives its "
        "free pages back too.")
    gc.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                    help="spare artifacts younger than this (default COREL_ARTIFACT_GC_GRACE_SECONDS)")
    gc.set_defaults(func=_gc)


def worker_command(concurrency: int = 1, pool: str = "solo") -> list[str]:
    from app.core.settings import get_settings

    return [
        sys.executable, "-m", "celery", "-A", "worker.celery_app:celery", "worker",
        "--pool", pool, "--concurrency", str(concurrency), "-Q", get_settings().queue,
        "--loglevel", "INFO", "--without-gossip", "--without-mingle",
    ]


def _worker(args: argparse.Namespace) -> int:
    from app.core.settings import get_settings
    from app.jobs.workers import worker_environ

    os.nice(get_settings().worker_nice)  # the API's answers first, where they share the cores
    # OpenMP's wait policy is read when torch loads: in the worker's own environment.
    os.execve(sys.executable, worker_command(args.concurrency, args.pool), worker_environ(os.environ))
    return 0  # not reached


def _db_upgrade(args: argparse.Namespace) -> int:
    from app.core.migrate import upgrade
    from app.core.settings import get_settings

    upgrade(get_settings(), args.revision)
    print("database is at", args.revision)
    return 0


def _db_check(args: argparse.Namespace) -> int:
    from app.core.migrate import check
    from app.core.settings import get_settings

    check(get_settings())
    print("models and migrations agree")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from app.core.db import make_engine, make_sessionmaker
    from app.core.settings import get_settings
    from app.storage import make_store
    from app.storage.refs import collect, give_back_pages

    settings = get_settings()
    store = make_store(settings)
    store.check()
    grace = settings.artifact_gc_grace_seconds if args.grace is None else args.grace
    engine = make_engine(settings.db_url)
    try:
        with make_sessionmaker(engine)() as session:
            done = collect(session, store, grace, features_keep_seconds=settings.features_keep_days * 86400.0)
            give_back_pages(session)
    finally:
        engine.dispose()
    print(f"removed {done.removed} artifacts ({done.freed_bytes / 1e6:.1f} MB); kept "
          f"{done.kept} that rows reference and {done.spared_young} younger than {grace:g} s"
          + (f"; dropped {done.features_dropped} kept features unused for {settings.features_keep_days:g} days"
             if done.features_dropped else ""))
    return 0


def _exit_on_sigterm(code: int | None = None) -> None:
    """SIGTERM raises SystemExit (``code``, else 128 + 15), so that ``finally`` blocks stop
    what this process started.

    Python's default SIGTERM action ends the process at once. uvicorn restores the
    handler it found and raises the signal again after its own shutdown, so without
    this, `corel serve` stopped by SIGTERM left its embedded worker running. That
    raise comes inside uvicorn's event loop, whose run returns next: there the handler
    lets it return (a SystemExit raised in the loop was logged as a traceback).
    """
    def stop(signum: int, _: Any) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not inside the server's loop: stop here
            sys.exit(128 + signum if code is None else code)

    signal.signal(signal.SIGTERM, stop)


def _stop_with_make() -> None:
    """Where ``make serve`` runs this process (make its parent), stop when make alone is told
    to: GNU make passes a SIGTERM on to its recipe, but on a SIGINT it waits for the recipe to
    end, since a terminal's Ctrl-C reaches the whole process group; a SIGINT sent to make
    alone (``kill -INT``, a supervisor) left the service running and make waiting for ever.
    Make shows that it got one by catching it no more (its handler resets the signal while
    it waits: ``SigCgt`` in /proc), and this process then stops as on a SIGTERM (not a
    second SIGINT: after a Ctrl-C, uvicorn takes one as "cut every connection now"); it
    stops too if make is gone. Linux only: elsewhere, nothing is watched."""
    make = os.getppid()
    try:
        if Path(f"/proc/{make}/comm").read_text().strip() not in ("make", "gmake"):
            return
    except OSError:
        return
    watched = _caught(make) & {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}

    def watch() -> None:
        while os.getppid() == make and watched <= _caught(make):
            time.sleep(0.25)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="corel-stop-with-make", daemon=True).start()


def _caught(pid: int) -> set[int]:
    """The signals a process catches (its handlers), from /proc/<pid>/status; none if gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def _cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (taken, or not an address of this host), or
    None. Checked before anything starts, so that the answer is one line, not a traceback
    after "the dashboard is at ..."."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            return (exc.strerror or str(exc)).lower()
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a --host value) is reachable only from this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def open_to_the_network(settings: Any, host: str) -> str | None:
    """Why the API must not listen on ``host``: with no COREL_API_TOKEN and no users it
    is open to anyone who reaches it (app.access.tokens's open mode), which only the loopback
    keeps to this machine. None when it may."""
    if settings.api_token is not None or is_loopback(host):
        return None
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from app.core.db import make_engine, make_sessionmaker
    from app.core.models import User

    engine = make_engine(settings.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            if session.scalar(select(User.id).limit(1)) is not None:
                return None
        why = "it has no COREL_API_TOKEN and no users, so anyone who reaches it could use it"
    except SQLAlchemyError as exc:
        why = (f"it has no COREL_API_TOKEN and whether it has users is unknown (the database "
               f"answered {type(exc).__name__}; run `corel db upgrade`)")
    finally:
        engine.dispose()
    return (f"{why}. Set COREL_API_TOKEN (the admin token), or create an admin user "
            "(`corel users add NAME --admin`, then `corel tokens create NAME --scope admin`), "
            "or listen on the loopback only (--host 127.0.0.1)")


def _serve(args: argparse.Namespace) -> int:
    from app.core.migrate import upgrade
    from app.core.settings import get_settings

    problem = _cannot_listen(args.host, args.port)
    if problem:
        print(f"corel: cannot listen on {args.host}:{args.port}: {problem}; choose another port "
              "with --port N or COREL_PORT=N (or another address with --host, COREL_HOST)",
              file=sys.stderr)
        return 1
    settings = get_settings()
    embedded = not settings.broker_url
    if embedded or settings.is_sqlite:
        upgrade(settings)
    refused = open_to_the_network(settings, args.host)
    if refused:  # said before torch and the app are imported (5 of a refusal's 6 s)
        print(f"corel: refusing to serve on {args.host}: {refused}", file=sys.stderr)
        return 2
    import torch
    import uvicorn

    from app.main import create_app

    torch.set_num_threads(settings.api_torch_threads)
    worker = None
    _exit_on_sigterm(0)  # stopping a server is no failure (make serve said "Error 143")
    _stop_with_make()
    if embedded and not args.no_worker:
        from app.jobs.workers import worker_environ

        # Born ignoring SIGINT (the ignoring survives exec, and Python keeps it): a Ctrl-C
        # while it still imports ended it in a KeyboardInterrupt traceback. Celery installs
        # its own SIGINT handler once up; until then this process stops it, with SIGTERM.
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            nice = settings.worker_nice
            worker = subprocess.Popen(worker_command(), env=worker_environ(os.environ),
                                      preexec_fn=lambda: os.nice(nice))
        finally:
            signal.signal(signal.SIGINT, interrupt)
    try:
        print(f"corel: the dashboard is at http://{args.host}:{args.port}/ (the API's docs at /docs)",
              file=sys.stderr, flush=True)
        # Open event streams would hold a graceful shutdown up for as long as their
        # clients stay; they are cut after a few seconds and resume from Last-Event-ID.
        # No access log: the API logs each request itself (corel.api), once.
        if settings.api_processes > 1:  # uvicorn's workers: each builds the app from the environment
            uvicorn.run("app.main:create_app", factory=True, workers=settings.api_processes,
                        host=args.host, port=args.port, log_config=None, timeout_graceful_shutdown=5,
                        access_log=False)
        else:
            uvicorn.run(create_app(settings), host=args.host, port=args.port, log_config=None,
                        timeout_graceful_shutdown=5, access_log=False)
    finally:
        if worker is not None:
            _stop_worker(worker)
    return 0


def _stop_worker(worker: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Stop the embedded worker (SIGTERM, Celery's warm shutdown; SIGKILL after ``timeout``
    seconds), with this process deaf to SIGTERM and SIGINT meanwhile: it is stopping already,
    and a signal then cut the stop short. `make serve` sends two: make passes its SIGTERM on,
    and this process's own watch on make (:func:`_stop_with_make`) sends another once make
    stops catching signals; the second one, raised as SystemExit inside this wait (or before
    the worker's SIGTERM), ended the service and left its worker running, orphaned. The
    handlers are put back once the worker has ended."""
    kept = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def _embedded_service() -> tuple[subprocess.Popen[bytes], str]:
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "corel.cli", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=2) as http:  # one client for the polls (TLS context and all)
        for _ in range(600):
            try:
                if http.get(f"{url}/ready").status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    raise SystemExit("corel: the embedded service did not start (try `corel serve` to see why)")


@contextmanager
def _service_client(args: argparse.Namespace, timeout: float) -> Iterator[httpx.Client]:
    """A client of ``--url`` (with ``--token``), else of an embedded service started for the
    occasion and stopped at the end, SIGTERM included."""
    import httpx

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    proc = None
    url = args.url
    _exit_on_sigterm()
    if not url:
        proc, url = _embedded_service()
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout) as client:
            yield client
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def _reproduce(args: argparse.Namespace) -> int:
    import platform

    if args.peers:
        return _reproduce_peers(args)
    if args.all:
        return _reproduce_all(args)
    if not args.dataset:
        raise SystemExit("corel reproduce: give --dataset, or --all for the whole matrix")

    losses = [x.strip() for x in args.losses.split(",") if x.strip()]
    try:
        lambdas = [float(x) for x in args.lambdas.split(",") if x.strip()]
    except ValueError as exc:
        raise SystemExit(f"corel: --lambdas must be comma-separated numbers: {exc}") from exc
    base = {"dataset": args.dataset, "model": args.model, "epochs": args.epochs, "lr": args.lr,
            "batch_size": args.batch_size}
    if args.train_subset:
        base["train_subset"] = args.train_subset
    body = {"base": base, "grid": {"loss": losses, "lam": lambdas, "seed": list(range(args.seeds))}}
    started = time.monotonic()
    with _service_client(args, timeout=3600) as client:
        r = client.post("/sweeps", json=body)
        if r.status_code != 202:
            raise SystemExit(f"corel: {r.status_code}: {r.json().get('detail', r.text)}")
        sweep = r.json()
        print(f"sweep {sweep['id']}: {sweep['size']} experiments in {sweep['groups']} tasks "
              f"on {client.base_url}", file=sys.stderr)
        while True:
            progress = client.get(f"/sweeps/{sweep['id']}").json()
            c = progress["counts"]
            print(f"\r{progress['done']}/{progress['size']} done  (running {c['running']}, "
                  f"queued {c['queued']}, failed {c['failed']})  "
                  f"{time.monotonic() - started:.0f}s", end="", file=sys.stderr, flush=True)
            if progress["finished"]:
                break
            time.sleep(5)
        print(file=sys.stderr)
        params = {"format": "markdown", "clustering": str(not args.no_clustering).lower()}
        text = client.get(f"/sweeps/{sweep['id']}/report", params=params).text
    wall = time.monotonic() - started
    footer = (f"\nCommand: corel reproduce --dataset {args.dataset} --model {args.model} "
              f"--losses {args.losses} --lambdas {args.lambdas} --seeds {args.seeds} "
              f"--epochs {args.epochs} --lr {args.lr} --batch-size {args.batch_size}"
              + (f" --train-subset {args.train_subset}" if args.train_subset else "")
              + f"\nMachine: {platform.node()} ({os.cpu_count()} cores, {platform.machine()}, "
              f"Python {platform.python_version()}); wall time {wall / 60:.1f} min\n")
    print(text + footer)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + footer)
    return 0


def _reproduce_peers(args: argparse.Namespace) -> int:
    from app.cli.peers import BUDGETS, PeerReproduction, markers, render

    rows = BUDGETS[args.budget]
    command = f"corel reproduce --peers --budget {args.budget}"
    with _service_client(args, timeout=600) as client:
        rep = PeerReproduction(client, rows, Path(args.state or "reproduce-peers-state.json"))
        started = time.monotonic()
        while not rep.step():
            print(f"\r{rep.progress()}  {time.monotonic() - started:.0f}s", end="",
                  file=sys.stderr, flush=True)
            time.sleep(5)
        print(file=sys.stderr)
    block = render(rep.state, args.budget, command)
    _write_tables(Path(args.doc), block, args.budget, markers(args.budget))
    print(block)
    return 0


def _reproduce_all(args: argparse.Namespace) -> int:
    from app.cli.reproduce import Reproduction, render, select_rows

    try:
        rows = select_rows(args.budget, args.rows)
    except ValueError as exc:
        raise SystemExit(f"corel reproduce: {exc}") from exc
    command = f"corel reproduce --all --budget {args.budget}" + (f" --rows {args.rows}" if args.rows else "")
    with _service_client(args, timeout=600) as client:
        rep = Reproduction(client, rows, Path(args.state or "reproduce-state.json"))
        started = time.monotonic()
        while not rep.step():
            print(f"\r{rep.progress()}  {time.monotonic() - started:.0f}s", end="",
                  file=sys.stderr, flush=True)
            time.sleep(5)
        print(file=sys.stderr)
    block = render(rep.state, args.budget, command)
    _write_tables(Path(args.doc), block, args.budget)
    print(block)
    return 0


def _write_tables(doc: Path, block: str, budget: str, marks: tuple[str, str] | None = None) -> None:
    """The block into ``doc`` (:func:`app.cli.reproduce.write_block`), saying where it went
    (or why it could not)."""
    from app.cli.reproduce import write_block

    try:
        write_block(doc, block, budget, marks)
    except OSError as exc:
        raise SystemExit(f"corel reproduce: cannot write the tables into {doc} ({exc.strerror}); "
                         "name a writable file with --doc") from exc
    print(f"the tables are in {doc.resolve()}", file=sys.stderr)
