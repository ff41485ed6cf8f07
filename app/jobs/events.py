"""How an API process learns that an experiment changed, whoever changed it.

Writers (the worker after each epoch and status change, the API when it cancels) call
:func:`publish` inside the transaction that makes the change. On PostgreSQL that is a
``NOTIFY``, which the database delivers when, and only if, the transaction commits.

Each API process runs one :class:`EventHub`. Streams subscribe to the experiments they
follow and sleep until the hub wakes them with the ids that changed; they then read the
new rows once. The hub learns of changes

* on PostgreSQL, from one ``LISTEN`` connection in a thread of its own, which reconnects
  after a pause when the database goes away (and then wakes every stream: notifications
  sent meanwhile are lost), plus a slow sweep as a safety net;
* on SQLite (the embedded default, which has no notifications), from one poller per
  process: every ``POLL_SECONDS``, one query of ``(id, status, current_epoch)`` for the
  experiments that have listeners, waking the streams whose values changed.

Either way the database is read once per change per stream, and polled at most once per
interval per process, however many clients watch.

The same channel carries one more kind of news, on PostgreSQL only: :func:`publish_warm`, a
run (and an index of its) that requests are about to be served from, sent by a promotion
before its flip. Each API process's hub hands it to ``on_warm`` on a thread of its own, which
loads the model and the index into the process's caches, so that the first request after the
flip is not the one that loads them. On SQLite (one process, the embedded default) it is not
sent: the first request loads them, as before.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy import make_url, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import DATABASE_UNAVAILABLE
from app.core.models import Experiment

log = logging.getLogger("corel.events")

CHANNEL = "corel_events"
POLL_SECONDS = 0.5  # SQLite: how often the one poller of a process looks
SAFETY_SECONDS = 30.0  # PostgreSQL: the same look, in case a notification went missing
RECONNECT_MAX_PAUSE = 10.0  # the listener's pause between attempts doubles up to this
PAYLOAD_BYTES = 7000  # NOTIFY payloads must stay below 8000 bytes
QUERY_CHUNK = 500  # ids per IN (...) list: SQLite allows 999 parameters by default
WARM = "warm:"  # a payload that asks the API processes to load a run (and an index) now


def publish(session: Session, experiment_ids: Iterable[int]) -> None:
    """Tell every API process that these experiments changed (a new epoch or status).

    On PostgreSQL: ``NOTIFY`` in the session's transaction, so the news goes out when the
    change commits and not at all if it rolls back. On SQLite: nothing (the hub polls).
    """
    ids = sorted(set(experiment_ids))
    if not ids or session.get_bind().dialect.name != "postgresql":
        return
    payload: list[str] = []
    size = 0
    for experiment_id in ids:
        item = str(experiment_id)
        if payload and size + len(item) + 1 > PAYLOAD_BYTES:
            _notify(session, ",".join(payload))
            payload, size = [], 0
        payload.append(item)
        size += len(item) + 1
    _notify(session, ",".join(payload))


def _notify(session: Session, payload: str) -> None:
    session.execute(text("SELECT pg_notify(:channel, :payload)"),
                    {"channel": CHANNEL, "payload": payload})


def publish_warm(session: Session, experiment_id: int, index_id: int | None = None) -> None:
    """Tell every API process to load run ``experiment_id``'s model (and index ``index_id``,
    one of its) into its caches now: they are about to be served (a promotion's candidate,
    before its flip). Sent when the session's transaction commits; nothing on SQLite."""
    if session.get_bind().dialect.name != "postgresql":
        return
    _notify(session, f"{WARM}{experiment_id}" + ("" if index_id is None else f":{index_id}"))


def _parse_payload(payload: str) -> set[int]:
    return {int(part) for part in payload.split(",") if part.strip().isdigit()}


def _parse_warm(payload: str) -> tuple[int, int | None] | None:
    """``warm:<run>[:<index>]`` as (run, index or None); None for anything else."""
    parts = payload[len(WARM):].split(":") if payload.startswith(WARM) else []
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), (int(parts[1]) if len(parts) == 2 else None)


class Subscription:
    """What one stream waits on: the ids it follows and those woken since it last looked.

    It starts with every id woken, so that the stream's first read covers them all.
    Touched only on the event loop's thread.
    """

    def __init__(self, ids: Iterable[int]) -> None:
        self.ids = frozenset(ids)
        self.woken: set[int] = set(self.ids)
        self._event = asyncio.Event()
        self._event.set()

    def wake(self, ids: Iterable[int]) -> None:
        self.woken.update(i for i in ids if i in self.ids)
        self._event.set()

    async def wait(self, timeout: float) -> set[int] | None:
        """The ids woken since the last call, or None if none was within ``timeout``."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return None
        self._event.clear()
        woken, self.woken = self.woken, set()
        return woken


class EventHub:
    """One per API process: wakes the streams of the experiments that changed."""

    def __init__(self, factory: sessionmaker[Session], database_url: str,
                 on_warm: Callable[[int, int | None], None] | None = None) -> None:
        """``on_warm(run, index or None)``: what a :func:`publish_warm` does here (run on the
        hub's warming thread, one at a time; its errors are logged, not raised)."""
        self.factory = factory
        self.on_warm = on_warm
        self._warmer: ThreadPoolExecutor | None = None
        self.url = make_url(database_url)
        self.uses_listen = self.url.get_backend_name() == "postgresql"
        self.listening = threading.Event()  # set while the LISTEN connection is up
        self._subscribers: dict[int, set[Subscription]] = {}
        self._seen: dict[int, tuple[str, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._poller: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping.clear()
        if self.uses_listen:
            if self.on_warm is not None:
                self._warmer = ThreadPoolExecutor(1, thread_name_prefix="corel-warm")
            self._thread = threading.Thread(target=self._listen, name="corel-events-listen",
                                            daemon=True)
            self._thread.start()
        interval = SAFETY_SECONDS if self.uses_listen else POLL_SECONDS
        self._poller = asyncio.create_task(self._poll(interval), name="corel-events-poll")

    async def stop(self) -> None:
        self._stopping.set()
        if self._poller is not None:
            self._poller.cancel()
            with suppress(asyncio.CancelledError):
                await self._poller
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)
        if self._warmer is not None:  # a load under way ends; those queued behind it are dropped
            await asyncio.to_thread(self._warmer.shutdown, True, cancel_futures=True)
        self._thread = self._poller = self._warmer = None

    @contextmanager
    def subscribe(self, experiment_ids: Iterable[int]) -> Iterator[Subscription]:
        """Follow these experiments for the duration of the block (on the loop's thread)."""
        sub = Subscription(experiment_ids)
        for i in sub.ids:
            self._subscribers.setdefault(i, set()).add(sub)
        try:
            yield sub
        finally:
            for i in sub.ids:
                subs = self._subscribers.get(i)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._subscribers[i]

    def watched(self) -> list[int]:
        return list(self._subscribers)

    def wake(self, experiment_ids: Iterable[int] | None) -> None:
        """Wake the streams following these experiments (None: every stream)."""
        if experiment_ids is None:
            subs = {s for group in self._subscribers.values() for s in group}
            for sub in subs:
                sub.wake(sub.ids)
            return
        ids = set(experiment_ids)
        for i in ids:
            for sub in self._subscribers.get(i, ()):
                sub.wake(ids)

    def _wake_from_thread(self, experiment_ids: set[int] | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self.wake, experiment_ids)

    # -- PostgreSQL: one LISTEN connection -------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        url = self.url.set(drivername="postgresql")
        return {
            "conninfo": url.render_as_string(hide_password=False),
            "autocommit": True,
            "connect_timeout": 5,
            # A database that vanished without closing the socket (a dead host, a cut
            # network) is noticed within about a minute instead of never.
            "keepalives": 1, "keepalives_idle": 20, "keepalives_interval": 5,
            "keepalives_count": 3, "tcp_user_timeout": 30000,
        }

    def _listen(self) -> None:
        import psycopg

        pause = 0.5
        while not self._stopping.is_set():
            try:
                with psycopg.connect(**self._connect_kwargs()) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    pause = 0.5
                    log.info("listening for experiment changes", extra={"channel": CHANNEL})
                    # Whatever was notified while no one listened is lost: look again.
                    self._wake_from_thread(None)
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.payload.startswith(WARM):
                                self._warm(note.payload)
                            else:
                                self._wake_from_thread(_parse_payload(note.payload))
            except Exception as exc:  # any failure of the connection: try again later
                if self._stopping.is_set():
                    break
                log.warning("event listener lost the database; reconnecting",
                            extra={"error": f"{type(exc).__name__}: {str(exc).strip()[:200]}",
                                   "pause": pause})
            finally:
                self.listening.clear()
            self._stopping.wait(pause)
            pause = min(pause * 2, RECONNECT_MAX_PAUSE)

    def _warm(self, payload: str) -> None:
        what = _parse_warm(payload)
        warmer, on_warm = self._warmer, self.on_warm
        if what is None or warmer is None or on_warm is None:
            return

        def load() -> None:
            try:
                on_warm(*what)
            except Exception as exc:  # the first request loads it instead, and says why not
                log.warning("could not warm a run before serving it",
                            extra={"experiment": what[0], "index": what[1],
                                   "error": f"{type(exc).__name__}: {str(exc)[:200]}"})

        with suppress(RuntimeError):  # the hub is stopping
            warmer.submit(load)

    # -- every backend: one cheap look at the watched rows --------------------------------

    async def _poll(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            ids = self.watched()
            for gone in set(self._seen) - set(ids):
                del self._seen[gone]
            if not ids:
                continue
            try:
                states = await asyncio.to_thread(self._states, ids)
            except DATABASE_UNAVAILABLE as exc:
                log.warning("event poller cannot read the database",
                            extra={"error": type(exc).__name__})
                continue
            changed = set()
            for i in ids:
                state = states.get(i)
                # A row seen for the first time wakes its streams too: it may have
                # changed between their own read and this one.
                if state is None or self._seen.get(i) != state:
                    changed.add(i)
                if state is None:
                    self._seen.pop(i, None)
                else:
                    self._seen[i] = state
            if changed:
                self.wake(changed)

    def _states(self, ids: list[int]) -> dict[int, tuple[str, int]]:
        states: dict[int, tuple[str, int]] = {}
        with self.factory() as session:
            for start in range(0, len(ids), QUERY_CHUNK):
                rows = session.execute(
                    select(Experiment.id, Experiment.status, Experiment.current_epoch)
                    .where(Experiment.id.in_(ids[start:start + QUERY_CHUNK])))
                states.update({i: (status, epoch) for i, status, epoch in rows})
        return states
