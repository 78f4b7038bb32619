"""The published contract: OpenAPI at /schema documents what the API really answers."""

from api.app import V1_CONTROLLERS, create_app

METHODS = ("get", "post", "put", "patch", "delete")


async def test_openapi_names_every_operation_and_documents_422_not_400(client):
    response = await client.get("/schema/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.1")
    operation_ids = []
    for path, item in schema["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            assert operation.get("operationId"), f"{method} {path} has no operationId"
            operation_ids.append(operation["operationId"])
            responses = operation["responses"]
            assert "400" not in responses, f"{method} {path} documents 400"
            if operation.get("parameters") or operation.get("requestBody"):
                ref = responses["422"]["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ValidationError"
            if path.startswith("/v1/"):
                assert {"401", "403", "404"} <= set(responses), f"{method} {path}"
    assert len(operation_ids) == len(set(operation_ids)), "operationIds must be unique"
    # The spec's endpoints of identity are there under their spec paths.
    for path in (
        "/v1/auth/me",
        "/v1/organizations/{org_id}/members",
        "/v1/organizations/{org_id}/members/{user_id}",
        "/v1/orgs/{org_id}/platform-tokens",
        "/v1/orgs/{org_id}/roles/{role_id}",
    ):
        assert path in schema["paths"]
    item = schema["components"]["schemas"]["ValidationError"]["properties"]["detail"]["items"]
    assert set(item["required"]) == {"loc", "msg", "type", "input", "ctx"}


async def test_swagger_ui_is_served(client):
    response = await client.get("/schema")
    assert response.status_code == 200
    assert "swagger" in response.text.lower()


async def test_liveness_and_readiness(client):
    live = await client.get("/health/live")
    assert live.status_code == 200 and live.json()["status"] == "ok"
    ready = await client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}


async def test_readiness_fails_when_the_database_is_unreachable(settings):
    import msgspec
    from litestar.testing import AsyncTestClient

    unreachable = msgspec.structs.replace(
        settings,
        database_url="postgresql+psycopg://postgres@127.0.0.1:1/nowhere",
        redis_url="redis://127.0.0.1:1/0",
    )
    async with AsyncTestClient(app=create_app(unreachable)) as other:
        ready = await other.get("/health/ready")
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"].startswith("error")
        assert ready.json()["checks"]["broker"].startswith("error")
        assert (await other.get("/health/live")).status_code == 200


def test_the_app_refuses_a_route_without_an_access_rule(settings):
    import pytest
    from litestar import Controller, get

    class Careless(Controller):
        path = "/careless"

        @get("/", operation_id="careless")
        async def careless(self) -> None:
            return None

    V1_CONTROLLERS.append(Careless)
    try:
        with pytest.raises(RuntimeError, match="without an access rule"):
            create_app(settings)
    finally:
        V1_CONTROLLERS.remove(Careless)
