"""Nothing unauthenticated can exhaust the server: bodies are refused before they are read.

The service runs as `corel serve --no-worker` in a process of its own (its memory and its
temporary directory measurable), with a token set; 300 MB bodies of each kind arrive
without the token, and then with it but over the limits.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.settings import Settings
from harness.stack import Stack

# Alone, not beside other tests (make test): they measure a service's memory, which any
# work of its own still under way beside the request would add to.
pytestmark = pytest.mark.serial

TOKEN = "limits-test-token"
BIG = 300 * 1024 * 1024
CHUNK = b"0" * (1 << 20)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    root = tmp_path_factory.mktemp("limits")
    spool = root / "tmp"
    spool.mkdir()
    settings = Settings(var_dir=root / "var", api_token=TOKEN, max_upload_bytes=20 * 1024 * 1024)
    with Stack.on(settings, root) as stack:
        proc = stack.start_api(env={"TMPDIR": str(spool)})
        yield stack.port, proc.pid, spool


def post(port: int, path: str, content_type: str, length: int | None, send: int,
         token: str | None = None) -> int:
    """Send a request of ``send`` body bytes (declaring ``length``, or chunked when None)
    the way a client that does not stop for an early answer does; return the status."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}"]
    head.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if token:
        head.append(f"Authorization: Bearer {token}")
    answer = bytearray()

    def read() -> None:
        try:
            while b"\r\n" not in answer and (data := sock.recv(65536)):
                answer.extend(data)
        except OSError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # A multipart body opens a file part, so that the parser spools what follows.
    prologue = (b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.npz"\r\n'
                b"Content-Type: application/octet-stream\r\n\r\n") if "multipart" in content_type else b""
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        if prologue:
            sock.sendall(prologue if length is not None else b"%x\r\n%s\r\n" % (len(prologue), prologue))
        sent = len(prologue)
        while sent < send and reader.is_alive():
            part = CHUNK[: send - sent]
            sock.sendall(part if length is not None else b"%x\r\n%s\r\n" % (len(part), part))
            sent += len(part)
        if length is None:
            sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server answered and closed: what it should do
    reader.join(timeout=60)
    sock.close()
    assert answer, "no answer"
    return int(answer.split(b" ", 2)[1])


ROUTES = [("/experiments", "application/json"), ("/embed", "application/octet-stream"),
          ("/datasets", "multipart/form-data; boundary=xyz")]


@pytest.mark.parametrize(("path", "content_type"), ROUTES)
def test_an_unauthenticated_300_mb_body_costs_nothing(server, path, content_type) -> None:
    port, pid, spool = server
    before = rss_kib(pid)
    for length in (BIG, None):  # declared, and chunked with no length at all
        assert post(port, path, content_type, length, BIG) == 401
    grown = (rss_kib(pid) - before) / 1024
    assert grown < 20, f"{path}: RSS grew by {grown:.0f} MB"
    assert list(spool.iterdir()) == []


@pytest.mark.parametrize(("path", "content_type", "limit"), [
    ("/experiments", "application/json", 1 << 20),
    ("/embed", "application/octet-stream", 64 << 20),
    ("/datasets", "multipart/form-data; boundary=xyz", 21 << 20),
])
def test_bodies_over_the_limit_are_cut_off_there(server, path, content_type, limit) -> None:
    port, pid, spool = server
    before = rss_kib(pid)
    assert post(port, path, content_type, BIG, BIG, token=TOKEN) == 413  # declared: not read
    # A lying or missing length: read up to the limit, not further.
    assert post(port, path, content_type, None, BIG, token=TOKEN) == 413
    grown = (rss_kib(pid) - before) / 1024
    assert grown < 20 + 2 * limit / (1 << 20), f"{path}: RSS grew by {grown:.0f} MB"
    assert list(spool.iterdir()) == []
