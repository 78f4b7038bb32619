"""The published contract: OpenAPI config, offline docs, and touch-ups to what Litestar infers.

``openapi_config`` serves Swagger UI at ``/schema`` from the assets of the
``swagger-ui-bundle-v2`` package (``docs_assets``), so the docs work without a CDN.

``finish_openapi`` runs once on the built app, so the document says what Spar answers:

1. Errors: no 400 (validation answers 422 with the spec's body, see ``api/exceptions.py``;
   every operation can answer it, an unknown query parameter included), 413 where a body
   is taken, and ``{"detail": "…"}`` for 401/403/404/409/503 under /v1.
2. Every operation has a summary (from its ``operationId`` unless the handler sets one)
   and a description (the handler's docstring); public operations require no token.
3. A Struct declared with ``forbid_unknown_fields=True`` is documented with
   ``additionalProperties: false``: the Struct's own config decides, for every Struct a
   handler takes as ``data`` or answers with, and every Struct nested in one.
4. A body's ``dict[str, str]`` with bounded keys or values (``HeaderMap``) documents the
   bounds (``propertyNames``, ``additionalProperties``), which Litestar leaves out; so does
   a body's list of bounded strings (a scenario's ``tags``) for its items.
5. Every error answer is JSON: a status declared without a body (a handler's
   ``ResponseSpec(None, …)``) gets the ``Error`` body.  Every answer carries
   ``X-Request-ID``; 429 and the database's 503 carry ``Retry-After``.
6. A body a handler takes as optional (``data: X | None = None``) is not required, and is
   an ``X`` when sent.
7. One way to say null: Litestar writes ``Literal[...] | None`` as ``type: [null, string]``
   with ``None`` in the enum, where it writes every other optional as ``oneOf [...,
   {type: null}]``; the lists become ``oneOf`` too (openapi-core crashed on them,
   openapi-python-client made three classes of one field).
8. Patterns as :func:`shared.schemas.documented_pattern` states them (no lone surrogates:
   no regex engine of a generated client compiles them, and no request can carry one).

A handler that reads its body itself (a webhook's signed bytes) states it, and the headers
it checks, with :func:`operation_reading`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from types import UnionType
from typing import Any, Union, get_args, get_origin

import msgspec
import msgspec.inspect as mi
from litestar import Litestar, Response, Router
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.routes import HTTPRoute
from litestar.static_files import create_static_files_router
from swagger_ui_bundle import swagger_ui_path

from api.auth import ACCESS_KEY
from shared.logs import REQUEST_ID_PATTERN
from shared.schemas import documented_pattern

SCHEMA_PATH = "/schema"
ASSETS_PATH = f"{SCHEMA_PATH}/assets"


_VALIDATION_ITEM = Schema(
    type=OpenAPIType.OBJECT,
    required=["loc", "msg", "type", "input", "ctx"],
    properties={
        "loc": Schema(type=OpenAPIType.ARRAY, items=Schema(type=OpenAPIType.STRING)),
        "msg": Schema(type=OpenAPIType.STRING),
        "type": Schema(type=OpenAPIType.STRING),
        "input": Schema(),
        "ctx": Schema(type=OpenAPIType.OBJECT),
    },
)
VALIDATION_ERROR = Schema(
    title="ValidationError",
    type=OpenAPIType.OBJECT,
    required=["detail"],
    properties={"detail": Schema(type=OpenAPIType.ARRAY, items=_VALIDATION_ITEM)},
)
ERROR = Schema(
    title="Error",
    type=OpenAPIType.OBJECT,
    required=["detail"],
    properties={"detail": Schema(type=OpenAPIType.STRING)},
)

_ERRORS = {
    "401": "Missing, malformed, unknown, expired or revoked token.",
    "403": "Authenticated, but not allowed.",
    "404": "Not found, or not visible to the caller (another organization's ids).",
    "409": "Conflicts with the current state.",
    "503": "The database is out of reach or out of connections: send the request again "
    "after `Retry-After` seconds.",
}
_METHODS = ("get", "post", "put", "patch", "delete")

REQUEST_ID = "X-Request-ID"
RETRY_AFTER = "Retry-After"
_HEADERS: dict[str, OpenAPIHeader | Reference] = {
    REQUEST_ID: OpenAPIHeader(
        schema=Schema(type=OpenAPIType.STRING, pattern=f"^{REQUEST_ID_PATTERN}$"),
        required=True,
        description="The request's id, on every log line written for it: the request's own "
        "`X-Request-ID` when it is 1-128 characters of `A-Z a-z 0-9 . _ : -`, else a new one.",
    ),
    RETRY_AFTER: OpenAPIHeader(
        schema=Schema(type=OpenAPIType.INTEGER, minimum=0),
        required=True,
        description="Seconds to wait before sending the request again.",
    ),
}


def docs_assets() -> Router:
    """Swagger UI's files, served by Spar itself (public, outside the schema and /v1)."""
    return create_static_files_router(
        path=ASSETS_PATH, directories=[swagger_ui_path], name="docs-assets"
    )


def openapi_config() -> OpenAPIConfig:
    swagger = SwaggerRenderPlugin(
        path="/",
        js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        css_url=f"{ASSETS_PATH}/swagger-ui.css",
        standalone_preset_js_url=f"{ASSETS_PATH}/swagger-ui-standalone-preset.js",
        favicon=f"<link rel='icon' type='image/png' href='{ASSETS_PATH}/favicon-32x32.png'>",
    )
    return OpenAPIConfig(
        title="Spar",
        version="1.0.0",
        description="Test conversational AI agents before and after they ship.",
        path=SCHEMA_PATH,
        use_handler_docstrings=True,
        render_plugins=[swagger],
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(
                    type="http",
                    scheme="bearer",
                    description="`ust_…` user or `pat_…` platform token",
                )
            }
        ),
        security=[{"bearer": []}],
    )


def _json(schema: Schema | Reference) -> dict[str, OpenAPIMediaType]:
    return {"application/json": OpenAPIMediaType(schema=schema)}


def _operations(app: Litestar) -> Iterator[tuple[str, Operation]]:
    for path, item in (app.openapi_schema.paths or {}).items():
        for method in _METHODS:
            operation: Operation | None = getattr(item, method)
            if operation is not None:
                yield path, operation


def _header(name: str) -> Reference:
    return Reference(f"#/components/headers/{name}")


def document_errors(app: Litestar) -> None:
    schema = app.openapi_schema
    schema.components.schemas["ValidationError"] = VALIDATION_ERROR
    schema.components.schemas["Error"] = ERROR
    schema.components.headers = {**(schema.components.headers or {}), **_HEADERS}
    error = _json(Reference("#/components/schemas/Error"))
    validation = OpenAPIResponse(
        description="Validation failed (a body field, a path or query parameter, or an "
        "unknown query parameter).",
        content=_json(Reference("#/components/schemas/ValidationError")),
    )
    too_large = OpenAPIResponse(
        description="The request body is larger than Spar accepts.", content=error
    )
    for path, operation in _operations(app):
        responses = operation.responses or {}
        responses.pop("400", None)
        responses["422"] = validation
        if operation.request_body is not None:
            responses.setdefault("413", too_large)
        if path.startswith("/v1/"):
            for code, description in _ERRORS.items():
                responses.setdefault(code, OpenAPIResponse(description=description, content=error))
        for code, response in list(responses.items()):
            if not isinstance(response, OpenAPIResponse):
                continue
            if int(code) >= 400 and not response.content:  # every error answer is JSON
                response = dataclasses.replace(response, content=error)
            headers = {**(response.headers or {}), REQUEST_ID: _header(REQUEST_ID)}
            # The login throttle's 429 and the database's 503 (/health/ready's 503 is the
            # probe's own answer, without one).
            if code == "429" or (code == "503" and path.startswith("/v1/")):
                headers[RETRY_AFTER] = _header(RETRY_AFTER)
            responses[code] = dataclasses.replace(response, headers=headers)
        operation.responses = responses


def summary_from_operation_id(operation_id: str) -> str:
    """``listLLMProviders`` -> ``List LLM providers``."""
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", operation_id)
    text = " ".join(word if word.isupper() and len(word) > 1 else word.lower() for word in words)
    return text[:1].upper() + text[1:]


def _is_public(path: str, handler: HTTPRouteHandler) -> bool:
    rule = handler.opt.get(ACCESS_KEY)
    return not path.startswith("/v1/") or (rule is not None and rule.public)


def document_operations(app: Litestar) -> None:
    """Summaries from operation ids unless set by hand; descriptions from docstrings; no
    security requirement on public operations (health, register, login, webhooks)."""
    handlers = {
        handler.operation_id: handler
        for route in app.routes
        if isinstance(route, HTTPRoute)
        for handler in route.route_handlers
        if isinstance(handler.operation_id, str)
    }
    for path, operation in _operations(app):
        handler = handlers.get(operation.operation_id or "")
        if handler is None:
            continue
        operation.summary = handler.summary or summary_from_operation_id(handler.operation_id)
        if _is_public(path, handler):
            operation.security = []


def _structs(kind: mi.Type, seen: set[type]) -> Iterator[type[msgspec.Struct]]:
    """Every Struct class in a msgspec type, nested ones included."""
    if isinstance(kind, mi.StructType):
        if kind.cls in seen:
            return
        seen.add(kind.cls)
        yield kind.cls
        for field in kind.fields:
            yield from _structs(field.type, seen)
        return
    # Containers and unions: the inspect types are Structs too, their fields lead inward.
    for name in type(kind).__struct_fields__:
        value = getattr(kind, name)
        for inner in value if isinstance(value, tuple) else (value,):
            if isinstance(inner, mi.Type):
                yield from _structs(inner, seen)


def _handlers(app: Litestar) -> Iterator[HTTPRouteHandler]:
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            yield from route.route_handlers


def _body_structs(app: Litestar) -> list[type[msgspec.Struct]]:
    seen: set[type] = set()
    found: list[type[msgspec.Struct]] = []
    for handler in _handlers(app):
        data = handler.parsed_data_field
        if data is not None:
            found.extend(_structs(mi.type_info(data.annotation), seen))
    return found


def _answer_structs(app: Litestar) -> list[type[msgspec.Struct]]:
    """The Structs a handler answers with: its return type (inside ``Response[...]``)
    and its declared ``responses``."""
    seen: set[type] = set()
    found: list[type[msgspec.Struct]] = []
    for handler in _handlers(app):
        returned = handler.parsed_fn_signature.return_type
        if returned.is_subclass_of(Response):
            returned = returned.inner_types[0] if returned.inner_types else returned
        kinds = [returned.annotation]
        kinds += [spec.data_container for spec in (handler.responses or {}).values()]
        for kind in kinds:
            # One at a time: msgspec inspects no union of untagged Structs.
            members = get_args(kind) if get_origin(kind) in (Union, UnionType) else (kind,)
            for member in members:
                if member is not None and member is not Response:
                    found.extend(_structs(mi.type_info(member), seen))
    return found


def _component_names(cls: type) -> tuple[str, ...]:
    # Litestar names a component after the class, or its dotted path when names clash.
    return (cls.__name__, f"{cls.__module__}.{cls.__qualname__}".replace(".", "_"))


def _components_of(app: Litestar, cls: type) -> Iterator[Schema]:
    components = app.openapi_schema.components.schemas
    for name in _component_names(cls):
        schema = components.get(name)
        if isinstance(schema, Schema):
            yield schema


def forbid_unknown_fields(app: Litestar) -> None:
    """``additionalProperties: false`` on the schema of every Struct that forbids them: a
    body's, and an answer's that holds nothing else (``CalibrationPending``: no finished
    calibration matches it as well)."""
    for cls in {*_body_structs(app), *_answer_structs(app)}:
        if cls.__struct_config__.forbid_unknown_fields:
            for schema in _components_of(app, cls):
                schema.additional_properties = False


def _string_schema(kind: mi.Type) -> Schema | None:
    """The bounds of a constrained ``str`` (its length, its pattern), or None for anything
    else."""
    if not isinstance(kind, mi.StrType):
        return None
    if kind.min_length is None and kind.max_length is None and kind.pattern is None:
        return None
    return Schema(
        type=OpenAPIType.STRING,
        min_length=kind.min_length,
        max_length=kind.max_length,
        pattern=kind.pattern,
    )


def _member(kind: mi.Type, wanted: type[mi.Type]) -> Any:
    """``kind`` if it is a ``wanted`` type, or the union member that is."""
    if isinstance(kind, wanted):
        return kind
    if isinstance(kind, mi.UnionType):
        return next((item for item in kind.types if isinstance(item, wanted)), None)
    return None


def _typed(schema: Schema | Reference | None, kind: OpenAPIType) -> Iterator[Schema]:
    """``schema`` or its ``oneOf``/``anyOf`` members of type ``kind``."""
    if not isinstance(schema, Schema):
        return
    if schema.type == kind:
        yield schema
    for member in (*(schema.one_of or ()), *(schema.any_of or ())):
        yield from _typed(member, kind)


def document_item_bounds(app: Litestar) -> None:
    """What Litestar leaves out of a body's containers of bounded strings: the key and
    value bounds of a ``dict[str, str]`` field (``HeaderMap``: ``propertyNames`` and
    ``additionalProperties``), the item bounds of a ``list[str]`` field (``tags``:
    ``items``)."""
    for cls in _body_structs(app):
        for field in mi.type_info(cls).fields:  # type: ignore[attr-defined]
            mapping = _member(field.type, mi.DictType)
            listing = _member(field.type, mi.ListType)
            keys = _string_schema(mapping.key_type) if mapping else None
            values = _string_schema(mapping.value_type) if mapping else None
            items = _string_schema(listing.item_type) if listing else None
            for schema in _components_of(app, cls):
                declared = (schema.properties or {}).get(field.encode_name)
                for target in _typed(declared, OpenAPIType.OBJECT):
                    if keys is not None:
                        target.property_names = keys
                    if values is not None:
                        target.additional_properties = values
                for target in _typed(declared, OpenAPIType.ARRAY):
                    if items is not None:
                        target.items = items


def document_optional_bodies(app: Litestar) -> None:
    """A body the handler takes as optional (``data: X | None = None``) is not required,
    and is an ``X`` when sent: a client leaves it out by sending none.  (Litestar says a
    required ``oneOf [X, null]``: generated clients then demand one, or send ``Unset``.)"""
    optional = {
        handler.operation_id
        for handler in _handlers(app)
        if handler.parsed_data_field is not None and handler.parsed_data_field.is_optional
    }
    for _, operation in _operations(app):
        body = operation.request_body
        if operation.operation_id not in optional or not isinstance(body, RequestBody):
            continue
        body.required = False
        for media in body.content.values():
            if isinstance(media.schema, Schema) and media.schema.one_of:
                kept = [m for m in media.schema.one_of if not _is_null(m)]
                if len(kept) == 1:
                    media.schema = kept[0]


def _is_null(schema: Schema | Reference) -> bool:
    return isinstance(schema, Schema) and schema.type == OpenAPIType.NULL


def _schemas(node: Any) -> Iterator[Schema]:
    """Every Schema object in or under ``node`` (a spec object, a list, a dict)."""
    if isinstance(node, Schema):
        yield node
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for field in dataclasses.fields(node):
            yield from _schemas(getattr(node, field.name))
    elif isinstance(node, dict):
        for value in node.values():
            yield from _schemas(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _schemas(value)


def _null_as_one_of(schema: Schema) -> None:
    """``type: [null, string], enum: [a, b, null]`` -> ``oneOf [{type: string, enum: [a,
    b]}, {type: null}]`` (the rest of the schema, a description, a default, stays)."""
    kinds = [kind for kind in schema.type if kind != OpenAPIType.NULL]  # type: ignore[union-attr]
    values = [value for value in schema.enum or () if value is not None] or None
    members: list[Schema | Reference] = [Schema(type=kind, enum=values) for kind in kinds]
    if len(kinds) < len(schema.type):  # type: ignore[arg-type]
        members.append(Schema(type=OpenAPIType.NULL))
    schema.type, schema.enum, schema.one_of = None, None, members


def document_schemas(app: Litestar) -> None:
    """One nullable style (``oneOf`` with null, never a list of types) and patterns every
    regex engine takes (:func:`shared.schemas.documented_pattern`), in every schema of the
    document."""
    for schema in _schemas(app.openapi_schema):
        if isinstance(schema.type, list | tuple):
            _null_as_one_of(schema)
        if schema.pattern is not None:
            schema.pattern = documented_pattern(schema.pattern)


def operation_reading(body: RequestBody, *headers: Parameter) -> type[Operation]:
    """The ``operation_class`` of a handler that reads its body itself (``request.body()``)
    and checks headers Litestar does not see in its signature: the document states them,
    while the handler keeps its own answers (a missing signature is its 401, not a 422)."""

    @dataclasses.dataclass
    class Reading(Operation):
        def __post_init__(self) -> None:
            self.request_body = body
            self.parameters = [*(self.parameters or ()), *headers]

    return Reading


def finish_openapi(app: Litestar) -> None:
    document_errors(app)
    document_operations(app)
    forbid_unknown_fields(app)
    document_item_bounds(app)
    document_optional_bodies(app)
    document_schemas(app)
