"""The harness's own helpers (harness/): the one polling loop and the one port picker."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from harness.servers import free_port
from harness.wait import wait_until


def test_wait_until_returns_the_first_true_answer():
    calls = itertools.count()
    assert wait_until(lambda: next(calls) >= 2 and "there", 5, "the third call", interval=0.01) == "there"


def test_wait_until_names_what_it_waited_for_and_its_detail():
    with pytest.raises(AssertionError, match=r"after 0.05 s waiting for the door to open:\nlog tail"):
        wait_until(lambda: False, 0.05, "the door to open", interval=0.01, detail=lambda: "log tail")


def test_wait_until_counts_ignored_errors_as_not_yet_and_raises_the_others():
    answers = iter([ConnectionError(), ConnectionError(), True])

    def flaky() -> bool:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_until(flaky, 5, "a server", interval=0.01, ignore=(ConnectionError,)) is True
    with pytest.raises(ValueError):
        wait_until(lambda: int("x"), 5, "a number", ignore=(ConnectionError,))


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_and_outside_the_ephemeral_range():
    low, high = (int(x) for x in
                 Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert not any(low <= port <= high for port in ports)
