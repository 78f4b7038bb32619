"""Scenarios: spec 10-13 and the listing (DESIGN §3).

A scenario stores ordered turns, each with ordered criteria; responses carry their ids
and ``order_index`` (0..n-1 by position).  PUT updates the given fields; ``turns`` given
replaces every turn (new ids), a null ``name`` is ignored.  DELETE answers 204, then 404.
The listing ``{scenarios: [...], total}`` pages with limit/offset and filters by an exact
tag.  Permissions: ``scenarios:read`` to read, ``scenarios:write`` to write.  Another
organization's scenario is indistinguishable from a missing one.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Any

import httpx
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from tests.support.factories import Tenant, create_token, tenant
from tests.support.scenario_setup import (
    create_http_agent,
    create_scenario,
    criterion,
    scenario_body,
    turn,
)

SCENARIO_FIELDS = {
    "id",
    "organization_id",
    "created_by_user_id",
    "name",
    "description",
    "tags",
    "customer_context",
    "turns",
    "created_at",
    "updated_at",
}
TURN_FIELDS = {"id", "scenario_id", "order_index", "user_message", "required", "criteria"}
CRITERION_FIELDS = {
    "id",
    "turn_id",
    "question",
    "criteria_type",
    "few_shot_examples",
    "order_index",
    "expected_arguments",
}


def scenarios_path(t: Tenant, scenario_id: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/scenarios"
    return base if scenario_id is None else f"{base}/{scenario_id}"


def parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None, f"timestamp without timezone: {value}"
    return parsed


async def get_scenario(client: AsyncTestClient, t: Tenant, scenario_id: str) -> dict[str, Any]:
    response = await client.get(scenarios_path(t, scenario_id), headers=t.owner.headers)
    assert response.status_code == 200, response.text
    return response.json()


async def list_scenarios(client: AsyncTestClient, t: Tenant, query: str = "") -> dict[str, Any]:
    response = await client.get(f"{scenarios_path(t)}{query}", headers=t.owner.headers)
    assert response.status_code == 200, response.text
    return response.json()


def full_body() -> dict[str, Any]:
    return {
        "name": "Rebooking a flight",
        "description": "The customer wants to move a booking.",
        "tags": ["booking", "smoke"],
        "customer_context": {"name": "Ada", "booking": {"id": "BK-42", "seats": 2}},
        "turns": [
            {
                "user_message": "Hi, I am {{ name }}.",
                "required": True,
                "criteria": [
                    {
                        "question": "Does the agent greet the customer by name?",
                        "criteria_type": "llm_evaluated",
                        "few_shot_examples": [
                            {"response": "Hello Ada!", "verdict": "PASS", "critique": "By name."},
                            {"response": "Hello.", "verdict": "FAIL", "critique": "No name."},
                        ],
                        "order_index": 0,
                    },
                    {"question": "Ada", "criteria_type": "contains", "order_index": 0},
                ],
            },
            {
                "user_message": "Move booking {{ booking.id }} to Friday.",
                "required": False,
                "criteria": [
                    {"question": "sorry", "criteria_type": "not_contains"},
                    {"question": r"Friday|friday", "criteria_type": "regex"},
                    {"question": "Is the new date confirmed?"},
                ],
            },
            {"user_message": "Thanks, bye.", "required": False, "criteria": []},
        ],
    }


def check_structure(data: dict[str, Any], body: dict[str, Any]) -> None:
    """``data`` (a ScenarioRead) holds ``body``'s turns and criteria, ordered and linked."""
    assert set(data) == SCENARIO_FIELDS, sorted(data)
    assert len(data["turns"]) == len(body["turns"])
    seen_ids: set[str] = set()
    for position, (got, sent) in enumerate(zip(data["turns"], body["turns"], strict=True)):
        assert set(got) == TURN_FIELDS, sorted(got)
        assert got["scenario_id"] == data["id"]
        assert got["order_index"] == position
        assert got["user_message"] == sent["user_message"]
        assert got["required"] is sent.get("required", False)
        sent_criteria = sent.get("criteria", [])
        assert len(got["criteria"]) == len(sent_criteria)
        seen_ids.add(got["id"])
        for c_position, (c_got, c_sent) in enumerate(
            zip(got["criteria"], sent_criteria, strict=True)
        ):
            assert set(c_got) == CRITERION_FIELDS, sorted(c_got)
            assert c_got["turn_id"] == got["id"]
            assert c_got["order_index"] == c_position, "criteria are ordered by their position"
            assert c_got["question"] == c_sent["question"]
            assert c_got["criteria_type"] == c_sent.get("criteria_type", "llm_evaluated")
            expected_examples = [
                {"critique": "", **example} for example in c_sent.get("few_shot_examples", [])
            ]
            assert c_got["few_shot_examples"] == expected_examples
            seen_ids.add(c_got["id"])
    for value in seen_ids:
        uuid.UUID(value)
    total = len(body["turns"]) + sum(len(t.get("criteria", [])) for t in body["turns"])
    assert len(seen_ids) == total, "every turn and criterion has its own id"


# --- create and read ---------------------------------------------------------------------------


async def test_create_answers_201_with_the_full_scenario(client: AsyncTestClient) -> None:
    t = await tenant(client)
    body = full_body()
    before = datetime.now().astimezone()
    response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    data = response.json()

    uuid.UUID(data["id"])
    assert data["organization_id"] == t.id
    assert data["created_by_user_id"] == t.owner.id
    assert data["name"] == body["name"]
    assert data["description"] == body["description"]
    assert data["tags"] == ["booking", "smoke"]
    assert data["customer_context"] == body["customer_context"]
    created, updated = parse_time(data["created_at"]), parse_time(data["updated_at"])
    assert abs((created - before).total_seconds()) < 60
    assert updated >= created
    check_structure(data, body)
    first = data["turns"][0]["criteria"][0]
    assert first["few_shot_examples"][1] == {
        "response": "Hello.",
        "verdict": "FAIL",
        "critique": "No name.",
    }

    # GET answers the same document.
    assert await get_scenario(client, t, data["id"]) == data


async def test_create_with_the_minimum_gets_the_defaults(client: AsyncTestClient) -> None:
    t = await tenant(client)
    body = {
        "name": "x",
        "turns": [
            {"user_message": "Hello"},
            {
                "user_message": "Again",
                "criteria": [
                    {
                        "question": "Polite?",
                        "few_shot_examples": [{"response": "r", "verdict": "PASS"}],
                    }
                ],
            },
        ],
    }
    response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
    assert response.status_code == 201, response.text
    data = response.json()
    assert data["description"] is None
    assert data["tags"] == []
    assert data["customer_context"] == {}
    assert [t_["required"] for t_ in data["turns"]] == [False, False]
    assert data["turns"][0]["criteria"] == []
    only = data["turns"][1]["criteria"][0]
    assert only["criteria_type"] == "llm_evaluated"
    assert only["few_shot_examples"] == [{"response": "r", "verdict": "PASS", "critique": ""}]
    check_structure(data, body)


async def test_criteria_order_follows_position_not_the_given_order_index(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    criteria = [
        {"question": "third?", "order_index": 7},
        {"question": "first?", "order_index": 0},
        {"question": "second?", "order_index": 3},
    ]
    data = await create_scenario(client, t, turns=[{"user_message": "m", "criteria": criteria}])
    got = (await get_scenario(client, t, data["id"]))["turns"][0]["criteria"]
    assert [c["question"] for c in got] == ["third?", "first?", "second?"]
    assert [c["order_index"] for c in got] == [0, 1, 2]


async def test_get_unknown_scenario_is_404(client: AsyncTestClient) -> None:
    t = await tenant(client)
    response = await client.get(scenarios_path(t, str(uuid.uuid4())), headers=t.owner.headers)
    assert response.status_code == 404, response.text
    assert isinstance(response.json()["detail"], str)


# --- update ------------------------------------------------------------------------------------


async def test_put_name_only_keeps_everything_else_and_the_turn_ids(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    created = await create_scenario(client, t, **full_body())
    response = await client.put(
        scenarios_path(t, created["id"]), json={"name": "Renamed"}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["name"] == "Renamed"
    for key in ("id", "description", "tags", "customer_context", "turns", "created_at"):
        assert data[key] == created[key], key
    assert parse_time(data["updated_at"]) > parse_time(created["updated_at"])
    assert await get_scenario(client, t, created["id"]) == data


async def test_put_turns_replaces_every_turn_with_new_ids(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create_scenario(client, t, **full_body())
    old_ids = {tr["id"] for tr in created["turns"]} | {
        c["id"] for tr in created["turns"] for c in tr["criteria"]
    }
    new_turns = [
        turn("New first", criterion("ok", "contains"), required=True),
        turn("New second", criterion("Helpful?"), criterion("no", "not_contains")),
    ]
    response = await client.put(
        scenarios_path(t, created["id"]), json={"turns": new_turns}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    data = response.json()
    check_structure(data, {"turns": new_turns})
    new_ids = {tr["id"] for tr in data["turns"]} | {
        c["id"] for tr in data["turns"] for c in tr["criteria"]
    }
    assert not new_ids & old_ids, "replaced turns and criteria get new ids"
    for key in ("name", "description", "tags", "customer_context", "created_at"):
        assert data[key] == created[key], key
    again = await get_scenario(client, t, created["id"])
    assert again == data
    assert [tr["user_message"] for tr in again["turns"]] == ["New first", "New second"]


async def test_concurrent_puts_of_turns_each_apply_whole(
    client: AsyncTestClient, live_client: httpx.AsyncClient, db: AsyncSession
) -> None:
    """Ten PUTs replacing the turns at once: every one answers 200 (they apply one after
    the other), and the scenario ends with exactly the turns of one of them, in order."""
    t = await tenant(client)
    created = await create_scenario(client, t, **full_body())
    path = scenarios_path(t, created["id"])
    bodies = [
        {"turns": [turn(f"put {i} turn {j}", criterion(f"c{i}.{j}")) for j in range(1 + i % 3)]}
        for i in range(10)
    ]
    responses = await asyncio.gather(
        *(live_client.put(path, json=body, headers=t.owner.headers) for body in bodies)
    )
    assert [r.status_code for r in responses] == [200] * 10, [r.text[:200] for r in responses]
    for response, body in zip(responses, bodies, strict=True):
        check_structure(response.json(), body)  # each answer is its own PUT, applied whole

    final = await get_scenario(client, t, created["id"])
    sent = [[tr["user_message"] for tr in body["turns"]] for body in bodies]
    kept = [tr["user_message"] for tr in final["turns"]]
    assert kept in sent, kept
    check_structure(final, bodies[sent.index(kept)])
    stored = await db.scalar(
        text("SELECT count(*) FROM scenario_turns WHERE scenario_id = :s"),
        {"s": uuid.UUID(created["id"])},
    )
    await db.commit()
    assert stored == len(kept), "no turn of another PUT is left behind"


async def test_put_other_fields_and_nulls(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create_scenario(client, t, **full_body())
    path = scenarios_path(t, created["id"])
    grace = {"name": "Grace", "booking": {"id": "BK-7"}}  # the turns' variables, still there

    response = await client.put(
        path,
        json={"name": None, "tags": ["vip"], "customer_context": grace},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["name"] == created["name"], "a null name is ignored"
    assert data["tags"] == ["vip"]
    assert data["customer_context"] == grace
    assert data["turns"] == created["turns"]

    response = await client.put(path, json={"description": None}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    assert response.json()["description"] is None

    # An empty body changes nothing but is accepted.
    response = await client.put(path, json={}, headers=t.owner.headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["name"], body["tags"], body["turns"]) == (
        created["name"],
        ["vip"],
        created["turns"],
    )


async def test_bad_update_bodies_answer_422_and_change_nothing(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await create_scenario(client, t, **full_body())
    path = scenarios_path(t, created["id"])
    cases = [
        ({"name": ""}, ["body", "name"], "string_too_short"),
        ({"name": "n" * 256}, ["body", "name"], "string_too_long"),
        ({"turns": []}, ["body", "turns"], "too_short"),
        ({"owner": "me"}, ["body", "owner"], "extra_forbidden"),
        (
            {"turns": [turn("m", criterion("(unclosed", "regex"))]},
            ["body", "turns", "0", "criteria", "0", "question"],
            None,
        ),
    ]
    problems = []
    for body, loc, kind in cases:
        response = await client.put(path, json=body, headers=t.owner.headers)
        if response.status_code != 422:
            problems.append(f"{body}: {response.status_code} {response.text[:200]}")
            continue
        entry = response.json()["detail"][0]
        if entry["loc"] != loc or (kind is not None and entry["type"] != kind):
            problems.append(f"{body}: entry {entry}")
    assert not problems, problems
    assert await get_scenario(client, t, created["id"]) == created


# --- user message templates ------------------------------------------------------------------

CONTEXT = {"name": "Ada", "booking": {"id": "BK-42", "seats": 2}, "items": [{"sku": "A1"}]}
BAD_TEMPLATES = [
    ("Hello {{ nobody }}", "'nobody'"),
    ("Hi {{ name }}, {{ email }} and {{ phone }}", "'email', 'phone'"),
    ("Hello {{ name", "Invalid template"),
    ("{% if name %}unclosed", "Invalid template"),
    ("About {{ booking.ref }}", "booking.ref"),
    ("About {{ booking['id'].x.y }}", None),  # a string has no .x: only rendering can tell
    ("About {{ booking.id }} {{ items[3].sku }}", "items[3]"),
    ("About {{ booking.missing.deeper }}", "booking.missing"),
    ("It is {{ self }}", "'self' is reserved"),
]
GOOD_TEMPLATES = [
    "Hi {{ name }}, about {{ booking.id }} for {{ booking.seats + 1 }} seats",
    "{{ name | upper }} {{ items[0].sku }} {{ items[-1]['sku'] }}",
    "{% for item in items %}{{ item.sku }} {{ item.anything }}{% endfor %}",
    "{% set booking = {'ref': 'x'} %}{{ booking.ref }}",
    "{{ booking.items() | list | length }} {{ range(3) | list }} {{ booking.get('ref') }}",
    "{# {{ nobody }} is only in a comment #}Plain {text}",
]


async def test_a_template_that_cannot_render_is_refused_at_create(
    client: AsyncTestClient,
) -> None:
    """DESIGN §5.2: a template's variables are the customer context's top-level keys; a
    template that cannot render with them would fail every run, so it is not saved."""
    t = await tenant(client)
    problems = []
    for template, mentions in BAD_TEMPLATES:
        body = scenario_body(customer_context=CONTEXT, turns=[turn("Hi"), turn(template)])
        response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
        if mentions is None:
            if response.status_code != 201:
                problems.append(f"{template}: {response.status_code} {response.text[:200]}")
            continue
        if response.status_code != 422:
            problems.append(f"{template}: {response.status_code} {response.text[:200]}")
            continue
        entry = response.json()["detail"][0]
        if entry["loc"] != ["body", "turns", "1", "user_message"]:
            problems.append(f"{template}: loc {entry['loc']}")
        if mentions not in entry["msg"] or entry["input"] != template:
            problems.append(f"{template}: {entry}")
    assert not problems, "\n".join(problems)
    assert (await list_scenarios(client, t))["total"] == 1, "only the undecidable one"

    for template in GOOD_TEMPLATES:
        body = scenario_body(customer_context=CONTEXT, turns=[turn(template)])
        response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
        assert response.status_code == 201, f"{template}: {response.text}"

    # The same nested template, with and without the key it reaches.
    nested = [turn("Move {{ booking.id }}")]
    for context, status in (
        ({"booking": {"id": 7}}, 201),
        ({"booking": {"ref": 7}}, 422),
        ({"name": "Ada"}, 422),
        ({}, 422),
    ):
        body = scenario_body(customer_context=context, turns=nested)
        response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
        assert response.status_code == status, (context, response.text)
        if status == 422:
            assert response.json()["detail"][0]["loc"] == ["body", "turns", "0", "user_message"]


async def test_a_template_that_cannot_render_is_refused_at_update(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    created = await create_scenario(client, t, **full_body())  # uses name and booking.id
    path = scenarios_path(t, created["id"])
    cases = [
        # New turns are checked against the context kept...
        ({"turns": [turn("Hi {{ name }}"), turn("{{ nobody }}")]}, ["body", "turns", "1"]),
        ({"turns": [turn("Hi {{ name")]}, ["body", "turns", "0"]),
        ({"turns": [turn("{{ booking.ref }}")]}, ["body", "turns", "0"]),
        # ...or the context given with them...
        (
            {"customer_context": {"name": "Eve"}, "turns": [turn("{{ booking.id }}")]},
            ["body", "turns", "0"],
        ),
        # ...and a new context alone must still serve the turns kept.
        ({"customer_context": {"name": "Eve"}}, ["body", "customer_context"]),
        ({"customer_context": {"name": "Eve", "booking": {}}}, ["body", "customer_context"]),
    ]
    problems = []
    for body, loc in cases:
        response = await client.put(path, json=body, headers=t.owner.headers)
        if response.status_code != 422:
            problems.append(f"{body}: {response.status_code} {response.text[:200]}")
            continue
        entry = response.json()["detail"][0]
        if entry["loc"][: len(loc)] != loc or (loc[1] == "turns" and len(entry["loc"]) != 4):
            problems.append(f"{body}: loc {entry['loc']}")
        if loc == ["body", "customer_context"] and not entry["msg"].startswith("turn 1:"):
            problems.append(f"{body}: msg {entry['msg']}")
    assert not problems, "\n".join(problems)
    assert await get_scenario(client, t, created["id"]) == created

    # Context and turns that agree are saved.
    response = await client.put(
        path,
        json={"customer_context": {"who": "Eve"}, "turns": [turn("I am {{ who }}")]},
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text
    response = await client.put(
        path, json={"customer_context": {"who": "Bob", "extra": 1}}, headers=t.owner.headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["customer_context"] == {"who": "Bob", "extra": 1}


# --- delete ------------------------------------------------------------------------------------


async def test_delete_answers_204_then_404(client: AsyncTestClient) -> None:
    t = await tenant(client)
    keep = await create_scenario(client, t, name="keep")
    gone = await create_scenario(client, t, name="gone")
    path = scenarios_path(t, gone["id"])

    response = await client.delete(path, headers=t.owner.headers)
    assert response.status_code == 204, response.text
    assert response.content == b""

    for method, json in (("GET", None), ("PUT", {"name": "x"}), ("DELETE", None)):
        response = await client.request(method, path, json=json, headers=t.owner.headers)
        assert response.status_code == 404, f"{method}: {response.status_code} {response.text}"
    listing = await list_scenarios(client, t)
    assert [s["id"] for s in listing["scenarios"]] == [keep["id"]]
    assert listing["total"] == 1
    assert await get_scenario(client, t, keep["id"]) == keep


# --- listing -----------------------------------------------------------------------------------


async def test_listing_pages_in_creation_order_with_turn_counts(client: AsyncTestClient) -> None:
    t = await tenant(client)
    made = []
    for i in range(5):
        turns = [turn(f"message {n}") for n in range(i + 1)]
        made.append(await create_scenario(client, t, name=f"s{i}", turns=turns, tags=[f"t{i}"]))

    everything = await list_scenarios(client, t)
    assert set(everything) == {"scenarios", "total"}
    assert everything["total"] == 5
    assert [s["id"] for s in everything["scenarios"]] == [s["id"] for s in made]
    first = everything["scenarios"][0]
    assert first["name"] == "s0"
    assert first["tags"] == ["t0"]
    assert first["organization_id"] == t.id
    assert "turns" not in first, "the listing carries a summary, not the turns"
    assert [s["turn_count"] for s in everything["scenarios"]] == [1, 2, 3, 4, 5]
    for key in ("created_at", "updated_at", "description"):
        assert key in first, key

    page = await list_scenarios(client, t, "?limit=2&offset=1")
    assert page["total"] == 5
    assert [s["name"] for s in page["scenarios"]] == ["s1", "s2"]
    tail = await list_scenarios(client, t, "?limit=2&offset=4")
    assert [s["name"] for s in tail["scenarios"]] == ["s4"]
    beyond = await list_scenarios(client, t, "?offset=5")
    assert beyond == {"scenarios": [], "total": 5}

    for query in ("?limit=0", "?limit=501", "?offset=-1"):
        response = await client.get(f"{scenarios_path(t)}{query}", headers=t.owner.headers)
        assert response.status_code == 422, f"{query}: {response.text}"
        assert response.json()["detail"][0]["loc"][0] == "query"


async def test_listing_filters_by_exact_tag(client: AsyncTestClient) -> None:
    t = await tenant(client)
    smoke = await create_scenario(client, t, name="smoke only", tags=["smoke"])
    both = await create_scenario(client, t, name="smoke and booking", tags=["booking", "smoke"])
    await create_scenario(client, t, name="smoker", tags=["smoke-test", "smokers"])
    await create_scenario(client, t, name="untagged")

    tagged = await list_scenarios(client, t, "?tag=smoke")
    assert [s["id"] for s in tagged["scenarios"]] == [smoke["id"], both["id"]]
    assert tagged["total"] == 2
    assert all("smoke" in s["tags"] for s in tagged["scenarios"])

    booking = await list_scenarios(client, t, "?tag=booking")
    assert [s["id"] for s in booking["scenarios"]] == [both["id"]]
    assert booking["total"] == 1

    # A tag that is a prefix (or part) of another tag does not match it.
    for query in ("?tag=smok", "?tag=book", "?tag=smokers-club", "?tag=nothing"):
        assert await list_scenarios(client, t, query) == {"scenarios": [], "total": 0}, query
    assert (await list_scenarios(client, t, "?tag=smokers"))["total"] == 1

    paged = await list_scenarios(client, t, "?tag=smoke&limit=1&offset=1")
    assert [s["id"] for s in paged["scenarios"]] == [both["id"]]
    assert paged["total"] == 2
    assert (await list_scenarios(client, t))["total"] == 4


# --- validation --------------------------------------------------------------------------------


async def test_bad_create_bodies_answer_422_and_create_nothing(client: AsyncTestClient) -> None:
    t = await tenant(client)
    one_turn = [turn("Hi")]

    def with_criterion(**fields: Any) -> list[dict[str, Any]]:
        return [turn("Hi", {"question": "q?", **fields})]

    cases: list[tuple[str, dict[str, Any], list[str], set[str] | None]] = [
        ("empty name", {"name": "", "turns": one_turn}, ["body", "name"], {"string_too_short"}),
        (
            "name of 256",
            {"name": "n" * 256, "turns": one_turn},
            ["body", "name"],
            {"string_too_long"},
        ),
        ("no turns", {"name": "x", "turns": []}, ["body", "turns"], {"too_short"}),
        ("missing turns", {"name": "x"}, ["body", "turns"], {"missing"}),
        ("missing name", {"turns": one_turn}, ["body", "name"], {"missing"}),
        (
            "unknown criteria_type",
            {"name": "x", "turns": with_criterion(criteria_type="vibes")},
            ["body", "turns", "0", "criteria", "0", "criteria_type"],
            {"enum", "literal_error"},
        ),
        (
            "verdict MAYBE",
            {
                "name": "x",
                "turns": with_criterion(
                    few_shot_examples=[
                        {"response": "r", "verdict": "PASS"},
                        {"response": "r", "verdict": "MAYBE"},
                    ]
                ),
            },
            ["body", "turns", "0", "criteria", "0", "few_shot_examples", "1", "verdict"],
            {"enum", "literal_error"},
        ),
        (
            "invalid regex",
            {
                "name": "x",
                "turns": [
                    turn("fine", criterion("ok", "regex")),
                    turn("Hi", criterion("[a-", "regex")),
                ],
            },
            ["body", "turns", "1", "criteria", "0", "question"],
            None,
        ),
        (
            "invalid regex in the first turn",
            {"name": "x", "turns": [turn("Hi", criterion("(unclosed", "regex"))]},
            ["body", "turns", "0", "criteria", "0", "question"],
            None,
        ),
        (
            "unknown field",
            {"name": "x", "turns": one_turn, "organization_id": str(uuid.uuid4())},
            ["body", "organization_id"],
            {"extra_forbidden"},
        ),
        (
            "unknown turn field",
            {"name": "x", "turns": [{"user_message": "m", "id": str(uuid.uuid4())}]},
            ["body", "turns", "0", "id"],
            {"extra_forbidden"},
        ),
    ]
    problems = []
    for name, body, loc, kinds in cases:
        response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
        if response.status_code != 422:
            problems.append(f"{name}: {response.status_code} {response.text[:200]}")
            continue
        entries = response.json()["detail"]
        entry = entries[0]
        if set(entry) != {"loc", "msg", "type", "input", "ctx"}:
            problems.append(f"{name}: entry keys {sorted(entry)}")
        if entry["loc"] != loc:
            problems.append(f"{name}: loc {entry['loc']} != {loc}")
        if kinds is not None and entry["type"] not in kinds:
            problems.append(f"{name}: type {entry['type']} not in {kinds}")
        if not entry["msg"]:
            problems.append(f"{name}: empty msg")
    assert not problems, "\n".join(problems)
    assert (await list_scenarios(client, t))["total"] == 0, "a bad request created a scenario"

    # The rules' bounds themselves are accepted.
    for body in ({"name": "n" * 255, "turns": one_turn}, {"name": "n", "turns": one_turn}):
        response = await client.post(scenarios_path(t), json=body, headers=t.owner.headers)
        assert response.status_code == 201, response.text


# --- permissions and isolation -----------------------------------------------------------------


async def test_permissions_read_and_write(client: AsyncTestClient) -> None:
    t = await tenant(client, with_roles=("MEMBER", "VIEWER", "GUEST"))
    existing = await create_scenario(client, t, name="existing")
    path = scenarios_path(t, existing["id"])
    reader = await create_token(client, t.owner, t.id, ["scenarios:read"])
    writer = await create_token(client, t.owner, t.id, ["scenarios:read", "scenarios:write"])

    async def status(
        caller_headers: dict[str, str], method: str, url: str, json: Any = None
    ) -> int:
        response = await client.request(method, url, json=json, headers=caller_headers)
        return response.status_code

    # Readers: the VIEWER and a token holding scenarios:read only.
    for who, headers in (("VIEWER", t.members["VIEWER"].headers), ("token", reader.headers)):
        assert await status(headers, "GET", path) == 200, who
        assert await status(headers, "GET", scenarios_path(t)) == 200, who
        assert await status(headers, "POST", scenarios_path(t), scenario_body()) == 403, who
        assert await status(headers, "PUT", path, {"name": "hacked"}) == 403, who
        assert await status(headers, "DELETE", path) == 403, who

    # The GUEST can do nothing.
    guest = t.members["GUEST"].headers
    assert await status(guest, "GET", path) == 403
    assert await status(guest, "GET", scenarios_path(t)) == 403
    assert await status(guest, "POST", scenarios_path(t), scenario_body()) == 403
    assert await status(guest, "PUT", path, {"name": "hacked"}) == 403
    assert await status(guest, "DELETE", path) == 403

    # Without a token at all: 401.
    assert await status({}, "GET", path) == 401
    assert await status({}, "POST", scenarios_path(t), scenario_body()) == 401

    # Nothing changed so far.
    assert await get_scenario(client, t, existing["id"]) == existing
    assert (await list_scenarios(client, t))["total"] == 1

    # Writers: the MEMBER and a token with scenarios:write.
    for who, headers in (("MEMBER", t.members["MEMBER"].headers), ("token", writer.headers)):
        response = await client.post(scenarios_path(t), json=scenario_body(), headers=headers)
        assert response.status_code == 201, f"{who}: {response.text}"
        own = scenarios_path(t, response.json()["id"])
        assert await status(headers, "PUT", own, {"name": f"by {who}"}) == 200, who
        assert await status(headers, "DELETE", own) == 204, who
    member_made = await create_scenario(client, t, caller=t.members["MEMBER"])
    assert member_made["created_by_user_id"] == t.members["MEMBER"].id
    token_made = await create_scenario(client, t, caller=writer)
    assert token_made["created_by_user_id"] is None, "a platform token is not a user"


async def test_another_organizations_scenario_is_404_and_unchanged(
    client: AsyncTestClient,
) -> None:
    a = await tenant(client)
    b = await tenant(client)
    theirs = await create_scenario(client, a, **full_body())
    b_agent = await create_http_agent(client, b, "http://127.0.0.1:9")
    requests = [
        ("GET", scenarios_path(b, theirs["id"]), None),
        ("PUT", scenarios_path(b, theirs["id"]), {"name": "stolen"}),
        ("PUT", scenarios_path(b, theirs["id"]), {"turns": [turn("x")]}),
        ("DELETE", scenarios_path(b, theirs["id"]), None),
        ("POST", f"{scenarios_path(b, theirs['id'])}/run", {"agent_id": b_agent["id"]}),
        # B's owner on A's own paths: not a member of A.
        ("GET", scenarios_path(a, theirs["id"]), None),
        ("GET", scenarios_path(a), None),
        ("PUT", scenarios_path(a, theirs["id"]), {"name": "stolen"}),
        ("DELETE", scenarios_path(a, theirs["id"]), None),
        ("POST", scenarios_path(a), scenario_body()),
    ]
    problems = []
    for method, path, json in requests:
        response = await client.request(method, path, json=json, headers=b.owner.headers)
        if response.status_code != 404:
            problems.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
    assert not problems, "\n".join(problems)
    assert await get_scenario(client, a, theirs["id"]) == theirs
    assert (await list_scenarios(client, a))["total"] == 1
    assert (await list_scenarios(client, b))["total"] == 0
    runs = await client.get(f"/v1/orgs/{b.id}/scenarios/runs", headers=b.owner.headers)
    assert runs.status_code == 200, runs.text
    assert runs.json()["total"] == 0
