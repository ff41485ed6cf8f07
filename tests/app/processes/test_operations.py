"""Health, readiness, auth, migrations, the compose file and the embedded default."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.core.migrate import check
from app.core.settings import Settings
from app.main import create_app
from corel import native
from harness.servers import free_port
from harness.stack import Stack
from harness.wait import http_status, wait_until
from tests.conftest import IN_CI, REPO


def test_health_and_ready(client):
    assert client.get("/health").json() == {"status": "ok"}
    r = client.get("/ready")
    assert r.status_code == 200 and r.json() == {"status": "ready", "database": "ok", "broker": "ok"}


def test_ready_is_503_when_the_broker_is_down(settings):
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(down)) as c:
        r = c.get("/ready")
    assert r.status_code == 503
    assert r.json()["database"] == "ok" and r.json()["broker"].startswith("unreachable")


def test_submit_when_the_broker_is_down_is_503_and_leaves_no_row(settings, client):
    """A 503 tells the client to submit again: the refused request must leave nothing
    behind (it used to leave a `failed` row per refused run)."""
    def count() -> int:
        return client.get("/experiments", params={"limit": 1}).json()["total"]

    sweeps_before = client.get("/sweeps", params={"limit": 1}).json()["total"]
    before = count()
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(down)) as c:
        r = c.post("/experiments", json={"dataset": "digits", "epochs": 1})
        assert r.status_code == 503, r.text
        assert "could not be queued" in r.json()["detail"] and "nothing was stored" in r.json()["detail"]
        r = c.post("/sweeps", json={"base": {"dataset": "digits", "epochs": 1},
                                    "grid": {"lam": [0.2, 0.4], "seed": [0, 1]}})
        assert r.status_code == 503 and "nothing was stored" in r.json()["detail"], r.text
    assert count() == before
    assert client.get("/sweeps", params={"limit": 1}).json()["total"] == sweeps_before


@pytest.mark.own_auth
def test_token_guards_mutating_endpoints(settings):
    guarded = settings.model_copy(update={"api_token": SecretStr("s3cret-token")})
    body = {"dataset": "digits", "epochs": 1}
    with TestClient(create_app(guarded)) as c:
        r = c.post("/experiments", json=body)
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["detail"]
        r = c.post("/experiments", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["detail"] == "the bearer token is not valid"
        r = c.post("/experiments", json=body, headers={"Authorization": "Basic s3cret-token"})
        assert r.status_code == 401
        for path in ("/experiments/1/cancel", "/datasets"):
            assert c.post(path).status_code == 401
        assert c.delete("/experiments/1").status_code == 401
        # Reads need it too (COREL_API_TOKEN_READS defaults on); probes and the docs do not.
        for path in ("/experiments", "/experiments/1/metrics", "/datasets", "/sweeps/1"):
            assert c.get(path).status_code == 401, path
        assert c.post("/embed", json={}).status_code == 401
        for path in ("/health", "/ready", "/openapi.json"):
            assert c.get(path).status_code == 200, path
        auth = {"Authorization": "Bearer s3cret-token"}
        assert c.get("/experiments", headers=auth).status_code == 200
        r = c.post("/experiments", json=body, headers={"Authorization": "Bearer s3cret-token"})
        assert r.status_code == 202
        c.post(f"/experiments/{r.json()['id']}/cancel",
               headers={"Authorization": "Bearer s3cret-token"})
    open_reads = guarded.model_copy(update={"api_token_reads": False})
    with TestClient(create_app(open_reads)) as c:
        assert c.get("/experiments").status_code == 200
        assert c.post("/experiments", json=body).status_code == 401


def test_migrations_match_the_models(settings):
    check(settings)  # alembic check: raises if autogenerate would produce operations


def test_openapi_documents_the_endpoints(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/experiments", "/experiments/{experiment_id}", "/experiments/{experiment_id}/metrics",
                 "/experiments/{experiment_id}/cancel", "/datasets", "/health", "/ready"):
        assert path in paths


def compose_command() -> list[str] | None:
    """`docker compose` (the plugin) where it exists, else Debian's `docker-compose`."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_compose_file_is_valid():
    cmd = compose_command()
    if cmd is None:
        if IN_CI:
            pytest.fail("a compose client is needed to check docker-compose.yml (.ci/run installs one)")
        pytest.skip("no compose client")
    compose = [*cmd, "-f", str(REPO / "docker-compose.yml")]
    r = subprocess.run([*compose, "config", "-q"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    config = subprocess.run([*compose, "config"], capture_output=True, text=True, cwd=REPO).stdout
    for service in ("postgres", "redis", "migrate", "api", "worker"):
        assert f"  {service}:" in config
    # The image's commands are the ones the tests run: `corel serve`, `corel worker`,
    # `corel db upgrade`.
    for command in ("- serve", "- worker", "- upgrade"):
        assert command in config
    assert 'CMD ["corel", "serve"' in (REPO / "Dockerfile").read_text()


HOST_FILES = {"database.yml": ("postgres", "redis", "s3"), "api.yml": ("migrate", "api"),
              "worker.yml": ("worker",)}


def test_compose_files_per_host_are_valid():
    """deploy/hosts/: one compose file per kind of host (docs/deployment.md). Each is
    valid with its settings, and refuses to start without them."""
    cmd = compose_command()
    if cmd is None:
        if IN_CI:
            pytest.fail("a compose client is needed to check deploy/hosts (.ci/run installs one)")
        pytest.skip("no compose client")
    given = {"POSTGRES_PASSWORD": "p", "REDIS_PASSWORD": "r", "COREL_GPU": "1",
             "COREL_DATABASE_URL": "postgresql://corel:p@db-host:5432/corel",
             "COREL_BROKER_URL": "redis://:r@db-host:6379/0",
             "COREL_S3_ENDPOINT": "http://db-host:8333", "COREL_S3_ACCESS_KEY": "k",
             "COREL_S3_SECRET_KEY": "s"}
    base = {k: v for k, v in os.environ.items() if k not in given}
    for name, services in HOST_FILES.items():
        compose = [*cmd, "-f", str(REPO / "deploy" / "hosts" / name)]
        r = subprocess.run([*compose, "--profile", "gpu", "config"], capture_output=True, text=True,
                           cwd=REPO, env={**base, **given})
        assert r.returncode == 0, (name, r.stderr)
        for service in services:
            assert f"  {service}:" in r.stdout, (name, service)
        if name == "worker.yml":  # one GPU per GPU worker
            assert "CUDA_VISIBLE_DEVICES: \"1\"" in r.stdout or "CUDA_VISIBLE_DEVICES: '1'" in r.stdout, r.stdout
        needed = "POSTGRES_PASSWORD" if name == "database.yml" else "COREL_DATABASE_URL"
        r = subprocess.run([*compose, "config", "-q"], capture_output=True, text=True, cwd=REPO,
                           env={**base, **{k: v for k, v in given.items() if k != needed}})
        assert r.returncode != 0 and needed in r.stderr, (name, r.stderr)


def test_embedded_default_end_to_end(tmp_path):
    """`corel serve` with nothing configured: SQLite + embedded broker + worker."""
    # harness's stack on the embedded default (its log level INFO, as `corel serve`'s own).
    stack = Stack.embedded(tmp_path, COREL_LOG_LEVEL="INFO")
    proc, base = stack.procs[0], stack.url
    try:
        r = httpx.post(f"{base}/experiments", json={"dataset": "digits", "epochs": 3, "lr": 1e-3})
        assert r.status_code == 202, r.text
        eid = r.json()["id"]

        def finished() -> dict | None:
            body = http.get(f"{base}/experiments/{eid}").json()
            return body if body["status"] in ("succeeded", "failed", "cancelled") else None

        with httpx.Client() as http:  # one client for the polls (httpx.get builds one, TLS and all, a call)
            body = wait_until(finished, 120, f"experiment {eid} to finish", interval=0.3)
        assert body["status"] == "succeeded", (body, (tmp_path / "serve.log").read_text()[-3000:])
        assert len(httpx.get(f"{base}/experiments/{eid}/metrics").json()["items"]) == 3
        assert (tmp_path / "var" / "corel.sqlite3").exists()
        # The embedded broker forgets delivered messages (its file does not grow forever).
        import sqlite3

        broker = sqlite3.connect(tmp_path / "var" / "broker.sqlite3")
        wait_until(lambda: not broker.execute(
            "SELECT count(*) FROM kombu_message WHERE visible = 0").fetchone()[0],
            10, "the broker to forget its delivered messages", interval=0.2)
        broker.close()
        # SQLite keeps no offset, yet the API says which time zone its timestamps are in.
        for key in ("created_at", "started_at", "finished_at"):
            stamp = datetime.fromisoformat(body[key])
            assert stamp.utcoffset() == timedelta(0), (key, body[key])
        # SIGTERM to `corel serve` alone (as a supervisor sends it) stops its worker too.
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert children, "the embedded worker is not a child of `corel serve`"
        proc.send_signal(signal.SIGTERM)
        # A clean stop, not a failure (`make serve` used to end in "Error 143").
        assert proc.wait(timeout=45) == 0
        # One log line per request (uvicorn's access log repeated each one), and the
        # worker's lines once each (Celery logged them again as WARNING).
        text = (tmp_path / "serve.log").read_text()
        posts = [line for line in text.splitlines() if '"POST' in line or '"method": "POST"' in line]
        assert len(posts) == 1, posts
        assert "WARNING/MainProcess] {" not in text, text[-2000:]
        # ... and in one format: Celery's own "[... INFO/MainProcess]" copies are gone.
        assert text.count("celery@") and "INFO/MainProcess]" not in text, text[-2000:]
        wait_until(lambda: not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)
                                   for pid in children),
                   45, "the embedded worker to end with `corel serve`", interval=0.2)
    finally:
        stack.close()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
@pytest.mark.parametrize(("to", "sig"), [("make", signal.SIGINT), ("make", signal.SIGTERM),
                                         ("group", signal.SIGINT)])
def test_make_serve_stops_cleanly_and_quietly_when_make_is_signalled(tmp_path, to, sig):
    """A signal to `make` alone, as `kill` or a supervisor sends it: SIGINT did nothing (make
    waits for its recipe, which never heard of it), and SIGTERM reached the recipe's shell
    alone, which died ("make: *** [Makefile:78: serve] Error 143") and left the service
    running. Both stop the service, its worker with it, with no error; and so does a
    terminal's Ctrl-C, a SIGINT to the whole process group."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COREL_", "MAKE"))}
    env.update(COREL_VAR_DIR=str(tmp_path / "var"), COREL_PORT=str(port))
    # The installed environment as it is (no stamps to remake), from a folder of its own.
    make = ["make", "-f", str(REPO / "Makefile"), "serve", f"BIN={Path(sys.executable).parent}",
            "SERVICE_STAMP=", "NATIVE="]
    log = open(tmp_path / "make.log", "wb")  # noqa: SIM115
    # make as a terminal starts it, catching SIGINT: a suite started in the background by a
    # shell (`... &`, nohup) ignores SIGINT and SIGQUIT, and so would make, inheriting that
    # (it leaves an ignored SIGINT ignored): then nothing can stop it with one.
    proc = subprocess.Popen(make, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_default_interrupts)
    try:
        wait_until(lambda: http_status(f"http://127.0.0.1:{port}/ready") == 200,
                   90, "make serve to be ready", interval=0.3, ignore=(httpx.HTTPError,),
                   detail=(tmp_path / "make.log").read_text)
        # And its worker up (Celery's "ready."): the API answers first, and a signal while the
        # worker still booted is another case (under load in CI, that worker once went on past
        # the test's 45 s; a worker past "ready." did so on 2026-12-07, orphaned by a second
        # SIGTERM that cut the service's stop short: _stop_worker now ignores it, and
        # test_a_signal_while_the_service_stops_its_worker_does_not_orphan_the_worker below).
        wait_until(lambda: b" ready." in (tmp_path / "make.log").read_bytes(), 90,
                   "make serve's worker to be ready", interval=0.3, detail=(tmp_path / "make.log").read_text)
        if to == "make":
            proc.send_signal(sig)
        else:
            os.killpg(proc.pid, sig)
        # make ends as the signal ends a program (it raises it again once its recipe is done).
        assert proc.wait(timeout=45) in (0, -sig), (tmp_path / "make.log").read_text()[-3000:]
        wait_until(lambda: not _group(proc.pid), 45, "the service and its worker to end",
                   interval=0.2, detail=lambda: str(_group(proc.pid)))
        text = (tmp_path / "make.log").read_text()
        assert "Error" not in text and "Traceback" not in text and "make: ***" not in text, text[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(timeout=30)


def test_a_signal_while_the_service_stops_its_worker_does_not_orphan_the_worker(tmp_path):
    """The race behind a `make serve` whose worker outlived it: the service, stopping its
    worker, got a second SIGTERM (make passes one on, the service's watch on make sends
    another), which ended it inside the wait and left the worker running. Made exact here: a
    stand-in worker that, told to stop, sends its parent a SIGTERM and then takes a second to
    end; the parent, stopping it as `corel serve` does (its SIGTERM handler in place), must
    wait for it and say so."""
    program = tmp_path / "service.py"
    program.write_text(
        "import subprocess, sys\n"
        "from app.cli.service import _exit_on_sigterm, _stop_worker\n"
        "_exit_on_sigterm(0)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os, signal, sys, time\\n"
        "def stop(*_):\\n    os.kill(os.getppid(), signal.SIGTERM)\\n    time.sleep(1)\\n    sys.exit(3)\\n"
        "signal.signal(signal.SIGTERM, stop)\\nprint(\"up\", flush=True)\\ntime.sleep(60)'],"
        " stdout=subprocess.PIPE)\n"
        "child.stdout.readline()\n"
        "_stop_worker(child)\n"
        "print('worker ended', child.returncode, flush=True)\n")
    done = subprocess.run([sys.executable, str(program)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "worker ended 3" in done.stdout, done.stdout + done.stderr


def _default_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _group(pgid: int) -> list[str]:
    """The live processes of a process group."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(stat.parent.name)
    return out


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


def test_a_busy_port_is_one_clear_line(tmp_path):
    """`corel serve` on a port that is taken says so in one line naming the setting,
    before it starts anything (it used to print the dashboard's address, then a traceback)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("COREL_")}
        env["COREL_VAR_DIR"] = str(tmp_path / "var")
        env["COREL_PORT"] = str(port)
        done = subprocess.run([sys.executable, "-m", "corel.cli", "serve"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0] and "COREL_PORT" in lines[0]
    assert not (tmp_path / "var").exists()  # nothing was started or written
    help_text = subprocess.run([sys.executable, "-m", "corel.cli", "serve", "--help"],
                               capture_output=True, text=True, timeout=60).stdout
    assert "COREL_PORT" in " ".join(help_text.split()) and "8000" in help_text


def test_a_worker_refuses_to_start_on_an_unknown_cuda_graphs_setting(tmp_path):
    """COREL_CUDA_GRAPHS is read by the library at each run; the settings check it when a
    process starts, so that a typo stops the worker there rather than failing every run."""
    env = {**os.environ, "COREL_CUDA_GRAPHS": "maybe", "COREL_VAR_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "corel.cli", "worker"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "COREL_CUDA_GRAPHS='maybe': allowed are 1" in proc.stderr, proc.stderr
    for value in ("0", "1", "eager", "Off"):  # the values allowed, read as they are
        assert Settings(cuda_graphs=value).cuda_graphs == value


LIBRARY_VARIABLES = ("COREL_CUDA_GRAPHS", "COREL_NATIVE", "COREL_NATIVE_DIR")
# What the library is given, in a worker process once its settings are read.
GIVEN_TO_THE_LIBRARY = (
    "import os\nimport worker.celery_app\nfrom app.core.settings import engine_options, get_settings\n"
    "from corel import native\n"
    "options = engine_options(get_settings())\n"
    "with options.applied():\n"
    "    print(options.cuda_graphs, native.module() is None, native.build_path(options.native_dir).parent,\n"
    f"          any(k in os.environ for k in {LIBRARY_VARIABLES!r}))")


def test_a_env_file_reaches_the_library_in_a_worker(tmp_path):
    """COREL_CUDA_GRAPHS, COREL_NATIVE and COREL_NATIVE_DIR written in a .env file (which
    only the settings read) reach the library as the engine's options, a variable in the
    environment still wins, and the process's environment is left as it was."""
    (tmp_path / ".env").write_text(
        f"COREL_CUDA_GRAPHS=0\nCOREL_NATIVE=false\nCOREL_NATIVE_DIR={tmp_path / 'builds'}\n")
    env = {k: v for k, v in os.environ.items() if k not in LIBRARY_VARIABLES}
    env.update(PYTHONPATH=str(REPO), COREL_VAR_DIR=str(tmp_path / "var"))

    def library_gets(**variables: str) -> list[str]:
        proc = subprocess.run([sys.executable, "-c", GIVEN_TO_THE_LIBRARY], cwd=tmp_path,
                              env={**env, **variables}, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert library_gets() == ["off", "True", str(tmp_path / "builds"), "False"]
    built = str(native.build_path().parent)  # where make install built it
    assert library_gets(COREL_CUDA_GRAPHS="eager", COREL_NATIVE="1", COREL_NATIVE_DIR=built) == [
        "eager", "False", built, "True"]
    # An empty variable is the default, for the settings as for the library: the worker
    # starts (it refused to, on the settings' bool) and the build loads.
    assert library_gets(COREL_NATIVE="", COREL_NATIVE_DIR=built) == ["off", "False", built, "True"]


def test_two_settings_in_one_process_each_reach_their_own_training_call(settings, monkeypatch):
    """The library reads no environment: each Settings object reaches the training call the
    worker makes with it (native off and the graphed path for one, native on and graphs off
    for the other), in one process, whatever os.environ says."""
    from corel.train import steps
    from worker.runner import train_experiment

    monkeypatch.setenv("COREL_NATIVE", "1")  # ignored: only the settings count
    monkeypatch.setenv("COREL_CUDA_GRAPHS", "maybe")
    taken: list[str] = []
    native_step = steps.gaussian_mlp_step

    def counted_native(*args, **kwargs):
        done = native_step(*args, **kwargs)
        taken.append("native" if done is not None else "autograd")
        return done

    class CountedGraph(steps.GraphedSteps):
        def __call__(self, idx):
            taken.append("graphed")
            return super().__call__(idx)

    monkeypatch.setattr(steps, "gaussian_mlp_step", counted_native)
    monkeypatch.setattr(steps, "GraphedSteps", CountedGraph)
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    plain = idle.model_copy(update={"native": False, "cuda_graphs": "eager"})
    fast = idle.model_copy(update={"native": True, "cuda_graphs": "0"})
    spec = {"dataset": "digits", "model": "ffnn", "loss": "gaussian", "lam": 0.8, "epochs": 1,
            "batch_size": 256, "lr": 0.003}
    seen = {}
    with TestClient(create_app(idle)) as c:
        for name, these in (("plain", plain), ("fast", fast), ("plain again", plain)):
            experiment_id = c.post("/experiments", json=spec).json()["id"]
            taken.clear()
            assert train_experiment(experiment_id, c.app.state.sessionmaker, these) == "succeeded"
            seen[name] = {way: taken.count(way) for way in set(taken)}
            assert c.get(f"/experiments/{experiment_id}").json()["status"] == "succeeded"
    # digits: 1078 training rows, 5 batches of 256 an epoch. The graphed path, every step
    # through autograd (native off); then no graphs, every step native but the first (which
    # makes Adam's state).
    assert seen["plain"] == seen["plain again"] == {"graphed": 5, "autograd": 5}, seen
    assert seen["fast"] == {"autograd": 1, "native": 4}, seen
