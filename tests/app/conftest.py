"""Real services for the service tests: a fresh PostgreSQL database per run, a
Redis database of our own as the broker, and real Celery worker processes.

Two callers. By default (``make test``'s main and serial passes) the session's database gets
a user with a write token at its start, so the open mode ends, and every app the tests build
on that database (``create_app``, whether driven by a TestClient or served by
:func:`serving`) answers a request that carries no ``Authorization`` header as if it carried
that user's token: the suite's requests act for a user who owns what they create and may
see nothing else, so every route goes through the owner, sharing and access checks. Rows a
test writes to that database itself (a job a lost worker left running, an experiment half
trained) get that user as their owner, as if it had created them through the API. An app on
another database (a test's own, `make serve`'s SQLite) is left as it is.

COREL_TEST_OPEN_MODE=1 (``make test``'s open pass): no user, the open mode `make serve`
starts in. That pass runs the tests that set up their own authentication (``own_auth``:
the open mode, COREL_API_TOKEN, other users), which the user's passes leave out, and the
API's own tests once more (those on the session's database with no worker: the same
requests from the open mode's caller); a test that needs a worker trains once, as the user.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session as OrmSession

import app.main
from app.access.policy import OWNED
from app.access.users import create_token, create_user
from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.settings import Settings
from harness.servers import free_port
from harness.stack import Stack, corel_env
from harness.wait import wait_until
from tests.conftest import FASHION_DIR, SHARED_DATASETS, require

AS_USER = os.environ.get("COREL_TEST_OPEN_MODE", "") in ("", "0")
# The token and id of the session's user (not COREL_TEST_OPEN_MODE), and the name of the
# session's database, once it exists.
AS_USER_TOKEN: list[str] = []
AS_USER_ID: list[int] = []
AS_USER_DB: list[str] = []


def _session_database(url: Any) -> bool:
    """Whether a database URL (a string or SQLAlchemy's) is the session's."""
    return bool(AS_USER_DB) and make_url(str(url)).database == AS_USER_DB[0]


class DefaultAuthorization:
    """An ASGI wrapper: an HTTP request without an ``Authorization`` header, to an app on the
    session's database, gets the session user's; one with a header keeps it."""

    def __init__(self, app: Any, database_url: str) -> None:
        self.app = app
        self.database_url = database_url

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = scope.get("headers") or []
        if scope["type"] == "http" and AS_USER_TOKEN and _session_database(self.database_url) and not any(
                k.lower() == b"authorization" for k, _ in headers):
            token = AS_USER_TOKEN[0].encode()
            scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + token)]}
        await self.app(scope, receive, send)


def create_app(settings: Settings) -> Any:
    """:func:`app.main.create_app`; unless COREL_TEST_OPEN_MODE, requests to an app on the
    session's database act for the session's user by default (:class:`DefaultAuthorization`,
    outermost)."""
    built = _create_app(settings)
    if AS_USER:
        built.add_middleware(DefaultAuthorization, database_url=settings.db_url)
    return built


_create_app = app.main.create_app
if AS_USER:  # the test modules import create_app from app.main after this conftest
    app.main.create_app = create_app  # type: ignore[assignment]


# The fixtures that start or need a worker: a test that uses one trains, and does so once,
# as the session's user; the open pass leaves it out.
TRAINS = {"worker", "workers"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The session user's passes leave out the tests that set up their own authentication
    (``own_auth``); the open pass (COREL_TEST_OPEN_MODE) runs those, and the API's own tests
    on the session's database (the ``settings`` fixture, no worker, not ``no_user``: their
    requests once more, from the open mode's caller). A test without ``settings`` builds its
    services on a database of its own, or makes no request: the same for both callers, it
    runs once, in the user's passes."""
    def open_pass(item: pytest.Item) -> bool:
        names = set(item.fixturenames)  # type: ignore[attr-defined]
        return item.get_closest_marker("own_auth") is not None or (
            "settings" in names and not names & TRAINS and item.get_closest_marker("no_user") is None)

    wrong = tier_violations((item.nodeid, set(item.fixturenames)) for item in items)  # type: ignore[attr-defined]
    if wrong:
        raise pytest.UsageError("tests in the wrong tier (docs/development.md#test-tiers):\n" + "\n".join(wrong))
    if AS_USER:
        left = [item for item in items if item.get_closest_marker("own_auth") is not None]
    else:
        left = [item for item in items if not open_pass(item)]
    if left:
        config.hook.pytest_deselected(items=left)
        gone = set(left)
        items[:] = [item for item in items if item not in gone]


# The service's tiers, a folder each (docs/development.md#test-tiers): what a test there may cost.
TIERS = ("api", "stack", "processes")
# What the API tier may not use: a worker (the session's, or the pool that starts them), a
# trained run, the session's stack, a browser.
NOT_IN_THE_API_TIER = {"worker", "workers", "digits_runs", "stack", "browser", "page"}


def tier_violations(tests: Iterable[tuple[str, set[str]]]) -> list[str]:
    """For each (node id, fixture closure) of a service test that its folder does not allow,
    why: a file of tests/app outside the tiers' folders, or a test of the API tier that needs
    a worker, a trained run or a browser (it belongs in stack/, or processes/ if it starts
    processes of its own)."""
    wrong = []
    for nodeid, fixtures in tests:
        parts = nodeid.split("::")[0].split("/")
        if parts[:2] != ["tests", "app"]:
            continue
        if len(parts) != 4 or parts[2] not in TIERS:
            wrong.append(f"{nodeid}: a service test lives in tests/app/<tier>/ (one of {', '.join(TIERS)})")
        elif parts[2] == "api" and fixtures & NOT_IN_THE_API_TIER:
            wrong.append(f"{nodeid}: the API tier runs no worker, trained run or browser; it uses "
                         f"{', '.join(sorted(fixtures & NOT_IN_THE_API_TIER))} (stack/ or processes/)")
    return wrong


def new_user(s: Settings, name: str) -> tuple[int, str]:
    """A user named ``name`` (not an admin) with a write token, in ``s``'s database: its id
    and the token."""
    engine = make_engine(s.db_url)
    try:
        with session_scope(make_sessionmaker(engine)) as session:
            user = create_user(session, name)
            _, token = create_token(session, user.id, "write")
            return user.id, token
    finally:
        engine.dispose()


def add_session_user(s: Settings) -> None:
    """A user with a write token in the session's database, and the owner of the rows the
    tests write to that database themselves."""
    user_id, token = new_user(s, "suite-user")
    AS_USER_ID.append(user_id)
    AS_USER_TOKEN.append(token)
    AS_USER_DB.append(str(make_url(s.db_url).database))
    event.listen(OrmSession, "before_flush", _owned_by_the_session_user)


def _owned_by_the_session_user(session: OrmSession, *_: Any) -> None:
    """A session on the session's database that serves no request (a test's own, not the
    API's, which carries its principal): the rows it adds are the session user's."""
    if "principal" in session.info or not _session_database(session.get_bind().url):
        return
    for row in session.new:
        if isinstance(row, OWNED) and row.owner_id is None:
            row.owner_id = AS_USER_ID[0]


PG_ADMIN_URL = os.environ.get("COREL_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("COREL_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
# Under pytest-xdist (make test runs the suite on two processes) each process has a Redis
# database of its own: the session fixture empties its database at its start and end, which
# would otherwise drop the other's queued messages.
_XDIST = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST.startswith("gw") and _XDIST[2:].isdigit():
    REDIS_URL = f"{REDIS_URL.rsplit('/', 1)[0]}/{int(REDIS_URL.rsplit('/', 1)[1]) + 1 + int(_XDIST[2:])}"


def pg_available() -> bool:
    try:
        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def _redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    require(pg_available(), f"PostgreSQL at {PG_ADMIN_URL}")
    name = f"corel_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_database_url(name)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Databases migrated once a process, copied for each test that needs a fresh one of its own
# (test_users.py's 40, own_database's): an upgrade from nothing took 0.4 s alone on a 2-core
# AVX2 EPYC and about 1.8 s a setup in the open pass; a copy 3-4 ms (SQLite's backup) or 35 ms
# (CREATE DATABASE ... TEMPLATE) there. Never written to; dropped when the process ends. tests/app/api/test_migrations.py still migrates from nothing.
_TEMPLATES: dict[str, str] = {}  # kind -> a PostgreSQL database's name, a SQLite file's path


def pg_database_url(name: str) -> str:
    """The URL of database ``name`` on the machine's PostgreSQL (PG_ADMIN_URL's server)."""
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"


def _drop_templates() -> None:
    for kind, template in _TEMPLATES.items():
        if kind == "postgresql":
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
        else:
            shutil.rmtree(Path(template).parent, ignore_errors=True)


def _template(kind: str) -> str:
    """The migrated template of ``kind``, made on first use."""
    if kind not in _TEMPLATES:
        if not _TEMPLATES:
            atexit.register(_drop_templates)
        if kind == "postgresql":
            made = f"corel_template_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{made}"')
            url, folder = pg_database_url(made), None
        else:
            folder = Path(tempfile.mkdtemp(prefix="corel-template-"))
            made = str(folder / "corel.sqlite3")
            url = f"sqlite:///{made}"
        with tempfile.TemporaryDirectory() as var_dir:
            upgrade(Settings(database_url=url, var_dir=folder or Path(var_dir), broker_url="memory://",
                             log_level="WARNING"))
        _TEMPLATES[kind] = made
    return _TEMPLATES[kind]


def migrated_database(kind: str, folder: Path) -> tuple[str, str | None]:
    """A fresh database at the migrations' head, a copy of this process's template: its URL,
    and for PostgreSQL its name (the caller drops it); a SQLite file in ``folder``."""
    template = _template(kind)
    if kind == "postgresql":
        name = f"corel_test_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return pg_database_url(name), name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corel.sqlite3"
    with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(path)) as copy:
        source.backup(copy)
    return f"sqlite:///{path}", None


@contextmanager
def own_database(settings: Settings, var_dir: Path) -> Iterator[Settings]:
    """``settings`` on a fresh PostgreSQL database of its own (dropped afterwards) and a
    queue no worker reads: for tests whose users, presence rows or counts must not meet
    the suite's."""
    url, name = migrated_database("postgresql", var_dir)
    s = settings.model_copy(update={
        "database_url": url,
        "queue": f"corel-fuzz-{uuid.uuid4().hex[:8]}", "max_sweep_size": 20,
        "var_dir": var_dir, "log_level": "WARNING", "api_token": None})
    try:
        yield s
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def own_stack(settings: Settings, var_dir: Path) -> Iterator[tuple[Settings, TestClient]]:
    """A database, a queue and an artifact store of a test's own (:func:`own_database`) and a
    TestClient on them: for a test that must own the queue, one that kills its worker mid-run
    and starts another (``workers.start(s)``). No other worker reads that queue, nor does
    another worker's reconciler hand its run on, so the session's worker runs on beside it
    (such a test used to kill every worker and queue behind the runs other tests had left)."""
    with own_database(settings, var_dir) as s, TestClient(create_app(s)) as client:
        yield s, client


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    require(_redis_available(), f"Redis at {REDIS_URL}")
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()


@pytest.fixture(scope="session")
def settings(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    require((FASHION_DIR / "train-images-idx3-ubyte.gz").exists(),
            f"Fashion-MNIST in {FASHION_DIR} (apt-get install dataset-fashion-mnist)")
    s = Settings(
        database_url=pg_url,
        broker_url=redis_url,
        var_dir=tmp_path_factory.mktemp("var"),
        queue=f"corel-test-{uuid.uuid4().hex[:8]}",
        lease_seconds=4.0,
        heartbeat_seconds=0.5,
        log_level="INFO",
        # As `make serve` does: MNIST and AG News's test split from ../shared/datasets.
        data_dir=str(SHARED_DATASETS) if SHARED_DATASETS.is_dir() else "",
        # One folder of features for the whole run: every test process's workers (and the
        # own stacks' copies of these settings) compute an encoder's features of the same
        # data once, not once a process (the files are content-addressed, written atomically).
        features_dir=tmp_path_factory.getbasetemp().parent / "features"
        if os.environ.get("PYTEST_XDIST_WORKER") else tmp_path_factory.mktemp("features"),
    )
    upgrade(s)  # migrations run once per test session
    if AS_USER and not AS_USER_TOKEN:
        add_session_user(s)
    return s


def stored_checkpoint(settings: Settings, session: Any, experiment_id: int, kind: str = "best") -> bytes:
    """An experiment's checkpoint as the worker stored it: the row's digest, read (and
    verified) from the settings' artifact store."""
    from sqlalchemy import select

    from app.core.models import Checkpoint
    from app.storage import make_store

    digest = session.scalar(select(Checkpoint.sha256).where(
        Checkpoint.experiment_id == experiment_id, Checkpoint.kind == kind))
    assert digest is not None, f"experiment {experiment_id} has no {kind} checkpoint"
    return make_store(settings).read_bytes(digest)


class Workers:
    """Real `corel worker` processes (the Dockerfile's worker command) of the session's
    settings, or of a test's own: harness's :class:`Stack` on those settings, which starts,
    stops and kills them one by one."""

    def __init__(self, settings: Settings, logdir: Path) -> None:
        self.settings = settings
        self.logdir = logdir
        self.stack = Stack.on(settings, logdir)

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return self.stack.procs

    def start(self, settings: Settings | None = None, python_path: Path | None = None,
              ready_timeout: float = 120.0) -> subprocess.Popen[bytes]:
        """A worker of the session's settings, or of ``settings`` (another queue, ...);
        ``python_path``: a folder importable there too (a plugin's). Returns once the worker
        consumes its queue (:meth:`Stack.start_worker`)."""
        return self.stack.start_worker(settings, python_path=python_path, ready_timeout=ready_timeout)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM (a warm shutdown), as stop_all does for one worker."""
        self.stack.stop(proc)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker's process group (one that has already exited: nothing to do;
        two tests may each stop the shared worker)."""
        self.stack.kill(proc)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def logs(self, tail: int | None = 3000) -> str:
        return self.stack.logs(tail)


@pytest.fixture(scope="session")
def workers(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    w = Workers(settings, tmp_path_factory.mktemp("worker-logs"))
    yield w
    w.stop_all()


@pytest.fixture(scope="session")
def worker(workers: Workers) -> subprocess.Popen[bytes]:
    """One long-lived worker shared by the tests that just need experiments to run."""
    return workers.start()


@pytest.fixture(scope="session")
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def wait_for(
    client: TestClient, experiment_id: int, done: Callable[[dict], bool], timeout: float = 180,
    workers: Workers | None = None,
) -> dict:
    return wait_body(client, f"/experiments/{experiment_id}", done, timeout, workers)


def wait_body(client: Any, path: str, done: Callable[[dict], bool] = lambda body: finished(body),
              timeout: float = 180, workers: Workers | None = None, interval: float = 0.2) -> dict:
    """GET ``path`` until ``done`` says its body is there (by default: a job has
    finished), and return the body; the failure shows the last one and the workers' logs."""

    def there() -> dict | None:
        body = client.get(path).json()
        return body if done(body) else None

    return wait_until(there, timeout, f"{path} to get there", interval=interval,
                      detail=lambda: f"{client.get(path).json()}\n{workers.logs() if workers else ''}")


def finished(body: dict) -> bool:
    return body["status"] in ("succeeded", "failed", "cancelled")


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served over real HTTP by uvicorn in a thread, for as long as the block runs."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "uvicorn to start", interval=0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def live_app(settings: Settings) -> Iterator[tuple[Any, str]]:
    """The app, and its URL: served over real HTTP by uvicorn (for the CLI and benchmarks'
    clients, and what only a real connection shows: a client that disconnects)."""
    built = create_app(settings)
    with serving(built) as url:
        yield built, url


@pytest.fixture(scope="session")
def live_url(live_app: tuple[Any, str]) -> str:
    return live_app[1]


@pytest.fixture(scope="session")
def stack(live_url: str, settings: Settings, worker: subprocess.Popen[bytes]) -> Stack:
    """The session's corel as harness's ``Stack``: its app served over HTTP in this process,
    its worker; for a benchmark's ``main(argv, stack=stack)`` (which stops nothing of it)."""
    return Stack.attached(live_url, settings)


def corel_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``corel <args>`` as a process of ``settings`` would run it, in this process: the
    command line's own code (``corel.cli.main``) with this process's environment made the
    one :func:`harness.stack.corel_env` gives such a process (and put back after), its exit
    status and what it printed; no interpreter's start, no torch import. A test of what only
    a process shows (``corel serve``, a worker) starts one."""
    from app.core.settings import get_settings
    from corel.cli import main

    saved = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(corel_env(settings))
    get_settings.cache_clear()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # as the interpreter ends: a number, None (0), or a message (1)
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
        get_settings.cache_clear()
    return subprocess.CompletedProcess(["corel", *args], code, out.getvalue(), err.getvalue())


def npz_bytes(**arrays: Any) -> bytes:
    """An .npz upload's bytes, as numpy.savez writes them."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


DIGITS_SPEC = {"dataset": "digits", "model": "ffnn", "lr": 0.003, "batch_size": 64, "epochs": 4}


@pytest.fixture(scope="session")
def digits_runs(client: TestClient, worker: subprocess.Popen[bytes]) -> dict[str, int]:
    """A Cosine-COREL and a Gaussian-COREL run on digits (lam 0.8, 4 epochs), succeeded."""
    ids = {loss: client.post("/experiments", json={**DIGITS_SPEC, "loss": loss, "lam": 0.8}).json()["id"]
           for loss in ("cosine", "gaussian")}
    for i in ids.values():
        assert wait_for(client, i, finished)["status"] == "succeeded"
    return ids


def stored_latent(settings: Settings, experiment_id: int, split: str) -> tuple[Any, Any]:
    """The (representations, labels) a worker stored for a split: the row's digests, read
    from the settings' artifact store."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from app.core.models import LatentSpace
    from app.storage import make_store

    engine = create_engine(settings.database_url)
    with Session(engine) as session:
        row = session.scalars(select(LatentSpace).where(
            LatentSpace.experiment_id == experiment_id, LatentSpace.split == split)).one()
        store = make_store(settings)
        out = (np.frombuffer(store.read_bytes(row.representations_sha256), np.float32)
               .reshape(row.n, row.dim).copy(),
               np.frombuffer(store.read_bytes(row.labels_sha256), np.int64).copy())
    engine.dispose()
    return out


def clothes_upload(client: Any, fashion_dir: Path, classes: dict[int, str], per_class: int = 12) -> tuple[Any, Any, Any]:
    """Fashion-MNIST's test images and labels, and an image folder upload (class/*.png,
    28 x 28 grey) of the first ``per_class`` images of each of ``classes`` (label: name)."""
    import zipfile

    from PIL import Image

    from corel.data.idx import read_idx

    x = read_idx(fashion_dir / "t10k-images-idx3-ubyte.gz")
    y = read_idx(fashion_dir / "t10k-labels-idx1-ubyte.gz")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for label, name in classes.items():
            for i in np.flatnonzero(y == label)[:per_class]:
                png = io.BytesIO()
                Image.fromarray(x[i], "L").save(png, format="PNG")
                z.writestr(f"clothes/{name}/{i}.png", png.getvalue())
    upload = client.post("/datasets", files={"file": ("clothes.zip", buf.getvalue())})
    assert upload.status_code == 201, upload.text
    return x, y, upload


@contextmanager
def held(workers: Workers) -> Iterator[Callable[[float], None]]:
    """Every live worker stopped (SIGSTOP) until the block ends; the block's ``step(seconds)``
    lets them run that long and stops them again. A run's progress is then a state the test
    holds still while it looks at the page, not a race between the worker and the browser:
    on a fast machine the worker finished 60 epochs before the page was drawn."""
    procs = [p for p in workers.procs if p.poll() is None]

    def signal_all(sig: int) -> None:
        for proc in procs:
            os.killpg(proc.pid, sig)

    def step(seconds: float) -> None:
        signal_all(signal.SIGCONT)
        time.sleep(seconds)
        signal_all(signal.SIGSTOP)

    signal_all(signal.SIGSTOP)
    try:
        yield step
    finally:
        signal_all(signal.SIGCONT)
