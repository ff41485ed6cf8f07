"""The API's pure ASGI middlewares, outermost first as :func:`app.main.create_app` adds
them: :class:`RequestMetrics`, :class:`AccessLog`, :class:`RequestGuard`,
:class:`AllowHeader`.

Each is an :class:`HttpMiddleware`: other scopes (lifespan) pass through untouched, and
each HTTP request goes to its ``handle``. Pure ASGI rather than Starlette's
``BaseHTTPMiddleware``: no task or copy per request. The three that look at the answer
do so through :func:`on_response_start`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from app.auth import needs_token, token_problem
from app.metrics import METHODS, ApiMetrics, RouteTemplates
from app.openapi import path_pattern
from app.settings import Settings

log = logging.getLogger("corel.api")

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

MULTIPART_OVERHEAD = 1 << 20


class HttpMiddleware:
    """The skeleton: wraps ``app``; non-HTTP scopes go straight through to it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        raise NotImplementedError


def on_response_start(send: Send, see: Callable[[Message], Message | None]) -> Send:
    """``send``, with ``see`` shown each ``http.response.start`` message first (the
    status and headers); what ``see`` returns, if anything, is sent in its place."""

    async def send_seen(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = see(message) or message
        await send(message)

    return send_seen


class AccessLog(HttpMiddleware):
    """One structured log line per request."""

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        if not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        def record(message: Message) -> None:
            nonlocal status
            status = message["status"]

        try:
            await self.app(scope, receive, on_response_start(send, record))
        finally:
            log.info("request", extra={"method": scope["method"], "path": scope["path"],
                                       "status": status,
                                       "ms": round((time.perf_counter() - started) * 1000, 2)})


class AllowHeader(HttpMiddleware):
    """A 405 lists every method of the path, not only those of the first route that
    matched it (``/experiments/{id}`` has GET and DELETE in two routes). The methods
    come from the OpenAPI document, so the two always agree."""

    def __init__(self, app: Any, document: Any) -> None:
        super().__init__(app)
        self.document = document
        self._paths: list[tuple[re.Pattern[str], str]] | None = None

    def allowed(self, path: str) -> str:
        if self._paths is None:
            self._paths = [
                (path_pattern(template), ", ".join(sorted(m.upper() for m in operations)))
                for template, operations in self.document()["paths"].items()
            ]
        methods: set[str] = set()
        for pattern, listed in self._paths:
            if pattern.match(path):
                if "[^/]+" not in pattern.pattern:  # a literal path wins over a template
                    return listed
                methods.update(listed.split(", "))
        return ", ".join(sorted(methods))

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        def add_allow(message: Message) -> Message | None:
            if message["status"] != 405:
                return None
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
            allow = self.allowed(scope["path"]).encode()
            return {**message, "headers": [*headers, (b"allow", allow)]}

        await self.app(scope, receive, on_response_start(send, add_allow))


class RequestGuard(HttpMiddleware):
    """The first thing every request meets: its token and its size, before any body is read.

    An unauthenticated client must not be able to make the server read, parse or spool a
    body: the token is checked on the headers alone and a refused request is answered at
    once, its body never read. Then each route's body limit applies twice: to the declared
    ``Content-Length`` (413 before reading) and to the bytes as they stream in, so a missing
    or lying length is cut off at the limit (Starlette's body-limit responder, which FastAPI
    turns into a 413 wherever the body is read).
    """

    def __init__(self, app: Any, settings: Settings) -> None:
        super().__init__(app)
        self.settings = settings
        self.limited = {
            limit: RequestBodyLimitMiddleware(app, limit)
            for limit in {self.settings.max_json_bytes, self.settings.max_inference_bytes,
                          self.settings.max_upload_bytes + MULTIPART_OVERHEAD}
        }

    def body_limit(self, path: str) -> int:
        if path in ("/embed", "/predict"):
            return self.settings.max_inference_bytes
        if path == "/datasets":
            return self.settings.max_upload_bytes + MULTIPART_OVERHEAD
        return self.settings.max_json_bytes

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        method, path = scope["method"], scope["path"]
        if needs_token(self.settings, method, path):
            problem = token_problem(
                self.settings, headers.get(b"authorization", b"").decode("latin-1"))
            if problem is not None:
                await _answer(send, 401, "unauthorized", problem,
                              {"www-authenticate": "Bearer"})
                return
        limit = self.body_limit(path)
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared and (not declared.isdigit() or int(declared) > limit):
            await _answer(send, 413, "payload_too_large",
                          f"the body of {method} {path} is limited to {limit} bytes; "
                          f"this one declares {declared}")
            return
        await self.limited[limit](scope, receive, send)


async def _answer(send: Any, status: int, error: str, detail: str,
                  extra: dict[str, str] | None = None) -> None:
    body = orjson.dumps({"error": error, "detail": detail})
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               # The body is left unread: this connection cannot carry another request.
               (b"connection", b"close")]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestMetrics(HttpMiddleware):
    """Counts and times every HTTP request.

    An event stream (``text/event-stream``) is counted and timed when its answer
    starts: it may stay open for hours, and its length says nothing of the service.
    """

    def __init__(self, app: Any, metrics: ApiMetrics, templates: RouteTemplates) -> None:
        super().__init__(app)
        self.metrics = metrics
        self.templates = templates

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        status = 500
        observed = False

        def observe() -> None:
            nonlocal observed
            observed = True
            method = scope["method"] if scope["method"] in METHODS else "OTHER"
            labels = (self.templates(scope), method, str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.request_seconds.labels(*labels).observe(time.perf_counter() - started)

        def record(message: Message) -> None:
            nonlocal status
            status = message["status"]
            if any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                   for k, v in message.get("headers", ())):
                observe()

        try:
            await self.app(scope, receive, on_response_start(send, record))
        finally:
            if not observed:
                observe()
