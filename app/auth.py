"""Who may do what: the bearer token, and the paths and methods that need it.

:class:`app.middleware.RequestGuard` asks this on the headers alone, before any body is
read; :func:`app.deps.require_token` asks it again inside the routes (and documents them).
"""

from __future__ import annotations

import hmac

from app.settings import Settings

# Always open: probes, the API's own description, and the dashboard's pages and files,
# which hold no data (their scripts read the API with the token the user gives them).
OPEN_PATHS = frozenset({"/health", "/ready", "/docs", "/docs/oauth2-redirect", "/redoc",
                        "/openapi.json", "/"})
OPEN_PREFIXES = ("/ui/",)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


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


def needs_token(settings: Settings, method: str, path: str) -> bool:
    if settings.api_token is None or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return False
    return method not in READ_METHODS or settings.api_token_reads
