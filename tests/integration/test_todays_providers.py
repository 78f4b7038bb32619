"""Today's providers (issue 23, item 4), against loopback fakes that answer with the
official SDKs' types and refuse what today's models refuse:

* OpenAI's reasoning models (o-series, gpt-5) refuse ``max_tokens`` and ``temperature``:
  they get ``max_completion_tokens`` and no temperature, as agent and as judge; a
  provider's ``request_options`` are merged into every request body;
* Anthropic's 529 ``overloaded_error`` is retried, and ``retry-after-ms`` waited in full
  (which statuses are retried and how every wait is read: test_egress.py);
* a refusal is recorded as the reply, marked as a refusal, not as an empty reply;
* the timeout bounds the whole call, every attempt and wait included;
* the Anthropic API version is a provider setting, and the judge's verdict comes from
  Anthropic's structured output where the model offers it (``output_config.format``),
  else from a forced tool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import anthropic as anthropic_sdk
import openai as openai_sdk
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from api.ui.session import COOKIE
from shared.llm.clients import chat
from shared.llm.judge import VERDICT_SCHEMA, JudgeError, judge
from shared.outbound import configuration
from shared.outbound.agents import AgentConfig, call_agent
from shared.outbound.egress import (
    DomainRule,
    EgressClient,
    EgressPolicy,
    EgressTransportError,
    ProviderConfig,
)
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.factories import Tenant, tenant
from tests.support.fakes import (
    FakeAnthropic,
    FakeOpenAI,
    Reply,
    anthropic_error,
    anthropic_message,
    openai_completion,
)
from tests.support.scenario_setup import (
    allow_domain,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    start_run,
    turn,
)

API_KEY = "sk-test-0123456789"
HISTORY = [{"role": "user", "content": "Can I move my booking to Friday?"}]
VERDICT = {"verdict": "PASS", "critique": "It offers Friday.", "evidence": "Friday"}
REFUSAL = "I'm sorry, but I can't help with that request."
REASONING_MODELS = ["o1", "o3", "o3-mini", "o4-mini", "gpt-5", "gpt-5-mini", "gpt-5.1"]
# Claude models after Opus 4.6 (no temperature, no forced tool); models before
# structured outputs (Claude 3.x, 4.0, 4.1).
CURRENT_CLAUDE = ["claude-opus-4-7", "claude-sonnet-5", "claude-fable-5"]
LEGACY_CLAUDE = ["claude-3-5-haiku-20241022", "claude-sonnet-4-20250514", "claude-opus-4-1"]


def make_egress(**options: Any) -> EgressClient:
    """Loopback allowed (the fakes), test-sized timeouts and backoff."""
    settings: dict[str, Any] = {"timeout_s": 2.0, "connect_timeout_s": 1.0, "backoff_s": 0.01}
    settings.update(options)
    policy = EgressPolicy(rules=[DomainRule("127.0.0.1")], allow_private=True)
    return EgressClient(policy, **settings)


def provider_for(kind: str, base_url: str, model: str, **fields: Any) -> ProviderConfig:
    return ProviderConfig(
        id=uuid4(),
        provider=kind,
        base_url=base_url,
        default_model=model,
        api_key=API_KEY,
        **fields,
    )


def llm_agent(provider: ProviderConfig) -> AgentConfig:
    return AgentConfig(id=uuid4(), name="llm bot", kind="llm", provider=provider)


@pytest.fixture
def openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(
        reply=json.dumps(VERDICT), reasoning_models=[*REASONING_MODELS, "deep-thinker-1"]
    ) as fake:
        yield fake


@pytest.fixture
def claude() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(
        reply=json.dumps(VERDICT), current_models=CURRENT_CLAUDE, legacy_models=LEGACY_CLAUDE
    ) as fake:
        yield fake


# --- the fakes speak what the official SDKs read -------------------------------------------------


async def test_the_official_sdks_read_the_fakes_answers(
    openai: FakeOpenAI, claude: FakeAnthropic
) -> None:
    openai.enqueue(Reply(json=openai_completion(None, refusal=REFUSAL)))
    claude.enqueue(Reply(status=529, json=anthropic_error("overloaded_error", "Overloaded")))
    openai_client = openai_sdk.AsyncOpenAI(api_key=API_KEY, base_url=f"{openai.url}/v1")
    anthropic_client = anthropic_sdk.AsyncAnthropic(
        api_key=API_KEY, base_url=claude.url, max_retries=0
    )

    completion = await openai_client.chat.completions.create(model="gpt-4o", messages=HISTORY)
    assert (completion.choices[0].message.content, completion.choices[0].message.refusal) == (
        None,
        REFUSAL,
    )
    with pytest.raises(anthropic_sdk.APIStatusError) as overloaded:
        await anthropic_client.messages.create(
            model="claude-opus-4-7", max_tokens=64, messages=HISTORY
        )
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"
    message = await anthropic_client.messages.create(
        model="claude-opus-4-7", max_tokens=64, messages=HISTORY
    )
    assert message.content[0].type == "text"
    with pytest.raises(openai_sdk.BadRequestError, match="max_completion_tokens"):
        await openai_client.chat.completions.create(model="o3", messages=HISTORY, max_tokens=10)


# --- OpenAI's reasoning models -------------------------------------------------------------------


@pytest.mark.parametrize("model", REASONING_MODELS)
async def test_a_reasoning_model_gets_max_completion_tokens_and_no_temperature(
    openai: FakeOpenAI, model: str
) -> None:
    provider = provider_for("openai", f"{openai.url}/v1", model)

    result = await chat(make_egress(), provider, HISTORY, system="Be brief.")

    assert json.loads(result.content) == VERDICT
    [body] = [r.json for r in openai.requests]
    assert "max_tokens" not in body and "temperature" not in body
    assert body["max_completion_tokens"] >= 1024  # reasoning tokens count in it too


@pytest.mark.parametrize("model", ["gpt-4o-mini", "gpt-4.1", "gpt-5-chat-latest", "llama3.1"])
async def test_other_models_keep_max_tokens_and_temperature_zero(
    openai: FakeOpenAI, model: str
) -> None:
    await chat(make_egress(), provider_for("openai_compatible", f"{openai.url}/v1", model), HISTORY)

    [body] = [r.json for r in openai.requests]
    assert (body["max_tokens"], body["temperature"]) == (1024, 0.0)
    assert "max_completion_tokens" not in body


@pytest.mark.parametrize("model", ["o3-mini", "gpt-5"])
async def test_a_reasoning_model_can_be_the_judge_and_an_llm_agent(
    openai: FakeOpenAI, model: str
) -> None:
    provider = provider_for("openai", f"{openai.url}/v1", model)
    egress = make_egress()

    verdict = await judge(egress, provider, question="Offers Friday?", conversation=HISTORY)
    reply = await call_agent(egress, llm_agent(provider), session_id="s", message="Hi", history=[])

    assert verdict.verdict == "PASS"
    assert json.loads(reply.content) == VERDICT
    judged, answered = (r.json for r in openai.requests)
    assert judged["response_format"]["type"] == "json_schema"
    for body in (judged, answered):
        assert "max_tokens" not in body and "temperature" not in body


async def test_request_options_are_merged_into_every_body(openai: FakeOpenAI) -> None:
    """Options add fields, replace Spar's defaults, and a null removes a default (a
    reasoning model Spar does not know yet); Spar's own fields stay Spar's."""
    provider = provider_for(
        "openai_compatible",
        f"{openai.url}/v1",
        "deep-thinker-1",  # a reasoning model under a name Spar does not know
        request_options={
            "max_tokens": None,
            "temperature": None,
            "max_completion_tokens": 4096,
            "reasoning_effort": "low",
            "metadata": {"team": "support"},
        },
    )

    result = await judge(make_egress(), provider, question="Offers Friday?", conversation=HISTORY)

    assert result.verdict == "PASS"
    [body] = [r.json for r in openai.requests]
    assert body["max_completion_tokens"] == 4096
    assert (body["reasoning_effort"], body["metadata"]) == ("low", {"team": "support"})
    assert "max_tokens" not in body and "temperature" not in body
    assert body["model"] == "deep-thinker-1"
    assert body["response_format"]["json_schema"]["schema"] == VERDICT_SCHEMA


# --- retries --------------------------------------------------------------------------------------


async def test_anthropic_overloaded_529_is_retried(claude: FakeAnthropic) -> None:
    claude.enqueue(
        Reply(status=529, json=anthropic_error("overloaded_error", "Overloaded")),
        Reply(status=529, json=anthropic_error("overloaded_error", "Overloaded")),
    )

    result = await chat(
        make_egress(), provider_for("anthropic", claude.url, "claude-opus-4-7"), HISTORY
    )

    assert json.loads(result.content) == VERDICT
    assert len(claude.requests) == 3


async def test_retry_after_ms_is_waited_in_full(claude: FakeAnthropic) -> None:
    """1.5 s asked means at least 1.5 s between the two requests (a real wait, once)."""
    claude.enqueue(
        Reply(
            status=429,
            json=anthropic_error(
                "rate_limit_error", "Number of requests has exceeded your rate limit"
            ),
            headers={"retry-after-ms": "1500"},
        )
    )
    provider = provider_for("anthropic", claude.url, "claude-opus-4-7")

    await chat(make_egress(timeout_s=5.0, backoff_s=0.01), provider, HISTORY)

    first, second = claude.requests
    assert second.received_at - first.received_at >= 1.5


# --- the timeout bounds the whole call ------------------------------------------------------------


async def test_a_hung_provider_call_ends_within_the_timeout(openai: FakeOpenAI) -> None:
    openai.enqueue(Reply(json=openai_completion("late"), delay=10))
    provider = provider_for("openai", f"{openai.url}/v1", "gpt-4o")

    started = time.monotonic()
    with pytest.raises(EgressTransportError, match="timed out"):
        await chat(make_egress(timeout_s=0.6, max_attempts=3), provider, HISTORY)
    elapsed = time.monotonic() - started

    assert elapsed < 0.6 + 0.3, elapsed  # per attempt it would be 3 x 0.6 s and backoff
    assert len(openai.requests) == 1


# --- refusals -------------------------------------------------------------------------------------


async def test_an_openai_refusal_is_the_reply_marked_as_a_refusal(openai: FakeOpenAI) -> None:
    openai.enqueue(Reply(json=openai_completion(None, refusal=REFUSAL)))

    result = await chat(
        make_egress(), provider_for("openai", f"{openai.url}/v1", "gpt-4o"), HISTORY
    )

    assert (result.content, result.refusal) == (REFUSAL, True)


async def test_an_anthropic_refusal_is_marked_as_a_refusal(claude: FakeAnthropic) -> None:
    claude.enqueue(Reply(json=anthropic_message("I can't help with that.", stop_reason="refusal")))

    result = await chat(
        make_egress(), provider_for("anthropic", claude.url, "claude-opus-4-7"), HISTORY
    )

    assert (result.content, result.refusal) == ("I can't help with that.", True)


@pytest.mark.parametrize("kind", ["llm", "openai_chat"])
async def test_an_agent_that_refuses_replies_with_its_refusal(
    openai: FakeOpenAI, kind: str
) -> None:
    openai.enqueue(Reply(json=openai_completion(None, refusal=REFUSAL)))
    if kind == "llm":
        agent = llm_agent(provider_for("openai", f"{openai.url}/v1", "gpt-4o"))
    else:
        agent = AgentConfig(
            id=uuid4(),
            name="bot",
            kind="http",
            protocol="openai_chat",
            endpoint_url=f"{openai.url}/v1/chat/completions",
        )

    reply = await call_agent(make_egress(), agent, session_id="s", message="Hi", history=[])

    assert (reply.content, reply.refusal) == (REFUSAL, True)


async def test_a_judge_that_refuses_is_an_error_that_says_so(openai: FakeOpenAI) -> None:
    openai.enqueue(*[Reply(json=openai_completion(None, refusal=REFUSAL))] * 2)

    with pytest.raises(JudgeError, match="refused"):
        await judge(
            make_egress(),
            provider_for("openai", f"{openai.url}/v1", "gpt-4o"),
            question="Polite?",
            conversation=HISTORY,
        )


# --- Anthropic: API version, temperature, structured output --------------------------------------


async def test_the_anthropic_version_is_the_providers(claude: FakeAnthropic) -> None:
    default = provider_for("anthropic", claude.url, "claude-opus-4-7")
    pinned = provider_for(
        "anthropic", claude.url, "claude-opus-4-7", anthropic_version="2024-10-22"
    )

    await chat(make_egress(), default, HISTORY)
    await chat(make_egress(), pinned, HISTORY)

    assert [r.header("anthropic-version") for r in claude.requests] == ["2023-06-01", "2024-10-22"]


@pytest.mark.parametrize("model", CURRENT_CLAUDE)
async def test_current_claude_models_judge_with_structured_output(
    claude: FakeAnthropic, model: str
) -> None:
    provider = provider_for("anthropic", claude.url, model)

    result = await judge(make_egress(), provider, question="Offers Friday?", conversation=HISTORY)

    assert (result.verdict, result.critique) == ("PASS", VERDICT["critique"])
    [body] = [r.json for r in claude.requests]
    assert body["output_config"]["format"] == {"type": "json_schema", "schema": VERDICT_SCHEMA}
    assert "temperature" not in body and "tools" not in body


@pytest.mark.parametrize("model", LEGACY_CLAUDE)
async def test_older_claude_models_judge_through_a_forced_tool(
    claude: FakeAnthropic, model: str
) -> None:
    provider = provider_for("anthropic", claude.url, model)

    result = await judge(make_egress(), provider, question="Offers Friday?", conversation=HISTORY)

    assert (result.verdict, result.evidence) == ("PASS", VERDICT["evidence"])
    [body] = [r.json for r in claude.requests]
    [tool] = body["tools"]
    assert tool["input_schema"] == VERDICT_SCHEMA
    assert body["tool_choice"] == {"type": "tool", "name": tool["name"]}
    assert "output_config" not in body
    assert body["temperature"] == 0.0


async def test_anthropic_request_options_keep_spars_output_format(claude: FakeAnthropic) -> None:
    provider = provider_for(
        "anthropic",
        claude.url,
        "claude-sonnet-5",
        request_options={"output_config": {"effort": "low"}, "max_tokens": 2048},
    )

    await judge(make_egress(), provider, question="Offers Friday?", conversation=HISTORY)

    [body] = [r.json for r in claude.requests]
    assert body["output_config"]["effort"] == "low"
    assert body["output_config"]["format"]["schema"] == VERDICT_SCHEMA
    assert body["max_tokens"] == 2048


# --- the API: request_options and anthropic_version on providers ---------------------------------


OPTIONS = ["body", "request_options"]


def providers(t: Tenant, provider_id: str | None = None) -> str:
    base = f"/v1/orgs/{t.id}/llm-providers"
    return base if provider_id is None else f"{base}/{provider_id}"


async def test_provider_settings_are_created_read_and_patched(client: AsyncTestClient) -> None:
    t = await tenant(client)
    created = await client.post(
        providers(t),
        json={
            "name": "reasoning",
            "provider": "openai",
            "default_model": "o3",
            "request_options": {"reasoning_effort": "high", "temperature": None},
        },
        headers=t.owner.headers,
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["request_options"] == {"reasoning_effort": "high", "temperature": None}
    assert body["anthropic_version"] is None
    claude = await client.post(
        providers(t),
        json={"name": "claude", "provider": "anthropic", "default_model": "claude-opus-4-7"},
        headers=t.owner.headers,
    )
    assert claude.status_code == 201, claude.text
    assert (claude.json()["anthropic_version"], claude.json()["request_options"]) == (
        "2023-06-01",
        {},
    )

    patched = await client.patch(
        providers(t, claude.json()["id"]),
        json={"anthropic_version": "2024-10-22", "request_options": {"max_tokens": 4096}},
        headers=t.owner.headers,
    )
    assert patched.status_code == 200, patched.text
    read = await client.get(providers(t, claude.json()["id"]), headers=t.owner.headers)
    assert read.json()["anthropic_version"] == "2024-10-22"
    assert read.json()["request_options"] == {"max_tokens": 4096}
    reset = await client.patch(
        providers(t, claude.json()["id"]),
        json={"anthropic_version": None},
        headers=t.owner.headers,
    )
    assert reset.json()["anthropic_version"] == "2023-06-01"


@pytest.mark.parametrize(
    ("fields", "loc", "kind"),
    [
        ({"request_options": ["max_tokens", 5]}, ["body", "request_options"], "object_type"),
        ({"request_options": "max_tokens=5"}, ["body", "request_options"], "object_type"),
        ({"request_options": {"model": "gpt-4o"}}, [*OPTIONS, "model"], "value_error"),
        ({"request_options": {"messages": []}}, [*OPTIONS, "messages"], "value_error"),
        ({"request_options": {"stream": True}}, [*OPTIONS, "stream"], "value_error"),
        (
            {"request_options": {"response_format": {}}},
            [*OPTIONS, "response_format"],
            "value_error",
        ),
        ({"request_options": {"pad": "x" * 20_000}}, ["body", "request_options"], "too_long"),
        (
            {"request_options": {"bad\u0000key": 1}},
            [*OPTIONS, "bad\u0000key"],
            "string_pattern_mismatch",
        ),
        ({"anthropic_version": "2023-06-01"}, ["body", "anthropic_version"], "value_error"),
        (
            {"provider": "anthropic", "anthropic_version": "june"},
            ["body", "anthropic_version"],
            "string_pattern_mismatch",
        ),
        (
            {"provider": "anthropic", "request_options": {"output_config": {"format": {}}}},
            [*OPTIONS, "output_config", "format"],
            "value_error",
        ),
    ],
    ids=[
        "list",
        "string",
        "model",
        "messages",
        "stream",
        "response_format",
        "too-large",
        "nul-key",
        "version-on-openai",
        "bad-version",
        "output-format",
    ],
)
async def test_invalid_provider_settings_are_422_and_nothing_is_stored(
    client: AsyncTestClient, fields: dict[str, Any], loc: list[str], kind: str
) -> None:
    t = await tenant(client)
    body = {"name": "p", "provider": "openai", "default_model": "o3", **fields}

    response = await client.post(providers(t), json=body, headers=t.owner.headers)

    assert response.status_code == 422, response.text
    [entry] = response.json()["detail"]
    assert (entry["loc"], entry["type"]) == (loc, kind)
    assert set(entry) == {"loc", "msg", "type", "input", "ctx"}
    listed = await client.get(providers(t), headers=t.owner.headers)
    assert listed.json()["total"] == 0


async def test_switching_a_provider_away_from_anthropic_needs_its_version_cleared(
    client: AsyncTestClient,
) -> None:
    t = await tenant(client)
    made = await client.post(
        providers(t),
        json={"name": "c", "provider": "anthropic", "default_model": "claude-opus-4-7"},
        headers=t.owner.headers,
    )
    path = providers(t, made.json()["id"])

    refused = await client.patch(path, json={"provider": "openai"}, headers=t.owner.headers)
    switched = await client.patch(
        path, json={"provider": "openai", "anthropic_version": None}, headers=t.owner.headers
    )

    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "anthropic_version"]
    assert switched.status_code == 200, switched.text
    assert switched.json()["anthropic_version"] is None


async def test_provider_settings_from_the_api_reach_the_provider(
    client: AsyncTestClient, app: Litestar, settings: Settings, claude: FakeAnthropic
) -> None:
    t = await tenant(client)
    await allow_domain(client, t)
    made = await client.post(
        providers(t),
        json={
            "name": "claude",
            "provider": "anthropic",
            "base_url": claude.url,
            "default_model": "claude-opus-4-7",
            "anthropic_version": "2024-10-22",
            "request_options": {"metadata": {"user_id": "spar"}},
        },
        headers=t.owner.headers,
    )
    assert made.status_code == 201, made.text

    async with app.state.database.transaction() as session:
        provider = await configuration.load_provider(
            session, settings=settings, org_id=UUID(t.id), provider_id=UUID(made.json()["id"])
        )
        policy = await configuration.load_egress_policy(
            session, settings=settings, org_id=UUID(t.id)
        )
    await chat(EgressClient(policy, timeout_s=2.0), provider, HISTORY)

    [received] = claude.requests
    assert received.header("anthropic-version") == "2024-10-22"
    assert received.json["metadata"] == {"user_id": "spar"}


# --- a run: the refusal is the turn's reply, marked ---------------------------------------------


async def test_a_refusing_llm_agent_records_its_refusal_as_the_reply(
    client: AsyncTestClient, app: Litestar, settings: Settings, openai: FakeOpenAI
) -> None:
    t = await tenant(client)
    await allow_domain(client, t)
    provider = await create_judge_provider(client, t, openai.url, default_model="gpt-4o")
    agent = await client.post(
        f"/v1/orgs/{t.id}/agents",
        json={"name": "bot", "kind": "llm", "llm_provider_id": provider["id"]},
        headers=t.owner.headers,
    )
    assert agent.status_code == 201, agent.text
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn("Tell me something forbidden.", criterion("can't help", "contains")),
            turn("And now?", criterion("PASS", "contains")),
        ],
    )
    openai.enqueue(Reply(json=openai_completion(None, refusal=REFUSAL)))

    run = await start_run(client, t, scenario["id"], agent.json()["id"])
    await execute_run(app.state.database, settings, UUID(run["id"]))
    final = await get_run(client, t, run["id"])

    assert final["status"] == "passed", final
    refused, answered = final["turn_results"]
    assert (refused["response_content"], refused["refusal"], refused["passed"]) == (
        REFUSAL,
        True,
        True,
    )
    assert (answered["refusal"], answered["passed"]) == (False, True)

    # The results page marks the refusal, on the turn that was refused only.
    page = await client.get(
        f"/ui/orgs/{t.id}/runs/{run['id']}", headers={"Cookie": f"{COOKIE}={t.owner.token}"}
    )
    assert page.status_code == 200, page.text
    first, second = page.text.split('data-turn="1"')
    assert "data-refusal" in first and "help with that request." in first
    assert "data-refusal" not in second
