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

One lax case is the published schema's own: a JSON Schema ``integer`` is any number with
no fraction, so ``13.0`` is one.  Where the body's type wants an ``int``, such a float is
taken as that int before the strict check (and no other float, nor a string).
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
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
            value = integral_floats_as_ints(value, self._body_info(body_type))
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

    def _body_info(self, body_type: Any) -> mi.Type:
        handler = self.route_handler
        info = handler.opt.get("_spar_body_info")
        if info is None:
            info = handler.opt["_spar_body_info"] = mi.type_info(body_type)
        return info


_INT64 = 2**63


def integral_floats_as_ints(value: Any, kind: mi.Type) -> Any:
    """``value`` (decoded JSON) with every float that has no fraction, where ``kind`` wants
    an ``int``, made that int (in place in objects and arrays)."""
    if isinstance(kind, mi.Metadata):
        return integral_floats_as_ints(value, kind.type)
    if isinstance(kind, mi.IntType):
        if isinstance(value, float) and value.is_integer() and -_INT64 <= value < _INT64:
            return int(value)
        return value
    if isinstance(kind, mi.UnionType):
        if isinstance(value, float) and any(isinstance(t, mi.FloatType) for t in kind.types):
            return value  # a float is welcome as it is
        for member in kind.types:
            if not isinstance(member, mi.NoneType):
                value = integral_floats_as_ints(value, member)
        return value
    if isinstance(value, dict):
        if isinstance(kind, mi.StructType):
            fields = {field.encode_name: field.type for field in kind.fields}
            for key, item in value.items():
                if key in fields:
                    value[key] = integral_floats_as_ints(item, fields[key])
        elif isinstance(kind, mi.DictType):
            for key, item in value.items():
                value[key] = integral_floats_as_ints(item, kind.value_type)
    elif isinstance(value, list):
        if isinstance(kind, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
            for index, item in enumerate(value):
                value[index] = integral_floats_as_ints(item, kind.item_type)
        elif isinstance(kind, mi.TupleType):
            for index, (item, item_kind) in enumerate(zip(value, kind.item_types, strict=False)):
                value[index] = integral_floats_as_ints(item, item_kind)
    return value


def _as_litestar_error(exc: msgspec.ValidationError) -> ValidationException:
    """The error Litestar itself raises for a body, whose msgspec path starts at the
    handler's ``data`` argument (``$.data.name``): ``api/exceptions.py`` reads that shape."""
    message, found, at = str(exc).partition(" - at `$")
    located = msgspec.ValidationError(f"{message} - at `$.data{at if found else '`'}")
    located.__cause__ = exc.__cause__  # what a Struct's own check raised, if anything
    error = ValidationException(detail=message, extra=[{"message": message, "source": "body"}])
    error.__cause__ = located
    return error
