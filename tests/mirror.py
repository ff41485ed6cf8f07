"""A local HTTP server standing in for a dataset mirror (``COREL_DOWNLOAD_MIRROR``): it
serves ``<dataset>/<file name>`` from a folder, so the download path runs offline."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path
from typing import Any


class Mirror:
    """Serves ``root`` over HTTP on 127.0.0.1; records each path requested. ``hold(path)``
    makes requests for that path wait until :meth:`release`."""

    def __init__(self, root: Path):
        self.root = root
        self.requests: list[str] = []
        self.held: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                mirror.requests.append(self.path)
                if self.path in mirror.held:
                    mirror.gate.wait(timeout=120)
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hold(self, path: str) -> None:
        self.held.add(path)
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
