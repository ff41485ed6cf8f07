"""This worker's share of its host's cores (app/jobs/workers.py), kept current by a
thread of its own and applied by the thread that runs a task: torch's thread count belongs
to the thread that sets it (OpenMP), so that thread sets it itself, when a task starts.

A training run takes the share it finds when it first starts and keeps it to its end, and
again when it resumes (``experiments.threads``, worker/runner.py): on some CPUs torch's
float32 results depend on the number of threads (a reduction split among them), so a run
whose threads followed the share as workers came and went differed from the same spec
trained alone. A worker that joins the host takes its share for the runs it starts."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

import torch
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import session_scope
from app.core.settings import Settings
from app.jobs import workers

log = logging.getLogger("corel.worker")

INTERVAL = 3.0  # seconds between two writes of this worker's presence
NAME = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:200]

_current: workers.Share | None = None
_load = workers.HostLoad()
_lock = threading.Lock()


def current() -> workers.Share | None:
    return _current


def refresh(factory: sessionmaker[Session], settings: Settings) -> workers.Share:
    """Write this worker's presence, count the workers of its host, and keep the share.
    The database away: the last share stands (the first one is the whole allowance)."""
    global _current
    cpus = workers.cpu_allowance()
    configured = settings.worker_torch_threads
    try:
        with session_scope(factory) as session:
            host = workers.host_key()
            last = _current.threads if _current is not None else cpus
            workers.announce(session, NAME, host, cpus, configured or last)
            count = workers.workers_on(session, host, workers.presence_ttl(INTERVAL))
        share = workers.share_of(cpus, count, configured, _load.others())
    except Exception as exc:
        if _current is not None:
            return _current
        log.warning("could not count this host's workers", extra={"error": type(exc).__name__})
        share = workers.share_of(cpus, 1, configured)
    with _lock:
        before, _current = _current, share
    if before is None or (before.threads, before.workers) != (share.threads, share.workers):
        log.info(f"torch threads: {share.threads} ({share.why})",
                 extra={"threads": share.threads, "cpus": share.cpus, "workers": share.workers})
    return share


def apply() -> None:
    """In the thread that runs a task, when it starts: torch's threads to this worker's share."""
    share = _current
    if share is not None and torch.get_num_threads() != share.threads:
        torch.set_num_threads(share.threads)


def threads_now() -> int:
    """The threads a run that starts now takes: this worker's share (torch's own count where
    no share is known yet)."""
    share = _current
    return share.threads if share is not None else torch.get_num_threads()


def pin(threads: int) -> None:
    """In the thread that trains: torch's threads to a run's own, for the whole run."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def keep_current(factory: sessionmaker[Session], settings: Settings, stop: threading.Event) -> None:
    """Refresh the share every few seconds until ``stop``; then withdraw, so that the
    other workers of the host take this one's cores at once."""
    while not stop.wait(INTERVAL):
        refresh(factory, settings)
    try:
        with session_scope(factory) as session:
            workers.withdraw(session, NAME)
    except Exception as exc:
        log.warning("could not withdraw this worker's presence", extra={"error": type(exc).__name__})
