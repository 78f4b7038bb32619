"""Every error the API answers, in the spec's shapes.

Validation failures: 422 ``{"detail": [{loc, msg, type, input, ctx}]}`` with ``loc``
starting at ``body``, ``query`` or ``path``; every entry is built by :func:`_entry`, which
repeats nothing of a secret field (``input`` null, and a ``msg`` that does not quote it).
Everything else: ``{"detail": "message"}``; a database out of reach or out of connections
answers 503 with ``Retry-After``, and an unexpected error 500, its log quoting nothing the
request sent.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any

import msgspec
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, SerializationException, ValidationException
from litestar.status_codes import (
    HTTP_401_UNAUTHORIZED,
    HTTP_403_FORBIDDEN,
    HTTP_404_NOT_FOUND,
    HTTP_409_CONFLICT,
    HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    HTTP_415_UNSUPPORTED_MEDIA_TYPE,
    HTTP_422_UNPROCESSABLE_ENTITY,
    HTTP_429_TOO_MANY_REQUESTS,
    HTTP_500_INTERNAL_SERVER_ERROR,
    HTTP_503_SERVICE_UNAVAILABLE,
)
from litestar.types import Empty

from shared.db.errors import database_unavailable, describe_database_error
from shared.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PermissionDenied,
    RetryLater,
    ServiceUnavailable,
    SparError,
    TooLarge,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
    causes,
)
from shared.schemas import UnstorableJson, holds_secret, within_depth
from shared.validation import classify, path_tokens

log = logging.getLogger("spar.api")


class ValidationErrorItem(msgspec.Struct):
    loc: list[str]
    msg: str
    type: str
    input: Any
    ctx: dict[str, Any]


class ValidationErrorBody(msgspec.Struct):
    """The spec's validation error body (§7)."""

    detail: list[ValidationErrorItem]


_STATUS = {
    NotFound: HTTP_404_NOT_FOUND,
    Conflict: HTTP_409_CONFLICT,
    PermissionDenied: HTTP_403_FORBIDDEN,
    Unauthorized: HTTP_401_UNAUTHORIZED,
    TooManyRequests: HTTP_429_TOO_MANY_REQUESTS,
    TooLarge: HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    UnsupportedMediaType: HTTP_415_UNSUPPORTED_MEDIA_TYPE,
    ServiceUnavailable: HTTP_503_SERVICE_UNAVAILABLE,
}
# How long a client waits before sending again a request the database could not serve.
DATABASE_RETRY_AFTER_S = 5


def detail_response(
    status_code: int, detail: str, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        {"detail": detail}, status_code=status_code, media_type=MediaType.JSON, headers=headers
    )


def validation_response(items: list[ValidationErrorItem]) -> Response:
    return Response(
        ValidationErrorBody(detail=items),
        status_code=HTTP_422_UNPROCESSABLE_ENTITY,
        media_type=MediaType.JSON,
    )


# --- the spec's entries (msgspec's messages are read by shared.validation) ---------------


def _lookup(document: Any, path: list[str]) -> Any:
    for key in path:
        if isinstance(document, dict):
            document = document.get(key)
        elif isinstance(document, list) and key.isdigit() and int(key) < len(document):
            document = document[int(key)]
        else:
            return None
    return document


def _request_body(request: Request[Any, Any, Any]) -> Any:
    """The decoded body, to echo ``input``; None when it cannot be had.  Never raises: it
    runs while answering bodies that are malformed, invalid UTF-8 or nested too deeply."""
    # The body was read and decoded (both cached on the connection) before validation failed.
    state = getattr(request, "_connection_state", None)
    decoded = getattr(state, "json", Empty)
    if decoded is not Empty:
        return decoded
    raw = getattr(state, "body", None)
    if not isinstance(raw, bytes | bytearray):
        return None
    try:
        return msgspec.json.decode(raw)
    except (ValueError, RecursionError, msgspec.MsgspecError):
        return None


def _body_type(request: Request[Any, Any, Any]) -> Any:
    """The type the handler declares for its body (``None`` when it takes none)."""
    handler = request.scope.get("route_handler")
    signature = getattr(handler, "parsed_fn_signature", None)
    data = signature.parameters.get("data") if signature is not None else None
    return data.annotation if data is not None else None


def _strings(value: Any) -> list[str]:
    """The strings in ``value`` (itself, or inside a list or an object, keys included)."""
    found, pending = [], [value]
    while pending:
        current = pending.pop()
        if isinstance(current, str):
            found.append(current)
        elif isinstance(current, list):
            pending.extend(current)
        elif isinstance(current, dict):
            pending.extend([*current.keys(), *current.values()])
    return found


def _entry(
    request: Request[Any, Any, Any],
    loc: list[str],
    msg: str,
    kind: str,
    value: Any,
    ctx: dict[str, Any],
) -> ValidationErrorItem:
    """The one way a 422's entry is made.  Where ``loc`` is, or is inside, or holds a
    field marked ``SECRET`` (shared.schemas), the value is not repeated: ``input`` is null
    and a ``msg`` that quotes any of it (a service's message could) says less."""
    if loc[:1] == ["body"] and holds_secret(_body_type(request), loc[1:]):
        refused = _strings(value) + _strings(_lookup(_request_body(request), loc[1:]))
        if any(text and text in msg for text in refused):
            msg = "Invalid value (a secret is not repeated)"
        value = None
    return ValidationErrorItem(loc=loc, msg=msg, type=kind, input=value, ctx=ctx)


def _echo(value: Any) -> Any:
    # A value nested deeper than any field allows is not echoed: encoding it could recurse
    # as deep as the decoder did.
    return value if within_depth(value) else None


def _msgspec_error(exc: BaseException) -> msgspec.ValidationError | None:
    """msgspec's error behind a ValidationException, also through the ExceptionGroup that
    Litestar's concurrent dependency resolution wraps it in."""
    return next((c for c in causes(exc) if isinstance(c, msgspec.ValidationError)), None)


_MISSING_PARAMETER = re.compile(
    r"^Missing required (?P<source>query|header|cookie|path) parameter '(?P<name>[^']+)'"
)


def _items_from_validation(
    request: Request[Any, Any, Any], exc: ValidationException
) -> list[ValidationErrorItem]:
    cause = _msgspec_error(exc)
    extras = exc.extra if isinstance(exc.extra, list) else []
    first = extras[0] if extras and isinstance(extras[0], dict) else {}
    source = str(getattr(first.get("source"), "value", first.get("source") or "body"))
    if cause is not None:
        message, _, at = str(cause).partition(" - at `")
    else:
        message, at = str(first.get("message") or exc.detail), ""
    absent = _MISSING_PARAMETER.match(message)
    if absent is not None:  # Litestar names a missing required parameter only in its text
        source = absent["source"]
        return [
            _entry(
                request,
                [source, absent["name"]],
                f"Missing required {source} parameter",
                "missing",
                None,
                {},
            )
        ]
    tokens = path_tokens(at)
    # msgspec sees the body as the handler's ``data`` argument: "$.data.name" is body.name,
    # and a message about "$" itself (no path) concerns the body as a whole.
    whole_body = source == "body" and not tokens
    if source == "body" and tokens[:1] == ["data"]:
        tokens = tokens[1:]
    if not tokens and first.get("key") and source != "body":
        tokens = [str(first["key"])]
    kind, ctx, field = classify(message)
    if field is not None and not whole_body:
        tokens.append(field)
    if whole_body and kind == "missing":
        message = "Request body is required"
    if cause is not None and isinstance(cause.__cause__, UnstorableJson):
        # A free-form field refused by the Struct after decoding: the error knows where.
        unstorable = cause.__cause__
        message, kind, ctx = unstorable.message, unstorable.type, unstorable.ctx
        tokens.extend(unstorable.path)
        value = unstorable.input
    elif source == "body":
        value = _echo(_lookup(_request_body(request), tokens)) if kind != "missing" else None
    elif source == "query":
        value = request.query_params.get(tokens[0]) if tokens else None
    elif source == "path":
        value = request.path_params.get(tokens[0]) if tokens else None
    else:
        value = None
    return [_entry(request, [source, *tokens], message, kind, value, ctx)]


# --- handlers ------------------------------------------------------------------------------------


def handle_validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response:
    return validation_response(_items_from_validation(request, exc))


def handle_invalid_input(request: Request[Any, Any, Any], exc: InvalidInput) -> Response:
    item = _entry(request, list(exc.loc), exc.detail, exc.type, exc.input, exc.ctx)
    return validation_response([item])


def handle_spar_error(_: Request[Any, Any, Any], exc: SparError) -> Response:
    status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 400)
    headers = {"WWW-Authenticate": "Bearer"} if status == HTTP_401_UNAUTHORIZED else None
    if isinstance(exc, RetryLater):
        headers = {"Retry-After": str(exc.retry_after)}
    return detail_response(status, exc.detail, headers)


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response:
    if exc.status_code == 400 and isinstance(exc.__cause__, SerializationException):
        # The body could not be decoded at all (malformed, truncated, empty).
        item = _entry(request, ["body"], str(exc.detail), "json_invalid", None, {})
        return validation_response([item])
    if exc.status_code >= HTTP_500_INTERNAL_SERVER_ERROR:
        log.error("server error: %s", exc.detail)
        return detail_response(exc.status_code, "internal server error")
    return detail_response(exc.status_code, str(exc.detail), exc.headers)


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response:
    where = f"{request.method} {request.url.path}"
    database = describe_database_error(exc)
    if database_unavailable(exc):
        # An outage, not a fault of this request: one line each, no stack.
        log.warning("database unavailable on %s: %s", where, database or type(exc).__name__)
        unavailable = ServiceUnavailable(
            "the database is unavailable; try again shortly", retry_after=DATABASE_RETRY_AFTER_S
        )
        return handle_spar_error(request, unavailable)
    if database is None:
        log.exception("unhandled error on %s", where, exc_info=exc)
    else:
        # Not the exception's text: PostgreSQL's DETAIL can quote the row the request sent.
        stack = "".join(traceback.format_tb(exc.__traceback__))
        log.error("unhandled database error on %s: %s\n%s", where, database, stack)
    return detail_response(HTTP_500_INTERNAL_SERVER_ERROR, "internal server error")


EXCEPTION_HANDLERS = {
    ValidationException: handle_validation,
    InvalidInput: handle_invalid_input,
    SparError: handle_spar_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}
