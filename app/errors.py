"""Domain errors carry their HTTP status; one handler renders them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MAX_ID = 2**31 - 1
"""Largest row id (PostgreSQL ``integer``); a larger one cannot exist."""
PAGE_LIMIT = ("Rows a page holds at most; more than the server's page size "
              "(COREL_PAGE_SIZE_LIMIT, default 200) gives that many: the answer's limit says.")

MAX_OFFSET = 2**31 - 1
"""Largest list offset: past every row there can be, and within what both databases take."""


def check_id(kind: str, value: int) -> None:
    """404 for an id no row can have (0, negative, or past :data:`MAX_ID`), before the
    database sees it: out-of-range literals are errors there, not empty results."""
    if not 1 <= value <= MAX_ID:
        raise NotFound(f"{kind} {value} does not exist (ids run from 1 to {MAX_ID})")


class DomainError(Exception):
    status_code = 400
    error = "bad_request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class Unauthorized(DomainError):
    status_code = 401
    error = "unauthorized"


class NotFound(DomainError):
    status_code = 404
    error = "not_found"


class Conflict(DomainError):
    status_code = 409
    error = "conflict"


class PayloadTooLarge(DomainError):
    status_code = 413
    error = "payload_too_large"


class InvalidInput(DomainError):
    status_code = 422
    error = "invalid_input"


class ServiceUnavailable(DomainError):
    status_code = 503
    error = "service_unavailable"


def describe_error(err: Mapping[str, Any], whole: str = "body") -> str:
    """One pydantic error as "field: message" (``whole`` names an error of the whole object)."""
    if err.get("type") == "json_invalid":  # its loc is ("body", <character offset>)
        offset = next((p for p in err.get("loc", ()) if isinstance(p, int)), None)
        why = (err.get("ctx") or {}).get("error", "")
        at = f" at character {offset}" if offset is not None else ""
        return (f"the body is not valid JSON{at}" + (f" ({why})" if why else "")
                + "; send a JSON object such as {\"dataset\": \"digits\"}")
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
    where = ".".join(loc) or whole
    if err.get("type") in ("literal_error", "enum") and "input" in err:
        # Say what was sent too: "on: Input should be 'test' or 'validation'; got 'train'".
        return f"{where}: {err.get('msg', 'invalid')}; got {err['input']!r}"
    return f"{where}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}"


def describe_errors(errors: Iterable[Mapping[str, Any]], whole: str = "body") -> str:
    return "; ".join(describe_error(e, whole) for e in errors)
