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


async def test_swagger_ui_is_served_from_spar_itself(client):
    """The docs work offline: every script, stylesheet and icon comes from Spar."""
    import re

    response = await client.get("/schema")
    assert response.status_code == 200
    assert "swagger" in response.text.lower()
    urls = re.findall(r"""<(?:script|link)\b[^>]*?\b(?:src|href)=["']([^"']+)["']""", response.text)
    assert len(urls) >= 4, urls  # the bundle, the preset, the stylesheet, the icon
    expected = {".js": "javascript", ".css": "text/css", ".png": "image/png"}
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"{url} is not Spar's"
        asset = await client.get(url)
        assert asset.status_code == 200, url
        kind = expected[url[url.rindex(".") :]]
        assert kind in asset.headers["content-type"], (url, asset.headers["content-type"])
        assert len(asset.content) > 100, url
    assert "://" not in "".join(urls)


async def test_every_operation_has_a_summary_and_a_description(client):
    schema = (await client.get("/schema/openapi.json")).json()
    missing = []
    for path, item in schema["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            summary, description = operation.get("summary"), operation.get("description")
            if not summary or not description or summary == description:
                missing.append(f"{method} {path}: {summary!r} / {description!r}")
    assert not missing, "\n".join(missing)
    listing = schema["paths"]["/v1/orgs/{org_id}/llm-providers"]["get"]
    assert listing["summary"] == "List LLM providers"


async def test_public_operations_require_no_token(client):
    """The bearer requirement is global; operations anyone may call override it with []."""
    schema = (await client.get("/schema/openapi.json")).json()
    assert schema["security"] == [{"bearer": []}]
    public = {
        f"{method} {path}"
        for path, item in schema["paths"].items()
        for method in METHODS
        if method in item and item[method].get("security") == []
    }
    anyone = {"get /health/live", "get /health/ready", "post /v1/auth/register"}
    assert anyone | {"post /v1/auth/login"} <= public
    assert "get /v1/auth/me" not in public and "post /v1/organizations" not in public
    for operation in anyone:
        method, path = operation.split(" ")
        response = await client.request(method.upper(), path, json={})
        assert response.status_code != 401, operation


async def test_input_structs_forbid_additional_properties(client):
    """additionalProperties: false exactly where the Struct sets forbid_unknown_fields."""
    import msgspec.inspect as mi
    from litestar.routes import HTTPRoute

    schema = (await client.get("/schema/openapi.json")).json()
    components = schema["components"]["schemas"]
    app = client.app
    checked = 0
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            data = handler.parsed_data_field
            if data is None:
                continue
            info = mi.type_info(data.annotation)
            if isinstance(info, mi.UnionType):  # an optional body (a trigger's manual fire)
                (info,) = [t for t in info.types if not isinstance(t, mi.NoneType)]
            assert isinstance(info, mi.StructType)
            component = components[info.cls.__name__]
            forbids = info.cls.__struct_config__.forbid_unknown_fields
            assert component.get("additionalProperties") is (False if forbids else None)
            assert forbids, f"{info.cls.__name__} accepts unknown fields"
            checked += 1
    assert checked >= 20
    # Nested input Structs too (a scenario's turns), and no output Struct.
    assert components["ScenarioTurnCreate"]["additionalProperties"] is False
    assert "additionalProperties" not in components["OrganizationRead"]


async def test_paging_statuses_and_media_types_are_documented(client):
    schema = (await client.get("/schema/openapi.json")).json()
    paths = schema["paths"]
    params = {p["name"]: p["schema"] for p in paths["/v1/organizations"]["get"]["parameters"]}
    assert (params["limit"]["minimum"], params["limit"]["maximum"]) == (1, 500)
    assert params["offset"]["minimum"] == 0
    # The documented maximum offset is exact as a JSON number, and accepted.
    maximum = params["offset"]["maximum"]
    assert maximum == int(maximum) and float(int(maximum)) == maximum
    put = paths["/v1/orgs/{org_id}/credentials/{key}"]["put"]["responses"]
    for code in ("200", "201"):
        ref = put[code]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/CredentialRead"
    events = paths["/v1/orgs/{org_id}/scenarios/batch-runs/{batch_run_id}/events"]["get"]
    assert list(events["responses"]["200"]["content"]) == ["text/event-stream"]
    ready = paths["/health/ready"]["get"]["responses"]
    assert "503" in ready
    assert "413" in paths["/v1/organizations"]["post"]["responses"]
    assert "413" not in paths["/v1/organizations"]["get"]["responses"]
    # An unknown query parameter answers 422 anywhere: every operation documents it; and
    # any of them may meet a database out of connections (503).
    for path, item in paths.items():
        for method in METHODS:
            if method in item:
                assert "422" in item[method]["responses"], f"{method} {path}"
                if path.startswith("/v1/"):
                    assert "503" in item[method]["responses"], f"{method} {path}"


async def test_the_documented_maximum_offset_is_accepted(client):
    from tests.support.factories import tenant

    t = await tenant(client)
    schema = (await client.get("/schema/openapi.json")).json()
    params = schema["paths"]["/v1/organizations"]["get"]["parameters"]
    maximum = int(next(p for p in params if p["name"] == "offset")["schema"]["maximum"])
    response = await client.get(f"/v1/orgs/{t.id}/roles?offset={maximum}", headers=t.owner.headers)
    assert response.status_code == 200 and response.json()["roles"] == []
    response = await client.get(
        f"/v1/orgs/{t.id}/roles?offset={maximum + 1}", headers=t.owner.headers
    )
    assert response.status_code == 422


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
