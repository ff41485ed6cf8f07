"""The API's pure ASGI middlewares, outermost first as :func:`app.main.create_app` adds
them: :class:`RequestMetrics`, :class:`AccessLog`, :class:`RequestGuard`,
:class:`AllowHeader`.

Each is an :class:`HttpMiddleware`: other scopes (lifespan) pass through untouched, and
each HTTP request goes to its ``handle``. Pure ASGI rather than Starlette's
``BaseHTTPMiddleware``: no task or copy per request. The three that look at the answer
do so through :func:`on_response_start`.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio.to_thread
import orjson
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.requests import Request

from app.access import audit
from app.access.tokens import (
    ANONYMOUS_READER,
    BOOTSTRAP,
    OPEN,
    TOKEN_PREFIX,
    Principal,
    Refused,
    bearer,
    is_admin_path,
    is_open_path,
    is_write,
    lookup_token,
    query_has_token,
)
from app.api.metrics import METHODS, METRICS_PATH, ApiMetrics, RouteTemplates
from app.api.state import AppState, state_of
from app.core import timing
from app.core.db import DATABASE_UNAVAILABLE, read_session
from app.core.errors import RETRY_AFTER, allowed_methods
from app.core.settings import Settings

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

    def allowed(self, path: str) -> str:
        return allowed_methods(self.document()["paths"], path)

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
                          self.settings.max_upload_bytes + MULTIPART_OVERHEAD,
                          self.settings.max_encoder_bytes + MULTIPART_OVERHEAD}
        }

    def body_limit(self, path: str) -> int:
        if path in ("/embed", "/predict", "/embed/files", "/predict/files"):
            return self.settings.max_inference_bytes
        if path == "/datasets":
            return self.settings.max_upload_bytes + MULTIPART_OVERHEAD
        if path == "/encoders":
            return self.settings.max_encoder_bytes + MULTIPART_OVERHEAD
        return self.settings.max_json_bytes

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        method, path = scope["method"], scope["path"]
        if not is_open_path(path):
            principal = await self.authenticate(scope, headers, send)
            if principal is None:
                return  # answered
            # Read by app.api.deps (the routes) and app.access.audit.
            scope.setdefault("state", {})["principal"] = principal
        limit = self.body_limit(path)
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared and (not declared.isdigit() or int(declared) > limit):
            await _answer(send, 413, "payload_too_large",
                          f"the body of {method} {path} is limited to {limit} bytes; "
                          f"this one declares {declared}")
            return
        await self.limited[limit](scope, receive, send)

    async def authenticate(self, scope: Any, headers: dict[bytes, bytes],
                           send: Any) -> Principal | None:
        """The request's principal (see app.access.tokens), or None once a refusal is sent: 401
        (no, a malformed, an unknown, a revoked or an expired token; a token in the URL),
        403 (a token whose scope does not allow this), 429 (too many failures from this
        address), 503 (the database cannot say)."""
        settings, state = self.settings, state_of(scope)
        method, path = scope["method"], scope["path"]
        address = (scope.get("client") or ("unknown",))[0]
        unauthorized = {"www-authenticate": "Bearer"}
        if query_has_token(scope.get("query_string", b"")):
            await _answer(send, 401, "unauthorized", "send the token in an 'Authorization: "
                          "Bearer <token>' header, never in the URL", unauthorized)
            return None
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        try:
            if settings.api_token is None and path == METRICS_PATH:
                # A scrape answers while the database does not (it reports it down), so it
                # never waits on whether users exist: open until they are known to.
                if not state.users_exist.cached(refresh_unknown=True):
                    return OPEN
            elif settings.api_token is None and not await _users_exist(state):
                return OPEN  # no users yet: open, as before there were any
            if not authorization:
                if not settings.api_token_reads and method in ("GET", "HEAD", "OPTIONS"):
                    return ANONYMOUS_READER
                await _answer(send, 401, "unauthorized", "this endpoint needs an "
                              "'Authorization: Bearer <token>' header", unauthorized)
                return None
            budget = state.auth_failures
            wait = budget.retry_after(address)
            if wait:
                log.warning("authentication refused: too many failures",
                            extra={"client": address, "path": path, "retry_after": wait})
                await _answer(send, 429, "too_many_requests", "too many failed authentications "
                              f"from this address; retry in {wait} s", {"retry-after": str(wait)})
                return None
            principal = await self.resolve(state, bearer(authorization))
        except DATABASE_UNAVAILABLE as exc:
            log.warning("database unavailable", extra={"error": type(exc).__name__})
            await _answer(send, 503, "service_unavailable", "the database is unreachable or "
                          f"not answering; nothing was changed, retry in {RETRY_AFTER} s",
                          {"retry-after": str(RETRY_AFTER)})
            return None
        if isinstance(principal, Refused):
            budget.fail(address)
            log.warning("authentication failed", extra={"client": address, "path": path,
                                                        "reason": principal.reason})
            if principal.user_id is not None:  # a revoked or expired token of a known user
                known = Principal(principal.user_id, "read", principal.token_id)
                await anyio.to_thread.run_sync(
                    lambda: audit.record_refusal(state.sessionmaker, Request(scope), known, 401,
                                                 principal.reason, always=True))
            await _answer(send, 401, "unauthorized", principal.reason, unauthorized)
            return None
        refusal = None
        if is_admin_path(path) and not principal.admin:
            refusal = f"this endpoint needs an admin token; this one's scope is {principal.scope}"
        elif is_write(method, path) and not principal.can_write:
            refusal = f"this token may only read (scope read); {method} {path} needs a write token"
        if refusal is not None:
            # A refused write of a known user is audited (app.access.audit).
            await anyio.to_thread.run_sync(audit.record_refusal, state.sessionmaker,
                                           Request(scope), principal, 403, refusal)
            await _answer(send, 403, "forbidden", refusal)
            return None
        return principal

    async def resolve(self, state: AppState, token: str | None) -> Principal | Refused:
        """The principal of a bearer token, or why it is refused."""
        if token is None:
            return Refused("this endpoint needs an 'Authorization: Bearer <token>' header")
        if self.settings.api_token is not None and hmac.compare_digest(
                token.encode(), self.settings.api_token.get_secret_value().encode()):
            return BOOTSTRAP
        if not token.startswith(TOKEN_PREFIX):
            return Refused("the bearer token is not valid")

        def lookup() -> Principal | Refused:
            with read_session(state.sessionmaker) as session:  # its last-use update stands alone
                return lookup_token(session, token)

        return await anyio.to_thread.run_sync(lookup)


async def _users_exist(state: AppState) -> bool:
    known = state.users_exist.cached()
    if known is None:  # the first request: wait for the answer once
        known = await anyio.to_thread.run_sync(state.users_exist.probe)
    return bool(known)


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
    """Counts and times every HTTP request, and, with ``server_timing``, tells its client
    where the time went: a ``Server-Timing`` header (``app``: from here to the answer's
    start; ``db``: its SQL statements, :mod:`app.core.timing`). A client's own measure
    less ``app`` is the time outside the app: in the socket's and the event loop's queues,
    and on the way.

    An event stream (``text/event-stream``) is counted and timed when its answer
    starts: it may stay open for hours, and its length says nothing of the service.
    """

    def __init__(self, app: Any, metrics: ApiMetrics, templates: RouteTemplates,
                 server_timing: bool = True) -> None:
        super().__init__(app)
        self.metrics = metrics
        self.templates = templates
        self.server_timing = server_timing

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        status = 500
        observed = False
        spent = timing.opened() if self.server_timing else None

        def observe() -> None:
            nonlocal observed
            observed = True
            method = scope["method"] if scope["method"] in METHODS else "OTHER"
            labels = (self.templates(scope), method, str(status))
            self.metrics.requests.labels(*labels).inc()
            self.metrics.request_seconds.labels(*labels).observe(time.perf_counter() - started)

        def record(message: Message) -> Message | None:
            nonlocal status
            status = message["status"]
            if any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                   for k, v in message.get("headers", ())):
                observe()
            if spent is None:
                return None
            return {**message, "headers": [*message.get("headers", ()), (b"server-timing", spent.header())]}

        try:
            await self.app(scope, receive, on_response_start(send, record))
        finally:
            if not observed:
                observe()
