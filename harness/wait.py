"""Waiting for something to happen, in the tests and the benchmarks alike: one loop instead
of a hand-written ``deadline = time.monotonic() + N`` per call site."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")


@functools.cache
def _probes() -> httpx.Client:
    """One client for every poll of the process: ``httpx.get`` builds a client, and with it a
    TLS context (its certificate bundle read and parsed, about 20 ms of CPU), at each call,
    for plain-HTTP polls too. No connection is kept: a polled server may be killed between
    two polls."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def http_status(url: str, timeout: float = 2.0) -> int:
    """The status of a GET of ``url`` (a probe: /health, /ready); raises ``httpx.HTTPError``
    where nothing answers."""
    return _probes().get(url, timeout=timeout).status_code


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1,
               ignore: tuple[type[BaseException], ...] = (),
               detail: Callable[[], object] | None = None) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something true, and
    return that. After ``timeout`` seconds raise ``AssertionError`` naming ``what`` was
    waited for (and ``detail()``, a log or the last answer, where given). Exceptions of the
    types in ``ignore`` count as "not yet" (a server still starting); any other, an assert
    inside ``predicate`` included, ends the wait at once."""
    deadline = time.monotonic() + timeout
    while True:
        got: T | None = None
        with contextlib.suppress(*ignore):
            got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout:g} s waiting for {what}"
            if detail is not None:
                message += f":\n{detail()}"
            raise AssertionError(message)
        time.sleep(interval)
