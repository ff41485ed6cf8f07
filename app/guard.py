"""The first thing every request meets: its token and its size, before any body is read.

An unauthenticated client must not be able to make the server read, parse or spool a
body: the token is checked on the headers alone and a refused request is answered at
once, its body never read. Then each route's body limit applies twice: to the declared
``Content-Length`` (413 before reading) and to the bytes as they stream in, so a missing
or lying length is cut off at the limit (Starlette's body-limit responder, which FastAPI
turns into a 413 wherever the body is read).
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from app.settings import Settings

# Always open: probes, the API's own description, and the dashboard's pages and files,
# which hold no data (their scripts read the API with the token the user gives them).
OPEN_PATHS = frozenset({"/health", "/ready", "/docs", "/docs/oauth2-redirect", "/redoc",
                        "/openapi.json", "/"})
OPEN_PREFIXES = ("/ui/",)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MULTIPART_OVERHEAD = 1 << 20


def token_problem(settings: Settings, authorization: str) -> str | None:
    """Why ``authorization`` does not carry the API token (None: it does)."""
    assert settings.api_token is not None
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return "this endpoint needs an 'Authorization: Bearer <token>' header"
    expected = settings.api_token.get_secret_value().encode()
    if not hmac.compare_digest(given.strip().encode(), expected):
        return "the bearer token is not valid"
    return None


class RequestGuard:
    """Pure ASGI middleware, outermost: token, then declared size, then streamed size."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
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

    def needs_token(self, method: str, path: str) -> bool:
        if self.settings.api_token is None or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return False
        return method not in READ_METHODS or self.settings.api_token_reads

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        method, path = scope["method"], scope["path"]
        if self.needs_token(method, path):
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
