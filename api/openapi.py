"""The published contract: OpenAPI config, offline docs, and touch-ups to what Litestar infers.

``openapi_config`` serves Swagger UI at ``/schema`` from the assets of the
``swagger-ui-bundle-v2`` package (``docs_assets``), so the docs work without a CDN.

``finish_openapi`` runs once on the built app, so the document says what Spar answers:

1. Errors: no 400 (validation answers 422 with the spec's body, see ``api/exceptions.py``;
   every operation can answer it, an unknown query parameter included), 413 where a body
   is taken, and ``{"detail": "…"}`` for 401/403/404/409/503 under /v1.
2. Every operation has a summary (from its ``operationId`` unless the handler sets one)
   and a description (the handler's docstring); public operations require no token.
3. A body Struct declared with ``forbid_unknown_fields=True`` is documented with
   ``additionalProperties: false``: the Struct's own config decides, for every Struct a
   handler takes as ``data`` and every Struct nested in one.
4. A body's ``dict[str, str]`` with bounded keys or values (``HeaderMap``) documents the
   bounds (``propertyNames``, ``additionalProperties``), which Litestar leaves out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import msgspec
import msgspec.inspect as mi
from litestar import Litestar, Router
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    Schema,
    SecurityScheme,
)
from litestar.routes import HTTPRoute
from litestar.static_files import create_static_files_router
from swagger_ui_bundle import swagger_ui_path

from api.auth import ACCESS_KEY

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


def document_errors(app: Litestar) -> None:
    schema = app.openapi_schema
    schema.components.schemas["ValidationError"] = VALIDATION_ERROR
    schema.components.schemas["Error"] = ERROR
    validation = OpenAPIResponse(
        description="Validation failed (a body field, a path or query parameter, or an "
        "unknown query parameter).",
        content=_json(Reference("#/components/schemas/ValidationError")),
    )
    too_large = OpenAPIResponse(
        description="The request body is larger than Spar accepts.",
        content=_json(Reference("#/components/schemas/Error")),
    )
    for path, operation in _operations(app):
        responses = operation.responses or {}
        responses.pop("400", None)
        responses["422"] = validation
        if operation.request_body is not None:
            responses["413"] = too_large
        if path.startswith("/v1/"):
            for code, description in _ERRORS.items():
                responses.setdefault(
                    code,
                    OpenAPIResponse(
                        description=description,
                        content=_json(Reference("#/components/schemas/Error")),
                    ),
                )
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


def _body_structs(app: Litestar) -> list[type[msgspec.Struct]]:
    seen: set[type] = set()
    found: list[type[msgspec.Struct]] = []
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            data = handler.parsed_data_field
            if data is not None:
                found.extend(_structs(mi.type_info(data.annotation), seen))
    return found


def _component_names(cls: type) -> tuple[str, ...]:
    # Litestar names a component after the class, or its dotted path when names clash.
    return (cls.__name__, f"{cls.__module__}.{cls.__qualname__}".replace(".", "_"))


def forbid_unknown_fields(app: Litestar) -> None:
    """``additionalProperties: false`` on the schema of every Struct that forbids them."""
    components = app.openapi_schema.components.schemas
    for cls in _body_structs(app):
        if not cls.__struct_config__.forbid_unknown_fields:
            continue
        for name in _component_names(cls):
            schema = components.get(name)
            if isinstance(schema, Schema):
                schema.additional_properties = False


def _string_schema(kind: mi.Type) -> Schema | None:
    """The length bounds of a constrained ``str``, or None for anything else."""
    if not isinstance(kind, mi.StrType) or (kind.min_length is None and kind.max_length is None):
        return None
    return Schema(type=OpenAPIType.STRING, min_length=kind.min_length, max_length=kind.max_length)


def _dict_type(kind: mi.Type) -> mi.DictType | None:
    if isinstance(kind, mi.DictType):
        return kind
    if isinstance(kind, mi.UnionType):
        return next((item for item in kind.types if isinstance(item, mi.DictType)), None)
    return None


def _object_schemas(schema: Schema | Reference | None) -> Iterator[Schema]:
    if not isinstance(schema, Schema):
        return
    if schema.type == OpenAPIType.OBJECT:
        yield schema
    for member in (*(schema.one_of or ()), *(schema.any_of or ())):
        yield from _object_schemas(member)


def document_map_bounds(app: Litestar) -> None:
    """The key and value bounds of a body's ``dict[str, str]`` fields (``HeaderMap``), which
    Litestar leaves out: ``propertyNames`` and ``additionalProperties`` carry them."""
    components = app.openapi_schema.components.schemas
    for cls in _body_structs(app):
        fields = mi.type_info(cls).fields  # type: ignore[attr-defined]
        for field in fields:
            kind = _dict_type(field.type)
            if kind is None:
                continue
            keys, values = _string_schema(kind.key_type), _string_schema(kind.value_type)
            if keys is None and values is None:
                continue
            for name in _component_names(cls):
                schema = components.get(name)
                if not isinstance(schema, Schema) or not schema.properties:
                    continue
                for target in _object_schemas(schema.properties.get(field.encode_name)):
                    if keys is not None:
                        target.property_names = keys
                    if values is not None:
                        target.additional_properties = values


def finish_openapi(app: Litestar) -> None:
    document_errors(app)
    document_operations(app)
    forbid_unknown_fields(app)
    document_map_bounds(app)
