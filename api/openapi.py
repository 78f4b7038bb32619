"""OpenAPI touch-ups: document the error answers Spar really gives.

Litestar documents a 400 for validation failures; Spar answers 422 with the spec's body
(see ``api/exceptions.py``), plus ``{"detail": "…"}`` for 401/403/404/409.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    Schema,
)

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
}


def _json(schema: Schema | Reference) -> dict[str, OpenAPIMediaType]:
    return {"application/json": OpenAPIMediaType(schema=schema)}


def document_validation_errors(app: Litestar) -> None:
    schema = app.openapi_schema
    schema.components.schemas["ValidationError"] = VALIDATION_ERROR
    schema.components.schemas["Error"] = ERROR
    validation = OpenAPIResponse(
        description="Validation failed",
        content=_json(Reference("#/components/schemas/ValidationError")),
    )
    for path, item in (schema.paths or {}).items():
        for method in ("get", "post", "put", "patch", "delete"):
            operation: Operation | None = getattr(item, method)
            if operation is None:
                continue
            responses = operation.responses or {}
            responses.pop("400", None)
            if operation.parameters or operation.request_body:
                responses["422"] = validation
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
