"""Nothing a test starts outlives the test run (as MLflow's conftest reports what a run left
behind): after each pass, every process that the pass started and that still runs (a
server, a worker, SeaweedFS, a fault test's PostgreSQL or Redis), and every thread of
corel's own (``corel-*``) in a test process that is no daemon (it would keep the process
alive), fails the run, named; the processes are then stopped. corel's daemon threads still
alive are listed (they end with the process).

A process is known as the pass's by a mark in its environment, set at the pass's start and
inherited by every process it starts, however deep (a worker's pool, a server's own
children) and wherever it is reparented once its parent has gone: a process that a test
started in a session of its own and forgot is found as surely as a direct child. Under
pytest-xdist the check runs once, in the controller, when every test process has ended.

``tests/test_leftovers.py`` shows that a worker left behind fails the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

MARK = "LEFTOVER_CHECK_RUN"
"""The environment variable whose value names the pass (a fresh id)."""

GRACE = float(os.environ.get("COREL_TEST_LEFTOVER_GRACE", "15"))
"""Seconds a process of the pass has to end after the last test (a test process of
pytest-xdist that has reported but not yet exited, a server's own shutdown)."""


def _marked(run_id: str) -> dict[int, str]:
    """Every live process (but this one and its ancestors) whose environment holds the
    pass's mark: pid -> its command line."""
    mine = {os.getpid()}
    pid = os.getpid()
    while pid > 1:  # this process's ancestors (an xdist controller's parent, make, ...)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            break
        pid = int(fields[1])
        mine.add(pid)
    wanted = f"{MARK}={run_id}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # ended, not yet reaped: nothing runs
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()[:200]
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
    return found


def _threads(daemons: bool) -> list[str]:
    """corel's own threads of this process still alive (they are named ``corel-*``: a
    service's collector, reconciler, probes, inference team; a worker's lease keeper), the
    daemons among them or the others. Libraries' threads (torch's, ONNX Runtime's, a
    client's pool) are theirs to manage, not counted."""
    return [t.name for t in threading.enumerate()
            if t is not threading.main_thread() and t.name.startswith("corel-") and t.is_alive()
            and t.daemon == daemons]


def _check_threads(session: pytest.Session, where: str) -> None:
    """A thread that is no daemon would keep the test process from ending: it fails the
    run. Daemons end with the process, and are listed."""
    stuck = _threads(daemons=False)
    deadline = time.monotonic() + GRACE  # a pool's thread finishing its last item, a probe
    while stuck and time.monotonic() < deadline:
        time.sleep(0.25)
        stuck = _threads(daemons=False)
    daemons = _threads(daemons=True)
    if stuck:
        _report(session.config, f"threads left running{where}", stuck)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if daemons:
        _report(session.config, f"daemon threads still alive{where} (they end with the process)",
                sorted(set(daemons)), red=False)


_RUN = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller, or a run without xdist
        os.environ[MARK] = uuid.uuid4().hex
    config.stash[_RUN] = os.environ.get(MARK, "")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run_id = config.stash.get(_RUN, "")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a test process's threads, said by it
        _check_threads(session, f" in {os.environ['PYTEST_XDIST_WORKER']}")
        return
    if not run_id:
        return
    deadline = time.monotonic() + GRACE
    left = _marked(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = _marked(run_id)
    problems = [f"pid {pid}: {cmd}" for pid, cmd in sorted(left.items())]
    if problems:
        _report(config, "processes the tests started and left running", problems)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _check_threads(session, "")
    for pid in left:  # then stopped, so that they do not outlive the run itself
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _report(config: pytest.Config, what: str, lines: list[str], red: bool = True) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    text = f"LEFTOVERS: {what} ({len(lines)}):\n" + "\n".join(f"  {line}" for line in lines)
    if reporter is not None:
        reporter.write_line(text, red=red, bold=red)
    else:
        print(text)
