"""The database watchdog's thread ends once it has nothing to watch, and the next statement
starts another: one thread per engine ran forever, past the engine's disposal (the leftover
check, tests/leftovers.py, listed them at the end of every pass)."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

from app.core.db import Watchdog


def test_the_watchdog_thread_ends_when_idle_and_starts_again_when_armed(monkeypatch):
    monkeypatch.setattr(Watchdog, "IDLE_SECONDS", 0.2)
    ours, theirs = socket.socketpair()
    conn = SimpleNamespace(pgconn=SimpleNamespace(socket=ours.fileno()))  # what it cuts: the socket
    dog = Watchdog()
    dog.arm(conn, 30.0)
    first = dog._thread
    assert first is not None and first.is_alive()
    # Let the thread take the lock and sleep until the 30-s deadline: the order in which
    # it lingered past its idle time (disarm did not wake it; CI saw it on an Intel Xeon).
    time.sleep(0.2)
    assert dog.disarm(conn) is False
    first.join(timeout=5)
    assert not first.is_alive() and dog._thread is None
    # Armed again it watches again: a deadline that runs out still cuts the socket.
    dog.arm(conn, 0.05)
    assert dog._thread is not None and dog._thread is not first
    time.sleep(0.5)
    assert dog.disarm(conn) is True  # it had run out
    assert theirs.recv(1) == b""  # the other end sees the socket shut down
    ours.close()
    theirs.close()
