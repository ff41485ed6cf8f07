"""Where one request's time goes inside the API: the time its SQL statements took (and the
pings that check a pooled connection out, :func:`app.core.db.make_engine`), summed over
every connection it used, beside the time the whole app took (the outermost middleware,
:class:`app.api.middleware.RequestMetrics`, sends both as a ``Server-Timing`` header).

The outermost middleware opens a :class:`RequestTiming` for each request (:func:`opened`);
the engine's statement events (:func:`app.core.db.make_engine`) add to the one open in the
current context. A sync route runs on a thread of the pool with a copy of the request's
context (Starlette's ``run_in_threadpool``), and the copy holds the same object, so what it
adds is the request's. Outside a request (workers, the reconciler) nothing is open and
nothing is counted.
"""

from __future__ import annotations

import contextvars
import threading
import time
from dataclasses import dataclass, field

__all__ = ["RequestTiming", "add_statement", "current", "opened", "parse_header"]


@dataclass
class RequestTiming:
    """One request's figures so far: when it entered the app (``time.perf_counter()``),
    its SQL statements' summed seconds and their count."""

    started: float = field(default_factory=time.perf_counter)
    db_seconds: float = 0.0
    statements: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, seconds: float) -> None:
        with self._lock:  # a request's dependencies may run on two threads of the pool
            self.db_seconds += seconds
            self.statements += 1

    def header(self) -> bytes:
        """The ``Server-Timing`` value (milliseconds, W3C Server Timing): ``app``, the time
        from entering the app to now (its answer starting), and ``db``, its statements'."""
        app_ms = 1000.0 * (time.perf_counter() - self.started)
        return (f'app;dur={app_ms:.2f};desc="in the app", '
                f'db;dur={1000.0 * self.db_seconds:.2f};desc="{self.statements} SQL statements"').encode()


_current: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar("corel_request_timing",
                                                                               default=None)


def opened() -> RequestTiming:
    """A new timing for the request this context serves, from now."""
    timing = RequestTiming()
    _current.set(timing)
    return timing


def current() -> RequestTiming | None:
    return _current.get()


def parse_header(value: str) -> dict[str, tuple[float, str]]:
    """A ``Server-Timing`` value's metrics with a duration: name -> (ms, description), as a
    client reads them (bench/api_load.py)."""
    found = {}
    for part in value.split(","):
        name, *params = [p.strip() for p in part.split(";")]
        fields = dict(p.split("=", 1) for p in params if "=" in p)
        if name and "dur" in fields:
            found[name] = (float(fields["dur"]), fields.get("desc", "").strip('"'))
    return found


def add_statement(seconds: float) -> None:
    """A statement of ``seconds``, counted to the request being served, if any."""
    timing = _current.get()
    if timing is not None:
        timing.add(seconds)
