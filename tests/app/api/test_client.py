"""corel.client against the real service (uvicorn over HTTP, PostgreSQL, a real worker): train and
wait, embed, predict, neighbors, the clustering report, a sweep, a streamed upload, the
service's own message in a CorelError, a budget overridden named in the warnings; and its
retries on 503 against a server that answers 503 twice.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_client.py."""

from __future__ import annotations

import http.server
import threading

import pytest

from corel.client import Client, CorelError


def test_a_503_is_tried_again_after_retry_after():
    answers = [503, 503, 200]
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            code = answers.pop(0)
            body = b'{"detail": "restarting"}' if code == 503 else b'{"id": 7, "status": "queued"}'
            self.send_response(code)
            if code == 503:
                self.send_header("Retry-After", "0")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert Client(url, token="t0k").experiment(7).refresh() == {"id": 7, "status": "queued"}
        assert seen == ["Bearer t0k"] * 3
        answers[:] = [503, 503, 503]
        with pytest.raises(CorelError) as gave_up:
            Client(url, retries=2).experiment(7).refresh()
        assert gave_up.value.status == 503 and gave_up.value.message == "restarting"
    finally:
        server.shutdown()
