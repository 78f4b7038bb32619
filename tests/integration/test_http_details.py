"""HTTP details: OPTIONS lists every method of a path; unknown query parameters answer 422."""

from __future__ import annotations

import re
import uuid

from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import AsyncTestClient

from tests.support.factories import tenant

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def _concrete(path: str) -> str:
    """A request path for a route template: a UUID for each id, a word for anything else."""
    return _PARAM.sub(
        lambda m: str(uuid.uuid4()) if m.group(1).endswith("id") else "some-key", path
    )


async def test_options_allows_every_method_registered_for_every_path(
    app: Litestar, client: AsyncTestClient
) -> None:
    problems = []
    routes = [route for route in app.routes if isinstance(route, HTTPRoute)]
    assert len(routes) > 30
    for route in routes:
        registered = {m for handler in route.route_handlers for m in handler.http_methods}
        assert "OPTIONS" in registered
        path = _concrete(route.path)
        response = await client.options(path)
        if response.status_code != 204:
            problems.append(f"OPTIONS {path}: {response.status_code}")
            continue
        allow = {m.strip() for m in response.headers.get("allow", "").split(",") if m.strip()}
        if allow != registered:
            problems.append(f"OPTIONS {route.path}: Allow {sorted(allow)} != {sorted(registered)}")
    assert not problems, "\n".join(problems)
    # The paths split over several handlers, spelled out.
    org = str(uuid.uuid4())
    for path, methods in (
        ("/v1/organizations", "GET, OPTIONS, POST"),
        (f"/v1/organizations/{org}", "DELETE, GET, OPTIONS, PATCH"),
        (f"/v1/orgs/{org}/credentials/openai", "DELETE, OPTIONS, PUT"),
        (f"/v1/orgs/{org}/scenarios/{uuid.uuid4()}", "DELETE, GET, OPTIONS, PUT"),
    ):
        assert (await client.options(path)).headers["allow"] == methods


async def test_unknown_query_parameters_answer_422_on_every_kind_of_route(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    org = t.id
    requests = [
        ("GET", "/v1/organizations?bogus=1", None, "bogus", "1"),
        ("GET", f"/v1/orgs/{org}/roles?limit=5&role=admin", None, "role", "admin"),
        ("GET", f"/v1/organizations/{org}?expand=members", None, "expand", "members"),
        ("POST", "/v1/organizations?owner=me", {"name": "Sneaky"}, "owner", "me"),
        ("PATCH", f"/v1/organizations/{org}?force=true", {"name": "Renamed"}, "force", "true"),
        ("GET", f"/v1/orgs/{org}/scenarios?tags=a", None, "tags", "a"),
        ("GET", f"/v1/orgs/{org}/scenarios/runs?state=error", None, "state", "error"),
        ("GET", "/v1/auth/me?x=", None, "x", ""),
        ("GET", "/health/live?verbose=1", None, "verbose", "1"),
    ]
    problems = []
    for method, path, body, name, value in requests:
        response = await client.request(method, path, json=body, headers=t.owner.headers)
        expected = {
            "detail": [
                {
                    "loc": ["query", name],
                    "msg": f"Unknown query parameter `{name}`",
                    "type": "extra_forbidden",
                    "input": value,
                    "ctx": {},
                }
            ]
        }
        if response.status_code != 422 or response.json() != expected:
            problems.append(f"{method} {path}: {response.status_code} {response.text[:300]}")
    assert not problems, "\n".join(problems)
    # Nothing was created or changed by the refused requests.
    orgs = (await client.get("/v1/organizations", headers=t.owner.headers)).json()
    assert [o["name"] for o in orgs["organizations"]] == [t.org["name"]]


async def test_declared_query_parameters_still_work(client: AsyncTestClient) -> None:
    t = await tenant(client)
    org = t.id
    for path in (
        f"/v1/orgs/{org}/roles?limit=2&offset=1",
        f"/v1/orgs/{org}/scenarios?tag=smoke&limit=10",
        f"/v1/orgs/{org}/scenarios/runs?status=pending&agent_id={uuid.uuid4()}",
        f"/v1/orgs/{org}/scenarios/batch-runs?status=queued&offset=0",
        "/v1/organizations?limit=1",
    ):
        response = await client.get(path, headers=t.owner.headers)
        assert response.status_code == 200, f"{path}: {response.text}"
    roles = await client.get(f"/v1/orgs/{org}/roles?limit=2&offset=1", headers=t.owner.headers)
    assert len(roles.json()["roles"]) == 2 and roles.json()["total"] == 5
    # A declared parameter's own validation is unchanged.
    response = await client.get(f"/v1/orgs/{org}/roles?limit=0", headers=t.owner.headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "limit"]


async def test_authentication_comes_before_the_unknown_query_check(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    response = await client.get(f"/v1/orgs/{t.id}/roles?bogus=1")
    assert response.status_code == 401
    outsider = await tenant(client)
    response = await client.get(f"/v1/orgs/{t.id}/roles?bogus=1", headers=outsider.owner.headers)
    assert response.status_code == 404
