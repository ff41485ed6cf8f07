"""The leftover check (tests/leftovers.py) fails a run whose test left a worker running, names
it, and stops it; a run that cleans up after itself passes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import REPO

LEAKY = """
import subprocess, sys


def test_starts_a_worker_and_forgets_it():
    # As a test that started `corel worker` in a session of its own and never stopped it.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "corel-worker-left-behind"],
                     start_new_session=True)
"""

TIDY = """
import subprocess, sys


def test_starts_a_process_and_stops_it():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    proc.kill()
    proc.wait()
"""

THREAD = """
import threading

STOP = threading.Event()


def test_leaves_a_corel_thread_running():
    threading.Thread(target=STOP.wait, name="corel-forgotten", daemon=False).start()
    threading.Thread(target=STOP.wait, name="corel-daemon", daemon=True).start()
"""

# So that the process ends once the check has judged it (at the session's finish), and not
# before: the threads are let go at pytest_unconfigure, which comes after (a timer of 8 s did
# it, which made the run wait for it).
LET_GO = """
def pytest_unconfigure(config):
    import test_case

    test_case.STOP.set()
"""


def _run(tmp_path: Path, source: str, *args: str, conftest: str = "") -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_case.py").write_text(textwrap.dedent(source))
    if conftest:
        (tmp_path / "conftest.py").write_text(textwrap.dedent(conftest))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "LEFTOVER_CHECK_RUN"))}
    env["PYTHONPATH"] = str(REPO)
    env["COREL_TEST_LEFTOVER_GRACE"] = "2"  # a leftover here is certain: no need to wait 15 s
    # Without the plugins these cases never use (Hypothesis's, Schemathesis's, AnyIO's): they
    # took 2.2 of each run's 2.5 s to load, in each of its processes.
    quiet = ["-p", "no:hypothesispytest", "-p", "no:schemathesis", "-p", "no:anyio"]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.leftovers", "-p", "no:cacheprovider",
                           *quiet, "--rootdir", str(tmp_path), str(tmp_path / "test_case.py"), *args],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _alive(needle: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle.encode() in (entry / "cmdline").read_bytes():
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def test_a_worker_left_behind_fails_the_run_and_is_stopped(tmp_path):
    done = _run(tmp_path, LEAKY)
    assert done.returncode == 1, done.stdout + done.stderr  # the test itself passed
    assert "1 passed" in done.stdout
    assert "LEFTOVERS: processes the tests started and left running (1)" in done.stdout, done.stdout
    assert "corel-worker-left-behind" in done.stdout
    deadline = time.monotonic() + 10
    while _alive("corel-worker-left-behind") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive("corel-worker-left-behind")  # stopped by the check


def test_a_worker_left_behind_under_xdist_fails_the_run_too(tmp_path):
    done = _run(tmp_path, LEAKY, "-n", "2")
    assert done.returncode == 1 and "corel-worker-left-behind" in done.stdout, done.stdout + done.stderr


def test_a_run_that_stops_what_it_started_passes(tmp_path):
    done = _run(tmp_path, TIDY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LEFTOVERS" not in done.stdout


def test_a_corel_thread_left_alive_fails_the_run(tmp_path):
    done = _run(tmp_path, THREAD, conftest=LET_GO)
    assert done.returncode == 1 and "LEFTOVERS: threads left running (1):\n  corel-forgotten" in done.stdout, done.stdout
    assert "daemon threads still alive (they end with the process) (1):\n  corel-daemon" in done.stdout
