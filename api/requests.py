"""The request class of every route: JSON bodies are decoded and checked strictly.

msgspec raises ``DecodeError`` for malformed JSON, which Litestar already answers as a
client error, but two other failures escape it: ``UnicodeDecodeError`` for invalid UTF-8
inside a string, and ``RecursionError`` for nesting deeper than the interpreter's stack.
Both become the same ``SerializationException``, so ``api/exceptions.py`` answers them
like any malformed body: 422 ``json_invalid`` at ``["body"]``.

Litestar then converts the decoded body into the handler's Struct with lax rules
(``strict=False``: ``0`` becomes ``false``, ``"5"`` becomes ``5``), which suits query
strings but would accept JSON bodies that break their published schema.  So the body is
first checked against the handler's ``data`` type strictly, here, once for every route.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import SerializationException, ValidationException

_UNCHECKED = object()


class SparRequest(Request[Any, Any, Any]):
    async def json(self) -> Any:
        try:
            value = await super().json()
        except UnicodeDecodeError as exc:
            raise SerializationException(f"Request body is not valid UTF-8: {exc.reason}") from exc
        except RecursionError as exc:
            raise SerializationException("JSON is nested too deeply") from exc
        body_type = self._body_type()
        if body_type is not None and value is not None:
            try:
                msgspec.convert(value, body_type, strict=True)
            except msgspec.ValidationError as exc:
                error = _as_litestar_error(exc)
                raise error from error.__cause__
        return value

    def _body_type(self) -> Any:
        """The handler's ``data`` type, or None for routes without a typed body."""
        handler = self.route_handler
        cached = handler.opt.get("_spar_body_type", _UNCHECKED)
        if cached is _UNCHECKED:
            field = handler.parsed_fn_signature.parameters.get("data")
            cached = field.annotation if field is not None else None
            handler.opt["_spar_body_type"] = cached
        return cached


def _as_litestar_error(exc: msgspec.ValidationError) -> ValidationException:
    """The error Litestar itself raises for a body, whose msgspec path starts at the
    handler's ``data`` argument (``$.data.name``): ``api/exceptions.py`` reads that shape."""
    message, found, at = str(exc).partition(" - at `$")
    located = msgspec.ValidationError(f"{message} - at `$.data{at if found else '`'}")
    located.__cause__ = exc.__cause__  # what a Struct's own check raised, if anything
    error = ValidationException(detail=message, extra=[{"message": message, "source": "body"}])
    error.__cause__ = located
    return error
