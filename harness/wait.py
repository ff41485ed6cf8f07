"""Waiting for something to happen, in the tests and the benchmarks alike: one loop instead
of a hand-written ``deadline = time.monotonic() + N`` per call site."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
