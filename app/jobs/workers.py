"""The workers of one host divide its cores among themselves, however they were started
(compose replicas, systemd units, by hand), without being told how many there are.

Each worker writes its presence (:class:`app.core.models.WorkerPresence`) every few seconds,
keyed by its host: the kernel's boot id, which every container and network namespace of
one machine shares, and which differs between machines. A worker's share is its own CPU
allowance (the CPUs it may run on, bounded by its cgroup's quota) divided by the workers
seen on its host within :func:`presence_ttl`, and no more than the CPUs that the host's
other processes leave idle (:class:`HostLoad`), at least one thread. A run's figures do
not depend on its worker's share: workers multiply matrices in MKL's strict reproducible
mode (:data:`WORKER_ENV_DEFAULTS`), whose results are the same bits whatever the number of
threads, so a share may change between two batches of a run. On an AMD EPYC with AVX-512
(Zen 4) that held only with the class matrix laid out transposed in memory: a few rows (a
small batch) times a transposed view rounded apart between 1 and 2 threads even in MKL's
strict mode, so the heads take W^T as a copy (corel.similarity; tests/app/processes/test_host_share.py).

Why it matters: torch's OpenMP threads spin while they wait for each other. Two workers
that each ran a thread per core on two cores spun against each other (an epoch 2.6 times
as long as alone, once 60 times), and a worker beside another busy process of two threads
took 3.5 times as long instead of about twice (bench/host_contention.py). At one thread
there is no one to wait for. (OpenMP's passive wait policy helped there too, but cost a
quarter of an epoch's speed alone on this machine, 0.755 against 0.594 s: not taken.)
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.core.models import WorkerPresence, utcnow

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
PROC_STAT = Path("/proc/stat")


# What a worker process starts with unless its environment says otherwise (MKL reads it
# at its first call; `corel worker` sets it before the worker's Python starts:
# app/cli/service.py): MKL's products the same bits for any number of threads (its strict
# CNR mode, on its AVX2 and AVX-512 code paths; no slower on the FFNN's products here).
WORKER_ENV_DEFAULTS = {"MKL_CBWR": "AUTO,STRICT"}


def worker_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with :data:`WORKER_ENV_DEFAULTS` where it sets none of its own."""
    return {**WORKER_ENV_DEFAULTS, **environ}


def host_key() -> str:
    """This machine: the kernel's boot id (shared by its containers), else the host name."""
    try:
        return BOOT_ID.read_text().strip()[:64] or socket.gethostname()[:64]
    except OSError:
        return socket.gethostname()[:64]


def cpu_allowance(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The CPUs this process may use: those it may be scheduled on, bounded by its cgroup's
    quota (a container's ``cpus:``), rounded up."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


class HostLoad:
    """How many of the host's CPUs other processes kept busy since the last sample: the
    host's busy time (/proc/stat, the whole machine's, in a container too) less this
    process's own CPU time, over the wall time between two samples."""

    def __init__(self, stat: Path = PROC_STAT) -> None:
        self.stat = stat
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last: tuple[float, float, float] | None = None

    def _read(self) -> tuple[float, int]:
        busy, cpus = 0.0, 0
        for line in self.stat.read_text().splitlines():
            if line.startswith("cpu "):
                f = [int(x) for x in line.split()[1:]]
                # user nice system idle iowait irq softirq steal (guest is within user)
                busy = float(f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0))
            elif line.startswith("cpu"):
                cpus += 1
        return busy / self.tick, max(1, cpus)

    def others(self) -> tuple[float, int] | None:
        """(CPUs busy with other processes, the host's CPUs), or None on the first call
        (or where /proc/stat cannot be read)."""
        try:
            busy, cpus = self._read()
        except (OSError, ValueError, IndexError):
            return None
        now, own = time.monotonic(), time.process_time()
        last, self.last = self.last, (now, busy, own)
        if last is None or now - last[0] < 0.5:
            return None
        wall = now - last[0]
        return max(0.0, (busy - last[1] - (own - last[2])) / wall), cpus


@dataclass(frozen=True)
class Share:
    threads: int
    cpus: int
    workers: int
    why: str


def share_of(cpus: int, workers: int, configured: int = 0,
             load: tuple[float, int] | None = None) -> Share:
    """A worker's torch threads: ``configured`` (COREL_WORKER_TORCH_THREADS) when set, else
    its CPUs divided by the workers on its host (itself included), and no more than the
    host's CPUs that other processes leave idle (``load``: CPUs busy elsewhere, the host's
    CPUs; the other workers' among them), at least one."""
    workers = max(1, workers)
    if configured:
        return Share(configured, cpus, workers, "COREL_WORKER_TORCH_THREADS")
    threads = max(1, cpus // workers)
    why = (f"{cpus} CPU{'s' if cpus != 1 else ''} shared by {workers} worker"
           f"{'s' if workers != 1 else ''} on this host")
    if load is not None:
        busy, host_cpus = load
        idle = math.floor(host_cpus - busy + 0.5)
        if idle < threads:
            threads = max(1, idle)
            why += f", {busy:.1f} of the host's {host_cpus} kept busy by other processes"
    return Share(threads, cpus, workers, why)


def presence_ttl(interval: float) -> timedelta:
    """How long a presence counts without being written again: three rounds, and never
    less than 10 s (a worker busy starting a run still writes from its own thread)."""
    return timedelta(seconds=max(3 * interval, 10.0))


def announce(session: Session, name: str, host: str, cpus: int, threads: int) -> None:
    """Write (or refresh) this worker's presence."""
    now = utcnow()
    row = session.get(WorkerPresence, name)
    if row is None:
        session.add(WorkerPresence(name=name, host=host, cpus=cpus, threads=threads,
                                   started_at=now, seen_at=now))
    else:
        row.host, row.cpus, row.threads, row.seen_at = host, cpus, threads, now
    session.flush()


def workers_on(session: Session, host: str, ttl: timedelta) -> int:
    """The workers seen on ``host`` within ``ttl`` (rows older than a day are removed)."""
    now = utcnow()
    session.execute(delete(WorkerPresence).where(WorkerPresence.seen_at < now - timedelta(days=1)))
    return int(session.scalar(select(func.count()).select_from(WorkerPresence).where(
        WorkerPresence.host == host, WorkerPresence.seen_at >= now - ttl)) or 0)


def withdraw(session: Session, name: str) -> None:
    """This worker is stopping: the others of its host take its share at once."""
    session.execute(delete(WorkerPresence).where(WorkerPresence.name == name))
