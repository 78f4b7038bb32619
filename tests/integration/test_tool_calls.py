"""Tool calls (DESIGN §5.10): what an agent reports it called, checked by ``tool_called`` and
``tool_not_called``, kept per turn (redacted, capped), shown to the judge and on the results
page; the criteria's ``expected_arguments`` validated, stored and read back.

The agent is a loopback :class:`FakeAgent` (protocol ``spar``) reporting calls by the
message it is sent; ``openai_chat`` agents are a :class:`FakeOpenAI` answering with the
SDK's own tool-call types.  Runs are played in-process, as the worker plays them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from api.ui.session import COOKIE
from shared.llm.judge import TOOL_CALLS_NOTE
from shared.outbound import tool_calls
from shared.outbound.agents import AgentConfig, AgentError, call_agent
from shared.outbound.egress import DomainRule, EgressClient, EgressPolicy
from shared.outbound.schemas import CUT, ToolCall
from shared.scenarios.runner import execute_run
from shared.scenarios.schemas import MAX_EXPECTED_ARGUMENTS_BYTES
from shared.settings import Settings
from tests.support.factories import Tenant, tenant
from tests.support.fakes import FakeAgent, FakeOpenAI, Reply, openai_completion
from tests.support.scenario_setup import (
    allow_domain,
    create_http_agent,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    outbound_setup,
    start_run,
    turn,
)

LOOKUP = {
    "name": "lookup_order",
    "arguments": {"order_id": "AB-1"},
    "output": {"status": "shipped", "total": 40},
}
REFUND = {
    "name": "refund_order",
    "arguments": {"order_id": "AB-1", "amount": {"value": 40, "currency": "EUR"}},
    "output": "refund R-7 issued",
}
NO_OUTPUT = {"name": "notify", "arguments": {"channel": "email"}}


def calls_for(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What the fake agent reports having called, by the message it answers."""
    message = body["message"]
    if message.startswith("Where is"):
        return [LOOKUP]
    if message.startswith("Refund"):
        return [REFUND, NO_OUTPUT]
    return []


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply=lambda body: f"Done: {body['message']}", tool_calls=calls_for) as fake:
        yield fake


def judge_answer(body: dict[str, Any]) -> str:
    return json.dumps({"verdict": "PASS", "critique": "fine", "evidence": "-"})


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=judge_answer) as fake:
        yield fake


async def play(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    t: Tenant,
    agent_id: str,
    turns: list[dict[str, Any]],
) -> dict[str, Any]:
    scenario = await create_scenario(client, t, turns=turns)
    run = await start_run(client, t, scenario["id"], agent_id)
    await execute_run(app.state.database, settings, UUID(run["id"]))
    return await get_run(client, t, run["id"])


def results(turn_result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["criteria_type"], c["verdict"]) for c in turn_result["criteria_results"]]


async def test_tool_checks_read_the_calls_the_agent_reported(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)  # no judge: none is needed
    done = await play(
        client,
        app,
        settings,
        t,
        setup.agent_id,
        [
            turn(
                "Where is AB-1?",
                criterion("lookup_order", "tool_called"),
                criterion("lookup_order", "tool_called", expected_arguments={"order_id": "AB-1"}),
                criterion("refund_order", "tool_not_called"),
                criterion("refund_order", "tool_called"),
            ),
            turn(
                "Refund it",
                criterion(
                    "refund_order",
                    "tool_called",
                    expected_arguments={"amount": {"value": 40.0}, "order_id": "AB-1"},
                ),
                criterion(
                    "refund_order",
                    "tool_called",
                    expected_arguments={"amount": {"currency": "USD"}},
                ),
                criterion("refund_order", "tool_called", expected_arguments={"reason": "late"}),
                criterion("refund_order", "tool_not_called"),
                criterion("notify", "tool_called", expected_arguments={}),
            ),
            turn("Thanks", criterion("lookup_order", "tool_not_called")),
        ],
    )
    assert done["status"] == "failed", done
    first, second, third = done["turn_results"]
    # Kept as reported: a call without an output has a null one.
    assert first["tool_calls"] == [LOOKUP]
    assert second["tool_calls"] == [REFUND, {**NO_OUTPUT, "output": None}]
    assert third["tool_calls"] == []
    assert results(first) == [
        ("tool_called", "PASS"),
        ("tool_called", "PASS"),
        ("tool_not_called", "PASS"),
        ("tool_called", "FAIL"),
    ]
    assert results(second) == [
        ("tool_called", "PASS"),
        ("tool_called", "FAIL"),
        ("tool_called", "FAIL"),
        ("tool_not_called", "FAIL"),
        ("tool_called", "PASS"),
    ]
    assert results(third) == [("tool_not_called", "PASS")]
    assert (first["passed"], second["passed"], third["passed"]) == (False, False, True)

    called, with_arguments, not_refunded, refunded = first["criteria_results"]
    assert called["question"] == "lookup_order"
    assert called["critique"] == "lookup_order was called once; calls seen: lookup_order"
    assert called["evidence"] == (
        'lookup_order({"order_id":"AB-1"}) -> {"status":"shipped","total":40}'
    )
    assert with_arguments["critique"].startswith('lookup_order was called with {"order_id":"AB-1"}')
    assert not_refunded["critique"] == "refund_order was not called; calls seen: lookup_order"
    assert refunded["critique"] == "refund_order was not called; calls seen: lookup_order"
    assert refunded["evidence"] == ""

    subset, wrong, missing, not_called, notified = second["criteria_results"]
    assert subset["evidence"] == (
        'refund_order({"amount":{"currency":"EUR","value":40},"order_id":"AB-1"})'
        ' -> "refund R-7 issued"'
    )
    assert wrong["critique"] == (
        'refund_order was called once, never with {"amount":{"currency":"USD"}} (call 1: '
        'amount.currency is "EUR", expected "USD"); calls seen: refund_order, notify'
    )
    assert "(call 1: reason is missing)" in missing["critique"]
    assert (
        not_called["critique"] == "refund_order was called once; calls seen: refund_order, notify"
    )
    assert notified["evidence"] == 'notify({"channel":"email"})'
    # Free checks: no judge was asked, no judge tokens counted.
    every = [c for r in done["turn_results"] for c in r["criteria_results"]]
    assert {(c["input_tokens"], c["output_tokens"]) for c in every} == {(0, 0)}
    assert done["cost_summary"]["judge"]["calls"] == 0
    # The agent is sent the conversation as before: roles and contents, no calls.
    assert agent.requests[1].json["messages"] == [
        {"role": "user", "content": "Where is AB-1?"},
        {"role": "assistant", "content": "Done: Where is AB-1?"},
        {"role": "user", "content": "Refund it"},
    ]


async def test_the_judge_reads_each_replys_tool_calls_also_after_a_resume(
    client: AsyncTestClient, app: Litestar, settings: Settings, judge: FakeOpenAI
) -> None:
    """Turn 1's calls are in the judge's transcript of turn 2 whether turn 1 was played by
    the same delivery or read back from the store by a redelivery."""
    hang = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        if body["message"].startswith("Refund") and not hang.is_set():
            hang.wait(10)  # the first delivery never gets turn 2's answer
        return f"Done: {body['message']}"

    t = await tenant(client)
    with FakeAgent(reply=reply, tool_calls=calls_for) as agent:
        setup = await outbound_setup(client, t, agent.url, judge.url)
        turns = [
            turn("Where is AB-1?", criterion("Did it look the order up?")),
            turn("Refund it", criterion("Did it refund the order?")),
        ]
        scenario = await create_scenario(client, t, turns=turns)
        run = await start_run(client, t, scenario["id"], setup.agent_id)
        first_delivery = asyncio.create_task(
            execute_run(app.state.database, settings, UUID(run["id"]))
        )
        try:
            await agent.requests_received(2, wait_s=10)
            await judge.requests_received(1, wait_s=10)
            first_delivery.cancel()
        finally:
            hang.set()
        with pytest.raises(asyncio.CancelledError):
            await first_delivery
        await execute_run(app.state.database, settings, UUID(run["id"]))
        done = await get_run(client, t, run["id"])
    assert done["status"] == "passed", done

    def prompt(request: Any) -> str:
        return "\n".join(m["content"] for m in request.json["messages"])

    turn1, turn2 = (prompt(r) for r in judge.requests)
    lookup = '  [tool call] lookup_order({"order_id":"AB-1"}) -> {"status":"shipped","total":40}'
    assert TOOL_CALLS_NOTE in turn1 and TOOL_CALLS_NOTE in turn2
    assert f"ASSISTANT: Done: Where is AB-1?\n{lookup}" in turn1
    assert turn1.rstrip().endswith(lookup)
    assert (
        f"ASSISTANT: Done: Where is AB-1?\n{lookup}\nUSER: Refund it\n"
        "ASSISTANT: Done: Refund it\n"
        '  [tool call] refund_order({"amount":{"currency":"EUR","value":40},"order_id":"AB-1"})'
        ' -> "refund R-7 issued"\n'
        '  [tool call] notify({"channel":"email"})'
    ) in turn2


async def test_a_judge_prompt_without_tool_calls_is_as_before(
    client: AsyncTestClient, app: Litestar, settings: Settings, judge: FakeOpenAI
) -> None:
    with FakeAgent(reply="Hello") as agent:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url, judge.url)
        done = await play(client, app, settings, t, setup.agent_id, [turn("Hi", criterion("Ok?"))])
    assert done["status"] == "passed", done
    assert done["turn_results"][0]["tool_calls"] == []
    (request,) = judge.requests
    content = request.json["messages"][-1]["content"]
    assert "[tool call]" not in content and TOOL_CALLS_NOTE not in content
    assert content.endswith("USER: Hi\nASSISTANT: Hello")


@pytest.mark.parametrize(
    ("reported", "problem"),
    [
        ({"name": "lookup_order"}, "tool_calls: expected `array`, got `object`"),
        ([{"name": "lookup_order", "arguments": "AB-1"}], "tool_calls[0].arguments: expected"),
        ([LOOKUP, {"arguments": {}}], "tool_calls[1]: object missing required field `name`"),
    ],
    ids=["not a list", "arguments not an object", "no name"],
)
async def test_malformed_tool_calls_end_the_run_as_an_agent_error(
    client: AsyncTestClient, app: Litestar, settings: Settings, reported: Any, problem: str
) -> None:
    with FakeAgent(reply="Sure.", tool_calls=reported) as agent:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        done = await play(
            client, app, settings, t, setup.agent_id, [turn("Hi", criterion("Sure", "contains"))]
        )
    assert done["status"] == "error", done
    assert done["error_message"].startswith(
        f"agent: agent reply is not of the spar protocol: {problem}"
    ), done["error_message"]
    assert done["turn_results"] == []


SECRET = "tool-secret-0123456789ABCDEF"


async def test_a_credential_inside_tool_calls_is_checked_as_sent_but_kept_redacted(
    client: AsyncTestClient, app: Litestar, settings: Settings, judge: FakeOpenAI
) -> None:
    leaky = [
        {
            "name": "call_billing",
            "arguments": {"api_key": SECRET, "headers": {"Authorization": f"Bearer {SECRET}"}},
            "output": [f"authenticated with {SECRET}", {"echo": SECRET}],
        }
    ]
    with FakeAgent(reply="Billing says hi.", tool_calls=leaky) as agent:
        t = await tenant(client)
        response = await client.put(
            f"/v1/orgs/{t.id}/credentials/billing", json={"value": SECRET}, headers=t.owner.headers
        )
        assert response.status_code == 201, response.text
        await allow_domain(client, t)
        await create_judge_provider(client, t, judge.url)
        made = await create_http_agent(client, t, agent.url)
        done = await play(
            client,
            app,
            settings,
            t,
            made["id"],
            [
                turn(
                    "Bill me",
                    # Checks read the calls as the agent sent them: the key is there.
                    criterion(
                        "call_billing", "tool_called", expected_arguments={"api_key": SECRET}
                    ),
                    criterion("Did it call billing?"),
                )
            ],
        )
    assert done["status"] == "passed", done
    (result,) = done["turn_results"]
    assert result["redacted_keys"] == ["billing"]
    assert result["response_content"] == "Billing says hi."
    assert result["tool_calls"] == [
        {
            "name": "call_billing",
            "arguments": {
                "api_key": "[redacted]",
                "headers": {"Authorization": "Bearer [redacted]"},
            },
            "output": ["authenticated with [redacted]", {"echo": "[redacted]"}],
        }
    ]
    checked = result["criteria_results"][0]
    assert checked["verdict"] == "PASS"
    assert "[redacted]" in checked["critique"] and "[redacted]" in checked["evidence"]
    assert SECRET not in json.dumps(done)
    prompt = json.dumps(judge.requests[-1].json)
    assert SECRET not in prompt and 'call_billing({\\"api_key\\":\\"[redacted]\\"' in prompt


async def test_a_turns_calls_are_capped_but_checked_whole(
    client: AsyncTestClient, app: Litestar, settings: Settings, judge: FakeOpenAI
) -> None:
    many = [{"name": f"step_{n}", "arguments": {"blob": "x" * 10_000}} for n in range(10)]
    with FakeAgent(reply="Did it all.", tool_calls=many) as agent:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url, judge.url)
        done = await play(
            client,
            app,
            settings,
            t,
            setup.agent_id,
            [
                turn(
                    "Go",
                    criterion("step_9", "tool_called"),  # past the cap: seen by the check
                    criterion("Did it do everything?"),
                )
            ],
        )
    assert done["status"] == "passed", done
    stored = done["turn_results"][0]["tool_calls"]
    kept = len(stored) - 1
    assert 0 < kept < 10 and stored[:kept] == [{**c, "output": None} for c in many[:kept]]
    assert stored[-1] == {
        "name": CUT,
        "arguments": {"calls_cut": 10 - kept, "max_bytes": tool_calls.MAX_BYTES},
        "output": None,
    }
    assert len(json.dumps(stored[:kept], separators=(",", ":"))) <= tool_calls.MAX_BYTES
    prompt = judge.requests[-1].json["messages"][-1]["content"]
    assert f"[tool call] [{10 - kept} more tool calls not kept: over 65536 bytes]" in prompt
    assert "step_9" not in prompt


async def test_the_results_page_shows_each_replys_calls_escaped(
    client: AsyncTestClient, app: Litestar, settings: Settings
) -> None:
    reported = [
        {"name": "lookup_order", "arguments": {"order_id": "<b>AB-1</b>"}, "output": "<script>x"},
        NO_OUTPUT,
    ]
    with FakeAgent(reply="Found it.", tool_calls=reported) as agent:
        t = await tenant(client)
        setup = await outbound_setup(client, t, agent.url)
        done = await play(
            client,
            app,
            settings,
            t,
            setup.agent_id,
            [turn("Where?", criterion("x", "tool_called"))],
        )
    page = await client.get(
        f"/ui/orgs/{t.id}/runs/{done['id']}", headers={"Cookie": f"{COOKIE}={t.owner.token}"}
    )
    assert page.status_code == 200, page.text
    html = page.text
    assert "<script>x" not in html and "<b>AB-1</b>" not in html
    assert '<code class="tool-name">lookup_order</code>' in html
    assert "({&#34;order_id&#34;:&#34;&lt;b&gt;AB-1&lt;/b&gt;&#34;})" in html
    assert "&#34;&lt;script&gt;x&#34;" in html
    notify = html[html.index('data-tool="notify"') :]
    assert "&rarr;" not in notify[: notify.index("</li>")]  # no output reported, none shown
    assert "x was not called; calls seen: lookup_order, notify" in html


async def test_a_run_ending_in_error_after_the_reply_keeps_its_calls_on_the_turn(
    client: AsyncTestClient, app: Litestar, settings: Settings, agent: FakeAgent
) -> None:
    t = await tenant(client)
    setup = await outbound_setup(client, t, agent.url)  # no judge for the judged criterion
    done = await play(
        client, app, settings, t, setup.agent_id, [turn("Where is AB-1?", criterion("Ok?"))]
    )
    assert done["status"] == "error" and done["error_message"].startswith("judge:"), done
    assert done["error_turn"] == {
        "turn_index": 0,
        "user_message": "Where is AB-1?",
        "response_content": "Done: Where is AB-1?",
        "tool_calls": [LOOKUP],
    }
    page = await client.get(
        f"/ui/orgs/{t.id}/runs/{done['id']}", headers={"Cookie": f"{COOKIE}={t.owner.token}"}
    )
    ended = page.text[page.text.index('data-error-turn="0"') :]
    assert '<code class="tool-name">lookup_order</code>' in ended


# --- openai_chat agents --------------------------------------------------------------------------


def egress() -> EgressClient:
    policy = EgressPolicy(rules=[DomainRule("127.0.0.1")], allow_private=True)
    return EgressClient(policy, timeout_s=2.0, connect_timeout_s=1.0, backoff_s=0.01)


def openai_agent(url: str) -> AgentConfig:
    return AgentConfig(
        id=uuid4(),
        name="bot",
        kind="http",
        endpoint_url=f"{url}/v1/chat/completions",
        protocol="openai_chat",
    )


async def test_an_openai_chat_agents_tool_calls_are_read_with_their_arguments_parsed() -> None:
    with FakeOpenAI() as fake:
        fake.enqueue(
            Reply(
                json=openai_completion(
                    None,
                    tool_calls=[
                        ("lookup_order", '{"order_id": "AB-1"}'),
                        ("broken", '{"order_id": '),
                    ],
                )
            ),
            Reply(json=openai_completion("Shipped.", tool_calls=[("lookup_order", "{}")])),
        )
        only_calls = await call_agent(
            egress(), openai_agent(fake.url), session_id="s", message="Where?", history=[]
        )
        both = await call_agent(
            egress(), openai_agent(fake.url), session_id="s", message="Where?", history=[]
        )
    assert (only_calls.content, only_calls.refusal) == ("", False)
    assert list(only_calls.tool_calls) == [
        ToolCall(name="lookup_order", arguments={"order_id": "AB-1"}),
        ToolCall(name="broken", arguments={tool_calls.UNPARSED: '{"order_id": '}),
    ]
    assert only_calls.received_tool_calls == only_calls.tool_calls
    assert both.content == "Shipped."
    assert list(both.tool_calls) == [ToolCall(name="lookup_order")]


async def test_malformed_openai_tool_calls_are_an_agent_error() -> None:
    completion = openai_completion(None, tool_calls=[("lookup_order", "{}")])
    completion["choices"][0]["message"]["tool_calls"][0]["function"].pop("name")
    with FakeOpenAI() as fake:
        fake.enqueue(Reply(json=completion))
        with pytest.raises(AgentError) as failed:
            await call_agent(
                egress(), openai_agent(fake.url), session_id="s", message="Where?", history=[]
            )
    assert str(failed.value) == (
        "agent reply is not of the openai_chat protocol: "
        "choices[0].message.tool_calls[0].function.name: expected a string"
    )


# --- the criteria's fields -----------------------------------------------------------------------


def scenarios_path(t: Tenant, scenario_id: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/scenarios"
    return base if scenario_id is None else f"{base}/{scenario_id}"


async def test_expected_arguments_are_stored_read_back_and_replaced(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    expected = {"order_id": "AB-1", "amount": {"value": 40}, "items": [1, 2], "express": True}
    created = await create_scenario(
        client,
        t,
        turns=[
            turn(
                "Refund it",
                criterion("refund_order", "tool_called", expected_arguments=expected),
                criterion("refund_order", "tool_called", expected_arguments=None),
                criterion("cancel_order", "tool_not_called"),
                criterion("Hello", "contains"),
            )
        ],
    )
    criteria = created["turns"][0]["criteria"]
    assert [c["expected_arguments"] for c in criteria] == [expected, None, None, None]
    assert [c["criteria_type"] for c in criteria] == [
        "tool_called",
        "tool_called",
        "tool_not_called",
        "contains",
    ]
    response = await client.get(scenarios_path(t, created["id"]), headers=t.owner.headers)
    assert response.json() == created
    response = await client.put(
        scenarios_path(t, created["id"]),
        json={
            "turns": [
                turn(
                    "Refund", criterion("refund_order", "tool_called", expected_arguments={"n": 1})
                )
            ]
        },
        headers=t.owner.headers,
    )
    assert response.status_code == 200, response.text
    assert response.json()["turns"][0]["criteria"][0]["expected_arguments"] == {"n": 1}


async def test_bad_expected_arguments_answer_422_and_save_nothing(
    client: AsyncTestClient, db: AsyncSession
) -> None:
    t = await tenant(client)
    existing = await create_scenario(client, t)
    loc = ["body", "turns", "0", "criteria", "0", "expected_arguments"]
    too_big = {"blob": "x" * MAX_EXPECTED_ARGUMENTS_BYTES}
    cases: list[tuple[str, dict[str, Any], str, Any, dict[str, Any]]] = [
        (
            "on another type",
            criterion("refund_order", "tool_not_called", expected_arguments={"a": 1}),
            "value_error",
            {"a": 1},
            {},
        ),
        (
            "on a contains check",
            criterion("refund", "contains", expected_arguments={}),
            "value_error",
            {},
            {},
        ),
        (
            "not an object",
            criterion("refund_order", "tool_called", expected_arguments=["order_id"]),
            "value_error",  # msgspec's "Expected `object | null`, got `array`"
            ["order_id"],
            {},
        ),
        (
            "too large",
            criterion("refund_order", "tool_called", expected_arguments=too_big),
            "too_long",
            None,
            {"max_length": MAX_EXPECTED_ARGUMENTS_BYTES},
        ),
    ]
    problems = []
    for name, bad, kind, given, ctx in cases:
        for method, path in (
            ("POST", scenarios_path(t)),
            ("PUT", scenarios_path(t, existing["id"])),
        ):
            body = {"name": "bad", "turns": [turn("Hi", bad)]}
            response = await client.request(method, path, json=body, headers=t.owner.headers)
            if response.status_code != 422:
                problems.append(f"{name} {method}: {response.status_code} {response.text[:200]}")
                continue
            (entry,) = response.json()["detail"]
            got = (entry["loc"], entry["type"], entry["input"], entry["ctx"])
            if got != (loc, kind, given, ctx) or not entry["msg"]:
                problems.append(f"{name} {method}: {entry}")
    assert not problems, "\n".join(problems)
    nul_key = criterion("refund_order", "tool_called", expected_arguments={"a\u0000": 1})
    response = await client.post(
        scenarios_path(t),
        json={"name": "bad", "turns": [turn("Hi", nul_key)]},
        headers=t.owner.headers,
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == [*loc, "a\u0000"]
    # Nothing was created, nothing changed.
    listed = await client.get(scenarios_path(t), headers=t.owner.headers)
    assert listed.json()["total"] == 1
    again = await client.get(scenarios_path(t, existing["id"]), headers=t.owner.headers)
    assert again.json() == existing
    # The schema says the same: no expected arguments on another type.
    with pytest.raises(Exception, match="ck_criteria_expected_arguments_of_tool_called"):
        await db.execute(
            text(
                "UPDATE criteria SET expected_arguments = '{}'::jsonb"
                " WHERE criteria_type = 'contains'"
            )
        )
