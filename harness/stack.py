"""corel running, for a benchmark or a test to call over HTTP: an API and its workers on a
database, a broker and an artifact store.

One ``Stack`` whichever way it was started:

* ``Stack.embedded(root)``: ``corel serve`` on the embedded default in ``root/var`` (SQLite,
  the embedded broker and worker), what ``make serve`` runs;
* ``Stack.postgres(root, workers=N)``: a PostgreSQL database and a Redis database of its
  own, ``corel serve --no-worker`` and N ``corel worker`` processes, what a deployment runs;
* ``Stack.attached(url, settings)``: one somebody else started and stops (the test
  session's: its app served in the test process, its workers), which a benchmark's
  ``main(argv, stack=...)`` uses instead of starting its own;
* ``Stack.on(settings, logdir)``: corel's processes on servers somebody else runs (a test's
  own database, the fault tests' and the soak's private PostgreSQL and Redis), started one
  by one with :meth:`Stack.start_worker` and :meth:`Stack.start_api`, and stopped or killed
  one by one (:meth:`Stack.stop`, :meth:`Stack.kill`): the tests that kill workers, the
  fault benchmark, the soak.

This module is the one place that starts a corel process (:func:`spawn`: ``python -m
corel.cli ...`` in a session of its own, its output in a log file) and the one that turns
settings into the environment it reads (:func:`corel_env`); the cluster's hosts
(``harness/hosts.py``) start theirs through it too, inside their namespaces.

A stack this module started is stopped by its processes' pids (``close``, or the ``with``
block's end); its database is dropped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from harness.servers import free_port, terminate
from harness.wait import http_status, wait_until

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS = "redis://127.0.0.1:6379"


@dataclass
class Stack:
    """A running corel: ``url`` (its API), ``settings`` (the processes' own: the database,
    the broker, the artifact store), and ``api_pid`` (the process that answers ``url``)."""

    url: str
    settings: Any  # app.core.settings.Settings (imported late: harness imports no app at import)
    api_pid: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _drop: tuple[str, str] | None = None  # (admin URL, database) of a database made for it
    logdir: Path | None = None  # where start_worker and start_api write their logs

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 80)

    @classmethod
    def attached(cls, url: str, settings: Any, api_pid: int | None = None) -> Stack:
        """A stack started elsewhere (its owner stops it): by default its API in this process."""
        return cls(url=url, settings=settings, api_pid=os.getpid() if api_pid is None else api_pid)

    @classmethod
    def on(cls, settings: Any, logdir: Path) -> Stack:
        """corel on ``settings``' database, broker and store (run by somebody else), with no
        process of its own yet: :meth:`start_worker` and :meth:`start_api` start them."""
        logdir.mkdir(parents=True, exist_ok=True)
        return cls(url="", settings=settings, api_pid=0, logdir=logdir)

    @classmethod
    def embedded(cls, root: Path, **env: str) -> Stack:
        """``corel serve`` on the embedded default in ``root/var``; ``env``: COREL_* beside it."""
        from app.core.settings import Settings

        var = root / "var"
        port = free_port()
        settings = Settings(var_dir=var)
        environ = {**corel_env(settings, COREL_LOG_LEVEL="WARNING"), **env}
        stack = cls(url=f"http://127.0.0.1:{port}", settings=settings, api_pid=0, logdir=root)
        api = stack._start(["serve", "--port", str(port)], environ, root / "serve.log")
        stack.api_pid = api.pid
        stack._ready(root / "serve.log")
        return stack

    @classmethod
    def postgres(cls, root: Path, workers: int = 1, admin_url: str | None = None, redis_url: str | None = None,
                 **env: str) -> Stack:
        """A database and a Redis database of its own, ``corel serve --no-worker`` and
        ``workers`` worker processes; ``env``: COREL_* beside them. The database is migrated
        (as ``corel db upgrade``) before anything starts."""
        import psycopg

        from app.core.migrate import upgrade
        from app.core.settings import Settings

        admin = admin_url or os.environ.get("COREL_BENCH_PG_ADMIN_URL") or PG_ADMIN
        broker = redis_url or f"{os.environ.get('COREL_BENCH_REDIS') or REDIS}/13"
        name = f"corel_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        database = f"{admin.rsplit('/', 1)[0]}/{name}"
        port = free_port()
        settings = Settings(database_url=database, broker_url=broker, var_dir=root / "var",
                            queue=f"corel-bench-{name}")
        environ = {**corel_env(settings, COREL_LOG_LEVEL="WARNING"), **env}
        stack = cls(url=f"http://127.0.0.1:{port}", settings=settings, api_pid=0, _drop=(admin, name),
                    logdir=root)
        try:
            upgrade(settings)
            api = stack._start(["serve", "--no-worker", "--port", str(port)], environ, root / "api.log")
            stack.api_pid = api.pid
            for k in range(workers):
                stack._start(["worker"], environ, root / f"worker-{k}.log")
            stack._ready(root / "api.log")
        except BaseException:
            stack.close()
            raise
        return stack

    def _start(self, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        proc = spawn(args, env, log)
        self.procs.append(proc)
        return proc

    def _log(self, name: str) -> Path:
        assert self.logdir is not None, "a stack attached to another's processes starts none"
        return self.logdir / f"{name}-{len(self.procs)}.log"

    def start_worker(self, settings: Any = None, *, python_path: Path | None = None,
                     ready_timeout: float | None = 120.0,
                     env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A ``corel worker`` of the stack's settings, or of ``settings`` (another queue, ...);
        ``python_path``: a folder importable there too (a plugin's); ``env``: variables beside.

        Returns once the worker consumes its queue (Celery's "ready." in its log; None: at
        once). Work submitted before then races every other live worker's reconciler, which
        sends a row nobody claimed within a lease to its own queue: a booting worker (torch's
        import alone takes seconds) can lose its run to another."""
        env = env or {}
        environ = corel_env(settings if settings is not None else self.settings, **env)
        if ready_timeout is not None and "COREL_LOG_LEVEL" not in env:
            environ["COREL_LOG_LEVEL"] = "INFO"  # Celery's "ready." is an INFO line
        if python_path is not None:
            environ["PYTHONPATH"] = f"{python_path}{os.pathsep}{environ['PYTHONPATH']}"
        log = self._log("worker")
        proc = self._start(["worker"], environ, log)
        if ready_timeout is not None:
            worker_ready(proc, log, ready_timeout)
        return proc

    def start_api(self, port: int | None = None, *, ready_timeout: float | None = 60.0,
                  env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``corel serve --no-worker`` of the stack's settings on ``port`` (a free one by
        default), which becomes the stack's ``url``; returns once /health answers."""
        port = port or (self.port if self.url else free_port())
        log = self._log("api")
        proc = self._start(["serve", "--no-worker", "--port", str(port)],
                           corel_env(self.settings, **(env or {})), log)
        self.url, self.api_pid = f"http://127.0.0.1:{port}", proc.pid
        if ready_timeout is not None:
            def answers() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"the API exited ({proc.returncode}); see {log}")
                return http_status(f"{self.url}/health", timeout=1) == 200

            wait_until(answers, ready_timeout, f"the API to answer /health; see {log}",
                       interval=0.1, ignore=(httpx.HTTPError,))
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[bytes] | None, grace: float = 30) -> None:
        """SIGTERM (a warm shutdown for a worker), SIGKILL after ``grace`` seconds."""
        if proc is not None:
            terminate(proc, grace=grace)

    @staticmethod
    def kill(proc: subprocess.Popen[bytes] | None) -> None:
        """SIGKILL the process's group (one that has already exited: nothing to do)."""
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=30)

    def logs(self, tail: int | None = 3000) -> str:
        """The stack's logs (their last ``tail`` characters each)."""
        if self.logdir is None:
            return ""
        texts = (p.read_text(errors="replace") for p in sorted(self.logdir.glob("*.log")))
        return "\n".join(t[-tail:] if tail else t for t in texts)

    def _ready(self, log: Path) -> None:
        def ready() -> bool:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}); see {log}")
            return http_status(f"{self.url}/ready") == 200

        wait_until(ready, 90, f"the service to be ready; see {log}", interval=0.2, ignore=(httpx.HTTPError,))

    def checkpoint(self, experiment_id: int, kind: str = "best") -> dict[str, Any]:
        """An experiment's checkpoint as its worker stored it (the row's digest, read from
        the stack's artifact store)."""
        from sqlalchemy import create_engine, text

        from app.storage import make_store
        from corel.train import checkpoint_from_bytes

        engine = create_engine(self.settings.database_url)
        try:
            with engine.connect() as conn:
                digest = conn.execute(text("SELECT sha256 FROM checkpoints WHERE experiment_id = :e "
                                           "AND kind = :k"), {"e": experiment_id, "k": kind}).scalar_one()
        finally:
            engine.dispose()
        return checkpoint_from_bytes(make_store(self.settings).read_bytes(digest))

    def close(self) -> None:
        """Stops what this module started (SIGTERM, then SIGKILL) and drops its database."""
        for proc in self.procs:
            terminate(proc)
        self.procs.clear()
        if self._drop is not None:
            import psycopg

            admin, name = self._drop
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._drop = None

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def corel_env(settings: Any = None, **extra: str) -> dict[str, str]:
    """The environment of a corel process of ``settings``: this process's, less its COREL_*
    settings, with each setting that ``settings`` was given (not a default) as its COREL_*
    variable, then ``extra``; the repository importable."""
    from pydantic import SecretStr

    env = {k: v for k, v in os.environ.items() if not k.startswith("COREL_")}
    for name in sorted(settings.model_fields_set if settings is not None else ()):
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[f"COREL_{name.upper()}"] = (str(value).lower() if isinstance(value, bool)
                                        else json.dumps(value) if isinstance(value, (list, dict))
                                        else str(value))
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def spawn(args: Sequence[str], env: dict[str, str], log: Path, prefix: Sequence[str] = (),
          cwd: Path = REPO) -> subprocess.Popen[bytes]:
    """``corel <args>`` (``python -m corel.cli``, this interpreter) in a session of its own
    (so a group kill reaches its children), its output appended to ``log``; ``prefix``: a
    command that runs it (a host's namespace, a CPU pin)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([*prefix, sys.executable, "-m", "corel.cli", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)


def worker_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Waits until a worker consumes its queue (Celery's "ready." in its log)."""
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited ({proc.returncode}):\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        return b" ready." in log.read_bytes()

    wait_until(ready, timeout, "the worker to be ready", interval=0.2,
               detail=lambda: log.read_text(errors="replace")[-3000:])
