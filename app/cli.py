"""Service commands of the ``corel`` CLI: serve, worker, db."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import Any


def register(sub: Any) -> None:
    from app import client_cli

    client_cli.register(sub)
    serve = sub.add_parser(
        "serve",
        help="run the API; with no broker configured, also an embedded broker and worker",
        description="Start the HTTP API. On the embedded default (no COREL_BROKER_URL), the "
        "database is a SQLite file and the broker a SQLite-backed Celery transport in "
        "COREL_VAR_DIR (default ./var); migrations are applied and one Celery worker is "
        "started beside the API, so nothing else needs to run.",
    )
    serve.add_argument("--host", default=os.environ.get("COREL_HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("COREL_PORT", "8000")))
    serve.add_argument("--no-worker", action="store_true", help="do not start the embedded worker")
    serve.set_defaults(func=_serve)

    worker = sub.add_parser("worker", help="run a Celery worker (production)",
                            description="Run one Celery worker that trains queued experiments.")
    worker.add_argument("--concurrency", type=int, default=1)
    worker.add_argument("--pool", default="solo", choices=("solo", "prefork", "threads"))
    worker.set_defaults(func=_worker)

    db = sub.add_parser("db", help="database migrations", description="Alembic migrations.")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="apply migrations up to head (or a revision)")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(func=_db_upgrade)
    check = db_sub.add_parser("check", help="fail if the models and migrations disagree")
    check.set_defaults(func=_db_check)


def worker_command(concurrency: int = 1, pool: str = "solo") -> list[str]:
    from app.settings import get_settings

    return [
        sys.executable, "-m", "celery", "-A", "worker.celery_app:celery", "worker",
        "--pool", pool, "--concurrency", str(concurrency), "-Q", get_settings().queue,
        "--loglevel", "INFO", "--without-gossip", "--without-mingle",
    ]


def _worker(args: argparse.Namespace) -> int:
    os.execv(sys.executable, worker_command(args.concurrency, args.pool))
    return 0  # not reached


def _db_upgrade(args: argparse.Namespace) -> int:
    from app.migrate import upgrade
    from app.settings import get_settings

    upgrade(get_settings(), args.revision)
    print("database is at", args.revision)
    return 0


def _db_check(args: argparse.Namespace) -> int:
    from app.migrate import check
    from app.settings import get_settings

    check(get_settings())
    print("models and migrations agree")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.migrate import upgrade
    from app.settings import get_settings

    settings = get_settings()
    embedded = not settings.broker_url
    if embedded or settings.is_sqlite:
        upgrade(settings)
    worker = None
    if embedded and not args.no_worker:
        worker = subprocess.Popen(worker_command())
    try:
        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_config=None)
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    return 0
