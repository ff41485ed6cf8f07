"""corel running, for a benchmark or a test to call over HTTP: an API and its workers on a
database, a broker and an artifact store.

One ``Stack`` whichever way it was started:

* ``Stack.embedded(root)``: ``corel serve`` on the embedded default in ``root/var`` (SQLite,
  the embedded broker and worker), what ``make serve`` runs;
* ``Stack.postgres(root, workers=N)``: a PostgreSQL database and a Redis database of its
  own, ``corel serve --no-worker`` and N ``corel worker`` processes, what a deployment runs;
* ``Stack.attached(url, settings)``: one somebody else started and stops (the test
  session's: its app served in the test process, its workers), which a benchmark's
  ``main(argv, stack=...)`` uses instead of starting its own.

A stack this module started is stopped by its processes' pids (``close``, or the ``with``
block's end); its database is dropped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from harness.servers import free_port, terminate
from harness.wait import wait_until

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

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 80)

    @classmethod
    def attached(cls, url: str, settings: Any, api_pid: int | None = None) -> Stack:
        """A stack started elsewhere (its owner stops it): by default its API in this process."""
        return cls(url=url, settings=settings, api_pid=os.getpid() if api_pid is None else api_pid)

    @classmethod
    def embedded(cls, root: Path, **env: str) -> Stack:
        """``corel serve`` on the embedded default in ``root/var``; ``env``: COREL_* beside it."""
        from app.core.settings import Settings

        var = root / "var"
        port = free_port()
        environ = {**_clean_env(), **env, "COREL_VAR_DIR": str(var), "COREL_LOG_LEVEL": "WARNING"}
        stack = cls(url=f"http://127.0.0.1:{port}", settings=Settings(var_dir=var), api_pid=0)
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
        environ = {**_clean_env(), "COREL_DATABASE_URL": database, "COREL_BROKER_URL": broker,
                   "COREL_QUEUE": f"corel-bench-{name}", "COREL_VAR_DIR": str(root / "var"),
                   "COREL_LOG_LEVEL": "WARNING", **env}
        settings = Settings(database_url=database, broker_url=broker, var_dir=root / "var",
                            queue=environ["COREL_QUEUE"])
        stack = cls(url=f"http://127.0.0.1:{port}", settings=settings, api_pid=0, _drop=(admin, name))
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
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "corel.cli", *args], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _ready(self, log: Path) -> None:
        def ready() -> bool:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args!r} exited ({proc.returncode}); see {log}")
            return httpx.get(f"{self.url}/ready", timeout=2).status_code == 200

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


def _clean_env() -> dict[str, str]:
    """This process's environment less its COREL_* settings, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COREL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env
