"""Domain errors carry their HTTP status; :func:`install_error_handlers` renders every
error the API answers as ``{"error": ..., "detail": ...}``."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.db import DATABASE_UNAVAILABLE

log = logging.getLogger("corel.api")

RETRY_AFTER = 5  # seconds, in every 503's Retry-After

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


class Forbidden(DomainError):
    status_code = 403
    error = "forbidden"


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


class QueueFull(DomainError):
    """A 429: the inputs waiting for a model are at their cap; ``retry_after`` (seconds,
    sent as Retry-After) is how long the waiting ones take to compute."""

    status_code = 429
    error = "queue_full"

    def __init__(self, detail: str, retry_after: int, **extra: Any) -> None:
        super().__init__(detail, retry_after=retry_after, **extra)
        self.retry_after = retry_after


class ClientGone(DomainError):
    """The client closed its connection before its answer was computed (nginx's 499): its
    inputs were dropped from the queue; the answer reaches no one."""

    status_code = 499
    error = "client_closed_request"


BODY_EXAMPLES: dict[str, str] = {
    "/experiments": '{"dataset": "digits", "budget": "quick"}',
    "/sweeps": '{"base": {"dataset": "digits", "budget": "quick"}, "grid": {"lam": [0.3, 0.6]}}',
    "/embed": '{"experiment_id": 1, "texts": ["a sentence"]} (or arrays, images, rows in place '
              'of texts)',
    "/predict": '{"experiment_id": 1, "texts": ["a sentence"]} (or arrays, images, rows in place '
                'of texts)',
    "/experiments/{experiment_id}/neighbors": '{"texts": ["a sentence"], "k": 5} (or arrays, '
                                              'images, rows in place of texts)',
}
"""An example body per route, for a message about a body that is no JSON object (the
routes' templates without their ``:int``)."""


def send_hint(route: str | None) -> str:
    """What a body sent to ``route`` (its template) should be: an example where we have one."""
    example = BODY_EXAMPLES.get((route or "").replace(":int}", "}"))
    if example is not None:
        return f"send a JSON object such as {example}"
    return "send a JSON object of this route's fields (GET /docs shows them)"


def route_of(request: Request) -> str | None:
    """The template of the route a request matched (``/experiments/{experiment_id:int}``)."""
    route = request.scope.get("route")
    return getattr(route, "path", None)


def describe_error(err: Mapping[str, Any], whole: str = "body", route: str | None = None) -> str:
    """One pydantic error as "field: message" (``whole`` names an error of the whole object;
    ``route``, the template of the route the body was sent to, picks the example a body
    that is no JSON object is shown)."""
    if err.get("type") == "json_invalid":  # its loc is ("body", <character offset>)
        offset = next((p for p in err.get("loc", ()) if isinstance(p, int)), None)
        why = (err.get("ctx") or {}).get("error", "")
        at = f" at character {offset}" if offset is not None else ""
        return f"the body is not valid JSON{at}" + (f" ({why})" if why else "") + f"; {send_hint(route)}"
    if whole == "body" and tuple(err.get("loc", ())) in ((), ("body",)) and err.get("type") in _NOT_OBJECT:
        return f"the body must be a JSON object, not {json_kind(err.get('input'))}; {send_hint(route)}"
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
    where = ".".join(loc) or whole
    value = err.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        shown = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
        return (f"{where}: must be a finite number; got {shown}"
                + ("" if value != value else " (a number past float's range, such as 1e400, reads as Infinity)"))
    if err.get("type") in ("literal_error", "enum") and "input" in err:
        # Say what was sent too: "on: Input should be 'test' or 'validation'; got 'train'".
        return f"{where}: {err.get('msg', 'invalid')}; got {err['input']!r}"
    return f"{where}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}"


def json_kind(value: Any) -> str:
    """What a JSON value is, in the words of JSON (an array, a string, ...)."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str | bytes):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__


def describe_errors(errors: Iterable[Mapping[str, Any]], whole: str = "body", route: str | None = None) -> str:
    return "; ".join(describe_error(e, whole, route) for e in errors)


def _field(err: Mapping[str, Any]) -> str:
    """The field an error is about, as the request names it (``body.lr``); an unparsable
    body's loc ends in a character offset, which is no field: ``body``."""
    loc = err.get("loc", ())
    if err.get("type") == "json_invalid":
        loc = [p for p in loc if not isinstance(p, int)]
    return ".".join(str(p) for p in loc)


_NOT_OBJECT = ("model_attributes_type", "dict_type", "model_type")


def _whole_body(err: Mapping[str, Any]) -> bool:
    """An error of the body as a whole: absent, or not an object."""
    return tuple(err.get("loc", ())) == ("body",) and err.get("type") in ("missing", *_NOT_OBJECT)


def _not_json(content_type: str) -> str | None:
    """What to say of a body that came with a content type other than JSON's (FastAPI reads
    such a body as bytes, not JSON, and says only that it is no object); None for JSON (for
    no content type: :data:`NO_CONTENT_TYPE`)."""
    media = content_type.split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    if not media:
        return NO_CONTENT_TYPE
    return (f"the body must be a JSON object sent with Content-Type: application/json; "
            f"this one came as {media}")


NO_CONTENT_TYPE = ("the body came with no Content-Type; send it with Content-Type: application/json "
                   "(on every route, a body without one is not read as JSON: a web page can send "
                   "such a body to the API without the browser asking first)")


def allowed_methods(paths: Mapping[str, Any], path: str) -> str:
    """The methods of every route of the OpenAPI document's ``paths`` that matches ``path``
    ("GET, POST"): a literal path's own, else those of every template it matches
    (``/experiments/{id}`` has GET and DELETE in two routes)."""
    methods: set[str] = set()
    for template, operations in paths.items():
        listed = {m.upper() for m in operations}
        if "{" not in template:
            if template == path:
                return ", ".join(sorted(listed))
            continue
        pattern = "^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            methods |= listed
    return ", ".join(sorted(methods))


FIRST = {"row": 0}
"""Path integers that count from 0 (a dataset's rows); every id counts from 1."""


def no_route(request: Request) -> str:
    """Why no route took a request: a path parameter that is no integer where a route of the
    OpenAPI document wants one (``/experiments/abc``), else that the path is none of the API's."""
    method, path = request.method, request.url.path
    for template, item in request.app.openapi().get("paths", {}).items():
        operation = item.get(method.lower())
        if "{" not in template or operation is None:
            continue
        parts = re.split(r"(\{\w+\})", template)
        found = re.fullmatch("".join(f"(?P<{p[1:-1]}>[^/]+)" if p.startswith("{") else re.escape(p)
                                     for p in parts), path)
        if found is None:
            continue
        integers = {p["name"] for p in operation.get("parameters", [])
                    if p.get("in") == "path" and (p.get("schema") or {}).get("type") == "integer"}
        for name, value in found.groupdict().items():
            if name in integers and not value.isdigit():
                first = FIRST.get(name, 1)
                return (f"{name} must be an integer from {first} to {MAX_ID} in {method} {template}; "
                        f"got {value!r}")
    return f"there is no route {method} {path}; GET /openapi.json (or /docs) lists the API's routes"


def unparsable_body(cause: BaseException | None) -> str:
    """Why FastAPI could not read a JSON body (it says only "There was an error parsing the
    body"), from the error it raised: bytes that are not UTF-8, or nesting past what the JSON
    reader follows."""
    if isinstance(cause, UnicodeDecodeError):
        return (f"the body is not UTF-8: byte 0x{cause.object[cause.start]:02x} at position "
                f"{cause.start} ({cause.reason}); send JSON encoded as UTF-8")
    if isinstance(cause, RecursionError):
        return ("the body nests arrays or objects deeper than the API reads (about 1,000 levels); "
                "send a flatter JSON document")
    return "the body could not be read as JSON" + (f" ({type(cause).__name__})" if cause else "")


def install_error_handlers(app: FastAPI) -> None:
    """The app's four exception handlers: domain errors (their own status), Starlette's
    HTTP errors, a database that does not answer (503), and invalid requests (422)."""

    @app.exception_handler(DomainError)
    async def _domain_error(_: Request, exc: DomainError) -> JSONResponse:
        headers = ({"Retry-After": str(RETRY_AFTER)} if exc.status_code == 503 else
                   {"Retry-After": str(exc.retry_after)} if isinstance(exc, QueueFull) else None)
        return JSONResponse(
            status_code=exc.status_code, content={"error": exc.error, "detail": exc.detail, **exc.extra},
            headers=headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (400 unparsable body, 404 no such path, 405, 413) in
        # the shape of every other error.
        try:
            error = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        except ValueError:
            error = "error"
        detail = str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":  # the router's: no route matched
            detail = no_route(request)
        elif exc.status_code == 405 and detail == "Method Not Allowed":
            allowed = allowed_methods(request.app.openapi().get("paths", {}), request.url.path)
            detail = (f"{request.method} is not allowed on {request.url.path}; it takes "
                      f"{allowed or 'no method'} (the Allow header lists them too)")
        elif exc.status_code == 400 and detail == "There was an error parsing the body":
            detail = unparsable_body(exc.__cause__)
        return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                            content={"error": error, "detail": detail})

    async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        # The request did nothing durable (its transaction rolled back): safe to retry.
        log.warning("database unavailable", extra={"error": type(exc).__name__})
        return JSONResponse(
            status_code=503, headers={"Retry-After": str(RETRY_AFTER)},
            content={"error": "service_unavailable",
                     "detail": "the database is unreachable or not answering; nothing was "
                               f"changed, retry in {RETRY_AFTER} s"})

    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        not_json = _not_json(request.headers.get("content-type", ""))
        errors = [
            {"field": _field(e), "message": not_json if not_json and _whole_body(e)
             else describe_error(e, route=route_of(request))}
            for e in exc.errors()
        ]
        return JSONResponse(
            status_code=422,
            content={"error": "invalid_request", "detail": "; ".join(e["message"] for e in errors),
                     "errors": errors},
        )
