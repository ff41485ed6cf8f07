"""Who is asking: the bearer token of a request, resolved to a :class:`Principal`.

:class:`app.api.middleware.RequestGuard` asks :meth:`Authenticator.authenticate` on the headers
alone, before any body is read, and keeps the answer in the request's state; the routes
read it there (:data:`app.api.deps.PrincipalDep`) and :mod:`app.access.policy` decides what
it may see and change.

The modes, in order:

- no ``COREL_API_TOKEN`` and no users in the database: open, as before users existed
  (every request is the :data:`OPEN` principal, any header ignored);
- ``COREL_API_TOKEN``: a valid admin token (the bootstrap admin), with or without users;
- a user's token (``corel tokens create``, ``POST /users/{id}/tokens``): looked up by its
  SHA-256 on every request, so a revoked or expired token fails on the next request in
  every API process.

A token in the query string is refused: URLs end up in logs and browser histories.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from urllib.parse import parse_qsl

from sqlalchemy import or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import ApiToken, User, as_utc, utcnow
from app.core.settings import Settings

log = logging.getLogger("corel.api")

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")
TOKEN_PREFIX = "corel_"

# Always open: probes, the API's own description, and the dashboard's pages and files,
# which hold no data (their scripts read the API with the token the user gives them).
OPEN_PATHS = frozenset({"/health", "/ready", "/docs", "/docs/oauth2-redirect", "/redoc",
                        "/openapi.json", "/"})
OPEN_PREFIXES = ("/ui/",)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# POSTs that only read: inference on a trained experiment.
READ_POSTS = ("/embed", "/predict", "/embed/files", "/predict/files")
READ_POST_SUFFIXES = ("/neighbors", "/neighbors/files")
ADMIN_PREFIXES = ("/users", "/tokens", "/audit")
QUERY_TOKEN_NAMES = frozenset({"token", "access_token", "api_token", "apikey", "api_key",
                               "authorization", "bearer"})


@dataclass(frozen=True)
class Principal:
    """Who a request acts for. ``user_id`` None: the open mode or the bootstrap admin (or,
    with COREL_API_TOKEN_READS=false, an anonymous reader)."""

    user_id: int | None
    scope: Scope
    token_id: int | None = None
    name: str = ""

    @property
    def admin(self) -> bool:
        return self.scope == "admin"

    @property
    def can_write(self) -> bool:
        return self.scope in ("write", "admin")


OPEN = Principal(None, "admin", name="open")
BOOTSTRAP = Principal(None, "admin", name="bootstrap admin")
ANONYMOUS_READER = Principal(None, "read", name="anonymous")


def is_open_path(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def is_write(method: str, path: str) -> bool:
    """Whether a request changes something (and is audited): every method but the reads,
    except the POSTs that only compute (/embed, /predict, /.../neighbors)."""
    if method in READ_METHODS:
        return False
    return not (path in READ_POSTS or path.endswith(READ_POST_SUFFIXES))


def is_admin_path(path: str) -> bool:
    return path.startswith(ADMIN_PREFIXES)


def needs_token(settings: Settings, method: str, path: str) -> bool:
    """With COREL_API_TOKEN set: whether this request needs a token (COREL_API_TOKEN_READS
    off leaves reads open)."""
    if settings.api_token is None or is_open_path(path):
        return False
    return method not in READ_METHODS or settings.api_token_reads


def new_token() -> str:
    """A new token: 256 random bits, with a prefix that secret scanners can find."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None when malformed."""
    scheme, _, given = authorization.partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given or " " in given:
        return None
    return given


def query_has_token(query_string: bytes) -> bool:
    return any(k.lower() in QUERY_TOKEN_NAMES
               for k, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))


@dataclass(frozen=True)
class Refused:
    """Why a bearer token was refused; the user and token it names where it names one (a
    revoked or an expired token), so that the refusal is audited as theirs."""

    reason: str
    user_id: int | None = None
    token_id: int | None = None


def lookup_token(session: Session, token: str, now: datetime | None = None) -> Principal | Refused:
    """The principal of a user's token, or why it is not valid. Looked up by its digest;
    the digests are compared again in constant time."""
    digest = token_digest(token)
    row = session.execute(
        select(ApiToken, User).join(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_sha256 == digest)).one_or_none()
    if row is None or not hmac.compare_digest(row[0].token_sha256.encode(), digest.encode()):
        return Refused("the bearer token is not valid")
    token_row, user = row
    if token_row.revoked_at is not None:
        return Refused("the bearer token has been revoked", user.id, token_row.id)
    if token_row.expires_at is not None and as_utc(token_row.expires_at) <= (now or utcnow()):
        return Refused("the bearer token has expired", user.id, token_row.id)
    scope: Scope = token_row.scope  # type: ignore[assignment]
    if scope == "admin" and not user.admin:
        scope = "write"  # an admin token of a user who is no longer admin
    _touch(session, token_row, now or utcnow())
    return Principal(user.id, scope, token_row.id, user.name)


LAST_USED_EVERY = timedelta(minutes=1)


def _touch(session: Session, token_row: ApiToken, now: datetime) -> None:
    """Record when a token was last used, at most once a minute (a write on every request
    would put one on every read). A database that refuses the write costs the request
    nothing: the authentication stands."""
    last = token_row.last_used_at
    if last is not None and now - as_utc(last) < LAST_USED_EVERY:
        return
    try:
        session.execute(update(ApiToken).where(
            ApiToken.id == token_row.id,
            or_(ApiToken.last_used_at.is_(None), ApiToken.last_used_at < now - LAST_USED_EVERY))
            .values(last_used_at=now))
        session.commit()
    except SQLAlchemyError as exc:
        session.rollback()
        log.warning("token last use not recorded", extra={"error": type(exc).__name__})


class FailureBudget:
    """Failed authentications per client address: more than ``limit`` within ``window``
    seconds, and that address is answered 429 until its oldest failure leaves the window."""

    def __init__(self, limit: int = 10, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._failures.setdefault(address, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def retry_after(self, address: str) -> int:
        """Seconds until ``address`` may try again; 0: it may now."""
        with self._lock:
            now = self.clock()
            times = self._recent(address, now)
            if len(times) < self.limit:
                if not times:
                    self._failures.pop(address, None)
                return 0
            return max(1, int(times[0] + self.window - now + 0.999))

    def fail(self, address: str) -> None:
        with self._lock:
            now = self.clock()
            self._recent(address, now).append(now)
            if len(self._failures) > 100_000:  # many addresses: forget the quietest
                for key in [k for k, v in self._failures.items() if len(v) < 2][:50_000]:
                    del self._failures[key]


class UsersExist:
    """Whether the database has users (the open mode ends with the first one).

    Asked on requests without a token when no COREL_API_TOKEN is set, so it must not make
    them wait on the database: once users are seen the answer stays (users are never
    deleted); before, a request uses the last answer and, when it is older than
    ``max_age`` seconds, has it refreshed in the background. Only the very first answer
    is waited for. A user created through this process's API is seen at once
    (:meth:`seen`); one created by ``corel users add`` elsewhere within about ``max_age``.
    """

    def __init__(self, factory: Callable[[], sessionmaker[Session]], max_age: float = 1.0) -> None:
        self.factory = factory
        self.max_age = max_age
        self._known: bool | None = None
        self._at = 0.0
        self._refreshing = False
        self._lock = threading.Lock()

    def seen(self) -> None:
        self._known, self._at = True, time.monotonic()

    def probe(self) -> bool:
        with self.factory()() as session:
            found = session.scalar(select(User.id).limit(1)) is not None
        with self._lock:
            self._known = self._known or found
            self._at = time.monotonic()
            self._refreshing = False
        return bool(self._known)

    def cached(self, refresh_unknown: bool = False) -> bool | None:
        """The answer without waiting (None: never asked yet); starts a refresh when stale
        (``refresh_unknown``: also when never asked)."""
        if self._known:
            return True
        with self._lock:
            stale = time.monotonic() - self._at > self.max_age
            if self._refreshing or not (stale or (refresh_unknown and self._known is None)):
                return self._known
            if self._known is None and not refresh_unknown:
                return None
            self._refreshing = True

        def refresh() -> None:
            try:
                self.probe()
            except Exception:  # the database is away: keep the last answer
                with self._lock:
                    self._refreshing = False

        threading.Thread(target=refresh, name="corel-users-probe", daemon=True).start()
        return self._known
