"""Bodies PostgreSQL, UTF-8 or the decoder cannot take answer 4xx in the spec's shape, never 500.

Three kinds of input used to fail deep inside the stack (issue 11): NUL or lone surrogates
inside free-form objects (``customer_context``, allowed-domain ``headers`` and
``query_params``) reached PostgreSQL; JSON nested a thousand levels deep exhausted the
decoder's stack; invalid UTF-8 inside a string escaped the decoder as ``UnicodeDecodeError``.
Each answers 422 ``{"detail": [{loc, msg, type, input, ctx}]}`` and stores nothing.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from litestar.testing import AsyncTestClient

from shared.scenarios.schemas import ScenarioCreate
from shared.schemas import MAX_JSON_DEPTH, TEXT_PATTERN, UnstorableJson
from tests.support.factories import (
    PASSWORD,
    Tenant,
    register,
    single_validation_entry,
    tenant,
    unique_email,
)

JSON = {"Content-Type": "application/json"}
SCENARIO = {"name": "Refund", "turns": [{"user_message": "I want my money back"}]}
UNSTORABLE = {"type": "string_pattern_mismatch", "ctx": {"pattern": TEXT_PATTERN}}


def assert_json_invalid(response: Any, words: str) -> None:
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body"], entry
    assert entry["type"] == "json_invalid", entry
    assert words in entry["msg"], entry


def nested(levels: int, leaf: Any = 1) -> Any:
    """``levels`` objects in one another: {"a": {"a": ... leaf}}."""
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def deep_json(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def scenarios_path(t: Tenant) -> str:
    return f"/v1/orgs/{t.id}/scenarios"


def domains_path(t: Tenant) -> str:
    return f"/v1/orgs/{t.id}/allowed-domains"


async def listing(client: AsyncTestClient, t: Tenant, path: str) -> Any:
    response = await client.get(path, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    return response.json()


async def create_scenario(client: AsyncTestClient, t: Tenant, **fields: Any) -> dict[str, Any]:
    body = {**SCENARIO, **fields}
    response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    return response.json()


async def assert_no_account(client: AsyncTestClient, email: str) -> None:
    """Nothing was stored under ``email``: registering it now succeeds (409 otherwise)."""
    await register(client, email)


# --- NUL and lone surrogates in free-form objects -----------------------------------------------

NUL_CONTEXTS = [
    pytest.param({"booking": {"notes": ["ok", "x\x00y"]}}, ["booking", "notes", "1"], "x\x00y",
                 id="value"),
    pytest.param({"booking": {"se\x00ts": 2}}, ["booking", "se\x00ts"], "se\x00ts", id="key"),
]  # fmt: skip


@pytest.mark.parametrize(("context", "loc", "bad"), NUL_CONTEXTS)
async def test_nul_inside_customer_context_is_refused_on_create(
    client: AsyncTestClient, context: dict[str, Any], loc: list[str], bad: str
) -> None:
    t = await tenant(client)
    before = await listing(client, t, scenarios_path(t))
    response = await client.post(
        scenarios_path(t), json={**SCENARIO, "customer_context": context}, headers=t.owner.headers
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "customer_context", *loc], entry
    assert {"type": entry["type"], "ctx": entry["ctx"]} == UNSTORABLE, entry
    assert entry["input"] == bad, entry
    assert await listing(client, t, scenarios_path(t)) == before


@pytest.mark.parametrize(("context", "loc", "bad"), NUL_CONTEXTS)
async def test_nul_inside_customer_context_is_refused_on_update(
    client: AsyncTestClient, context: dict[str, Any], loc: list[str], bad: str
) -> None:
    t = await tenant(client)
    scenario = await create_scenario(client, t, customer_context={"name": "Ada"})
    path = f"{scenarios_path(t)}/{scenario['id']}"
    response = await client.put(
        path, json={"name": "Renamed", "customer_context": context}, headers=t.owner.headers
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "customer_context", *loc], entry
    assert entry["type"] == "string_pattern_mismatch", entry
    assert entry["input"] == bad, entry
    assert await listing(client, t, path) == scenario, "a refused update changed the scenario"


async def test_lone_surrogate_escape_in_a_body_is_malformed_json(client: AsyncTestClient) -> None:
    t = await tenant(client)
    before = await listing(client, t, scenarios_path(t))
    body = b'{"name": "s", "turns": [{"user_message": "hi"}], "customer_context": {"a": "\\ud800"}}'
    response = await client.post(
        scenarios_path(t), content=body, headers={**t.owner.headers, **JSON}
    )
    assert single_validation_entry(response)["type"] == "json_invalid"
    assert await listing(client, t, scenarios_path(t)) == before


def test_free_form_objects_refuse_lone_surrogates_however_they_arrive() -> None:
    """JSON cannot carry a lone surrogate past the decoder, but msgpack or code can."""
    body = {**SCENARIO, "customer_context": {"a": [{"\udc00key": 1}]}}
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert(body, ScenarioCreate)
    cause = refused.value.__cause__
    assert isinstance(cause, UnstorableJson), refused.value
    assert cause.path == ("customer_context", "a", "0", "\udc00key")
    with pytest.raises(UnstorableJson):
        ScenarioCreate(name="s", turns=[], customer_context={"k": "\ud800"})


@pytest.mark.parametrize("field", ["headers", "query_params"])
async def test_nul_in_allowed_domain_maps_is_refused_on_create_and_update(
    client: AsyncTestClient, field: str
) -> None:
    t = await tenant(client)
    response = await client.post(
        domains_path(t), json={"domain": "api.example.com"}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text
    domain_path = f"{domains_path(t)}/{response.json()['id']}"
    before = await listing(client, t, domains_path(t))
    for method, path, extra in (
        ("POST", domains_path(t), {"domain": "other.example.com"}),
        ("PATCH", domain_path, {}),
    ):
        for value, loc, bad in (
            ({"X-Tenant": "a\x00b"}, ["X-Tenant"], "a\x00b"),
            ({"X-\x00": "v"}, ["X-\x00"], "X-\x00"),
        ):
            response = await client.request(
                method, path, json={**extra, field: value}, headers=t.owner.headers
            )
            entry = single_validation_entry(response)
            assert entry["loc"] == ["body", field, *loc], (method, entry)
            assert {"type": entry["type"], "ctx": entry["ctx"]} == UNSTORABLE, entry
            assert entry["input"] == bad, entry
    assert await listing(client, t, domains_path(t)) == before


# --- nesting ------------------------------------------------------------------------------------


async def test_customer_context_nests_at_most_the_documented_depth(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    deepest = nested(MAX_JSON_DEPTH)
    created = await create_scenario(client, t, customer_context=deepest)
    assert created["customer_context"] == deepest
    before = await listing(client, t, scenarios_path(t))

    response = await client.post(
        scenarios_path(t),
        json={**SCENARIO, "customer_context": nested(MAX_JSON_DEPTH + 1)},
        headers=t.owner.headers,
    )
    entry = single_validation_entry(response)
    assert entry["loc"] == ["body", "customer_context", *["a"] * MAX_JSON_DEPTH], entry
    assert entry["type"] == "too_deeply_nested", entry
    assert entry["ctx"] == {"max_depth": MAX_JSON_DEPTH}, entry
    assert await listing(client, t, scenarios_path(t)) == before


@pytest.mark.parametrize("levels", [200, 1_000])
async def test_deep_nesting_on_scenario_create_is_refused(
    client: AsyncTestClient, levels: int
) -> None:
    """Both sides of the decoder's own limit: refused by the field's bound, or by the decoder."""
    t = await tenant(client)
    before = await listing(client, t, scenarios_path(t))
    body = b'{"name": "s", "turns": [{"user_message": "hi"}], "customer_context": '
    response = await client.post(
        scenarios_path(t),
        content=body + deep_json(levels) + b"}",
        headers={**t.owner.headers, **JSON},
    )
    entry = single_validation_entry(response)
    assert entry["loc"][0] == "body", entry
    assert entry["type"] in {"too_deeply_nested", "json_invalid"}, entry
    if levels == 1_000:
        assert_json_invalid(response, "nested too deeply")
    assert await listing(client, t, scenarios_path(t)) == before


@pytest.mark.parametrize("levels", [300, 1_000])
async def test_deep_nesting_on_register_is_refused_and_creates_no_account(
    client: AsyncTestClient, levels: int
) -> None:
    email = unique_email()
    prefix = json.dumps({"email": email, "password": PASSWORD, "first_name": "A"})[:-1]
    body = f'{prefix}, "last_name": '.encode() + b"[" * levels + b"]" * levels + b"}"
    response = await client.post("/v1/auth/register", content=body, headers=JSON)
    entry = single_validation_entry(response)
    if levels == 1_000:
        assert_json_invalid(response, "nested too deeply")
    else:
        # Decoded, then refused by the field's type; too deep to echo back safely.
        assert entry["loc"] == ["body", "last_name"], entry
        assert entry["type"] == "str_type", entry
        assert entry["input"] is None, entry
    await assert_no_account(client, email)


# --- invalid UTF-8 ------------------------------------------------------------------------------


async def test_invalid_utf8_on_register_is_refused_and_creates_no_account(
    client: AsyncTestClient,
) -> None:
    email = unique_email()
    body = (
        f'{{"email": "{email}", "password": "{PASSWORD}", "first_name": "'.encode()
        + b'Ren\xe9", "last_name": "User"}'
    )
    response = await client.post("/v1/auth/register", content=body, headers=JSON)
    assert_json_invalid(response, "UTF-8")
    await assert_no_account(client, email)


async def test_invalid_utf8_on_login_is_refused(client: AsyncTestClient) -> None:
    user = await register(client)
    body = f'{{"email": "{user.email}", "password": "'.encode() + b'\xff\xfe"}'
    response = await client.post("/v1/auth/login", content=body, headers=JSON)
    assert_json_invalid(response, "UTF-8")


async def test_invalid_utf8_on_an_authenticated_create_stores_nothing(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    before = await listing(client, t, scenarios_path(t))
    # An encoded surrogate (ED A0 80) is not UTF-8 either.
    for name in (b"\xc3", b"\xed\xa0\x80", b"ok\x80"):
        body = b'{"name": "' + name + b'", "turns": [{"user_message": "hi"}]}'
        response = await client.post(
            scenarios_path(t), content=body, headers={**t.owner.headers, **JSON}
        )
        assert_json_invalid(response, "UTF-8")
    assert await listing(client, t, scenarios_path(t)) == before


# --- fuzz -----------------------------------------------------------------------------------------

_TEXT = st.text(
    alphabet=st.one_of(st.sampled_from('\x00\ud800\udfff\u00e9a{}[]"\\'), st.characters()),
    max_size=8,
)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)
_FIELDS = ["email", "password", "name", "customer_context", "headers", "query_params", "turns"]


@st.composite
def _bad_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "value", "deep"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    field = draw(st.sampled_from(_FIELDS))
    if kind == "value":
        # json.dumps writes NUL and lone surrogates as \u escapes.
        return json.dumps({field: draw(_VALUES)}).encode()
    levels = draw(st.integers(1, 1_500))
    opener = draw(st.sampled_from([b"[", b'{"a":']))
    closer = b"]" if opener == b"[" else b"}"
    inner = opener * levels + b"0" + closer * levels
    return b'{"' + field.encode() + b'": ' + inner + b"}"


@pytest.fixture
async def fuzz_targets(client: AsyncTestClient) -> tuple[list[tuple[str, str]], dict[str, str]]:
    t = await tenant(client)
    scenario = await create_scenario(client, t)
    response = await client.post(
        domains_path(t), json={"domain": "api.example.com"}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text
    targets = [
        ("POST", "/v1/auth/register"),
        ("POST", "/v1/auth/login"),
        ("POST", "/v1/organizations"),
        ("POST", scenarios_path(t)),
        ("PUT", f"{scenarios_path(t)}/{scenario['id']}"),
        ("POST", domains_path(t)),
        ("PATCH", f"{domains_path(t)}/{response.json()['id']}"),
    ]
    return targets, t.owner.headers


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(target=st.integers(0, 6), body=_bad_bodies())
async def test_fuzzed_bodies_never_answer_5xx(
    client: AsyncTestClient,
    fuzz_targets: tuple[list[tuple[str, str]], dict[str, str]],
    target: int,
    body: bytes,
) -> None:
    targets, auth = fuzz_targets
    method, path = targets[target]
    response = await client.request(method, path, content=body, headers={**auth, **JSON})
    assert response.status_code < 500, (method, path, body[:200], response.text[:300])
    assert response.status_code >= 400 or response.status_code in (200, 201)
    if response.status_code == 422:
        for entry in response.json()["detail"]:
            assert set(entry) == {"loc", "msg", "type", "input", "ctx"}, entry
            assert entry["loc"][0] in {"body", "query", "path"}, entry
    elif response.status_code >= 400:
        assert isinstance(response.json()["detail"], str), response.text


@pytest.mark.parametrize("tag", ["a\x00b", "\x00", "x" * 101, ""])
async def test_an_unstorable_or_oversized_tag_filter_answers_422(
    client: AsyncTestClient, tag: str
) -> None:
    t = await tenant(client)
    await create_scenario(client, t, tags=["smoke"])
    response = await client.get(scenarios_path(t), params={"tag": tag}, headers=t.owner.headers)
    entry = single_validation_entry(response)
    assert entry["loc"] == ["query", "tag"], entry
    # The filter still works for a storable tag.
    found = await client.get(scenarios_path(t), params={"tag": "smoke"}, headers=t.owner.headers)
    assert found.json()["total"] == 1


@pytest.mark.parametrize(
    ("turn", "loc", "kind"),
    [
        ({"user_message": "hi", "required": 0}, ["body", "turns", "0", "required"], "bool_type"),
        ({"user_message": 5}, ["body", "turns", "0", "user_message"], "str_type"),
    ],
)
async def test_a_body_is_checked_strictly_against_its_schema(
    client: AsyncTestClient, turn: dict[str, Any], loc: list[str], kind: str
) -> None:
    """Litestar converts bodies laxly (``0`` → ``false``); the published schema is strict."""
    t = await tenant(client)
    body = {"name": "Strict", "turns": [turn]}
    response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
    entry = single_validation_entry(response)
    assert (entry["loc"], entry["type"]) == (loc, kind), entry
    assert (await listing(client, t, scenarios_path(t)))["total"] == 0


@pytest.mark.parametrize(("limit", "status"), [(3.0, 200), (1e1, 200), (3.5, 422), ("3", 422)])
async def test_an_integer_field_takes_a_number_without_a_fraction_and_nothing_else(
    client: AsyncTestClient, limit: Any, status: int
) -> None:
    """JSON Schema's ``integer``, what the OpenAPI document says, is any number without a
    fraction: ``3.0`` is one, ``3.5`` and ``"3"`` are not."""
    t = await tenant(client)
    body = {"query": "refunds", "limit": limit}
    response = await client.post(
        f"/v1/orgs/{t.id}/knowledge/search", json=body, headers=t.owner.headers
    )
    assert response.status_code == status, response.text
    if status == 422:
        assert single_validation_entry(response)["loc"] == ["body", "limit"]


async def test_an_integer_field_deep_in_a_body_takes_a_number_without_a_fraction(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    criterion = {"question": "hello", "criteria_type": "contains", "order_index": 2.0}
    body = {"name": "Whole", "turns": [{"user_message": "hi", "criteria": [criterion]}]}
    response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
