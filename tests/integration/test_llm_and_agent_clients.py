"""LLM chat and agent calls over the egress client, against loopback fakes of OpenAI,
Anthropic and a ``spar``-protocol agent (DESIGN §5.1); then the whole path from the REST
API through the database: the fakes receive the decrypted credential the API never shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from shared.llm.clients import ANTHROPIC_VERSION, LLMError, chat
from shared.outbound import configuration as services
from shared.outbound.agents import AgentConfig, AgentError, call_agent
from shared.outbound.egress import (
    DomainRule,
    EgressClient,
    EgressPolicy,
    HostNotAllowed,
    ProviderConfig,
)
from shared.settings import Settings
from tests.support.factories import tenant
from tests.support.fakes import (
    FakeAgent,
    FakeAnthropic,
    FakeOpenAI,
    Reply,
    openai_completion,
)

API_KEY = "sk-test-0123456789"
SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["PASS", "FAIL"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}
HISTORY = [
    {"role": "user", "content": "Hi, I want to change my booking."},
    {"role": "assistant", "content": "Sure, what is the booking number?"},
]


def make_egress(**options: Any) -> EgressClient:
    """Loopback allowed (the fakes), test-sized timeouts and backoff."""
    settings: dict[str, Any] = {"timeout_s": 1.0, "connect_timeout_s": 1.0, "backoff_s": 0.01}
    settings.update(options)
    policy = EgressPolicy(rules=[DomainRule("127.0.0.1")], allow_private=True)
    return EgressClient(policy, **settings)


def provider_for(
    kind: str, base_url: str, *, api_key: str | None = API_KEY, model: str = "model-default"
) -> ProviderConfig:
    return ProviderConfig(
        id=uuid4(), provider=kind, base_url=base_url, default_model=model, api_key=api_key
    )


@pytest.fixture
def openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply="Hello from OpenAI", prompt_tokens=21, completion_tokens=4) as fake:
        yield fake


@pytest.fixture
def anthropic() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(reply="Hello from Claude", input_tokens=31, output_tokens=6) as fake:
        yield fake


@pytest.fixture
def agent_server() -> Iterator[FakeAgent]:
    def answer(body: dict[str, Any]) -> str:
        return f"you said: {body['message']}"

    with FakeAgent(reply=answer, usage=(40, 9)) as fake:
        yield fake


# --- chat(): OpenAI and compatibles -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "openai_compatible"])
async def test_openai_chat_completion(openai: FakeOpenAI, kind: str) -> None:
    provider = provider_for(kind, f"{openai.url}/v1")

    result = await chat(
        make_egress(),
        provider,
        [{"role": "user", "content": "Say hello"}],
        system="You are terse.",
        max_tokens=50,
        temperature=0.2,
    )

    assert result.content == "Hello from OpenAI"
    assert (result.input_tokens, result.output_tokens) == (21, 4)
    assert result.model == "model-default"
    assert result.latency_ms > 0
    [received] = openai.requests
    assert (received.method, received.path) == ("POST", "/v1/chat/completions")
    assert received.header("authorization") == f"Bearer {API_KEY}"
    assert received.header("content-type") == "application/json"
    assert received.json == {
        "model": "model-default",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"},
        ],
        "temperature": 0.2,
        "max_tokens": 50,
    }


async def test_openai_model_override_trailing_slash_and_no_key(openai: FakeOpenAI) -> None:
    provider = provider_for("openai_compatible", f"{openai.url}/v1/", api_key=None)

    result = await chat(make_egress(), provider, HISTORY, model="override-model")

    assert result.model == "override-model"
    [received] = openai.requests
    assert received.path == "/v1/chat/completions"
    assert received.header("authorization") is None
    assert received.json["model"] == "override-model"
    assert received.json["messages"] == HISTORY  # no system message when none given
    assert "response_format" not in received.json


async def test_openai_json_schema_asks_for_structured_output(openai: FakeOpenAI) -> None:
    openai.reply = lambda body: json.dumps({"verdict": "PASS"})

    result = await chat(
        make_egress(),
        provider_for("openai", f"{openai.url}/v1"),
        [{"role": "user", "content": "Judge this."}],
        json_schema=SCHEMA,
    )

    assert json.loads(result.content) == {"verdict": "PASS"}
    response_format = openai.requests[0].json["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["schema"] == SCHEMA
    assert response_format["json_schema"]["name"]


async def test_openai_retries_a_503_then_answers(openai: FakeOpenAI) -> None:
    openai.enqueue(Reply(status=503, json={"error": {"message": "overloaded"}}))

    result = await chat(make_egress(), provider_for("openai", f"{openai.url}/v1"), HISTORY)

    assert result.content == "Hello from OpenAI"
    assert len(openai.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_openai_client_errors_raise_llm_error_without_retry(
    openai: FakeOpenAI, status: int
) -> None:
    openai.enqueue(
        Reply(status=status, json={"error": {"message": f"Incorrect API key: {API_KEY}"}})
    )

    with pytest.raises(LLMError) as failed:
        await chat(make_egress(), provider_for("openai", f"{openai.url}/v1"), HISTORY)

    message = str(failed.value)
    assert f"HTTP {status}" in message
    assert API_KEY not in message  # an echoed key is redacted
    assert "[redacted]" in message
    assert len(openai.requests) == 1


async def test_a_key_echoed_near_the_end_of_a_long_error_is_not_leaked(
    openai: FakeOpenAI,
) -> None:
    """The error message keeps the first 300 characters of the body; redacting *after*
    cutting leaves the part of the key before the cut in the message."""
    key = "sk-proj-" + "A1b2C3d4E5" * 4  # 48 characters, like a real project key
    prefix = '{"error": {"message": "' + "x" * 240 + " key "  # the key starts at 268
    openai.enqueue(Reply(status=401, body=prefix + key + '"}}'))

    with pytest.raises(LLMError) as failed:
        await chat(make_egress(), provider_for("openai", f"{openai.url}/v1", api_key=key), HISTORY)

    assert "HTTP 401" in str(failed.value)
    assert key[:24] not in str(failed.value)


async def test_openai_persistent_5xx_raises_llm_error_after_retries(openai: FakeOpenAI) -> None:
    openai.enqueue(*[Reply(status=500, json={"error": "boom"})] * 3)

    with pytest.raises(LLMError, match="HTTP 500"):
        await chat(make_egress(max_attempts=3), provider_for("openai", f"{openai.url}/v1"), HISTORY)

    assert len(openai.requests) == 3


@pytest.mark.parametrize(
    "reply",
    [
        Reply(body="<html>Bad gateway</html>"),
        Reply(json={"id": "x", "object": "chat.completion"}),
        Reply(json={"choices": []}),
        Reply(json={"choices": [{"index": 0}]}),
        Reply(json=["not", "an", "object"]),
    ],
    ids=["not-json", "no-choices", "empty-choices", "no-message", "array"],
)
async def test_openai_garbage_raises_llm_error(openai: FakeOpenAI, reply: Reply) -> None:
    openai.enqueue(reply)

    with pytest.raises(LLMError):
        await chat(make_egress(), provider_for("openai", f"{openai.url}/v1"), HISTORY)


async def test_chat_is_subject_to_the_allow_list(openai: FakeOpenAI) -> None:
    egress = EgressClient(
        EgressPolicy(rules=[DomainRule("api.openai.com")], allow_private=True), timeout_s=1.0
    )

    with pytest.raises(HostNotAllowed, match=r"127\.0\.0\.1"):
        await chat(egress, provider_for("openai", f"{openai.url}/v1"), HISTORY)

    assert openai.requests == []


# --- chat(): Anthropic ---------------------------------------------------------------------------


async def test_anthropic_message(anthropic: FakeAnthropic) -> None:
    """A model that takes a temperature (up to Claude 4.6) is sent 0; the later ones,
    none (tests/integration/test_todays_providers.py)."""
    provider = provider_for("anthropic", anthropic.url, model="claude-3-5-haiku-latest")

    result = await chat(
        make_egress(), provider, HISTORY, system="You are a travel agent.", max_tokens=99
    )

    assert result.content == "Hello from Claude"
    assert (result.input_tokens, result.output_tokens) == (31, 6)
    assert result.model == "claude-3-5-haiku-latest"
    [received] = anthropic.requests
    assert (received.method, received.path) == ("POST", "/v1/messages")
    assert received.header("x-api-key") == API_KEY
    assert received.header("anthropic-version") == ANTHROPIC_VERSION == "2023-06-01"
    assert received.header("authorization") is None
    assert received.json == {
        "model": "claude-3-5-haiku-latest",
        "max_tokens": 99,
        "temperature": 0.0,
        "messages": HISTORY,
        "system": "You are a travel agent.",
    }


async def test_anthropic_joins_text_blocks(anthropic: FakeAnthropic) -> None:
    anthropic.enqueue(
        Reply(
            json={
                "type": "message",
                "content": [
                    {"type": "text", "text": "Hello, "},
                    {"type": "tool_use", "id": "t1", "name": "x", "input": {}},
                    {"type": "text", "text": "world"},
                ],
                "usage": {"input_tokens": 1, "output_tokens": 2},
            }
        )
    )

    result = await chat(make_egress(), provider_for("anthropic", anthropic.url), HISTORY)

    assert result.content == "Hello, world"


async def test_anthropic_error_raises_llm_error(anthropic: FakeAnthropic) -> None:
    anthropic.enqueue(
        Reply(status=401, json={"type": "error", "error": {"type": "authentication_error"}})
    )

    with pytest.raises(LLMError, match="HTTP 401"):
        await chat(make_egress(), provider_for("anthropic", anthropic.url), HISTORY)


@pytest.mark.parametrize(
    "reply",
    [
        Reply(body="upstream connect error"),
        Reply(json={"type": "message"}),
        Reply(json={"type": "message", "content": "just a string"}),
    ],
    ids=["not-json", "no-content", "content-not-blocks"],
)
async def test_anthropic_garbage_raises_llm_error(anthropic: FakeAnthropic, reply: Reply) -> None:
    anthropic.enqueue(reply)

    with pytest.raises(LLMError):
        await chat(make_egress(), provider_for("anthropic", anthropic.url), HISTORY)


# --- call_agent() ----------------------------------------------------------------------------


def http_agent(url: str, protocol: str = "spar", **fields: Any) -> AgentConfig:
    return AgentConfig(
        id=uuid4(), name="booking-bot", kind="http", endpoint_url=url, protocol=protocol, **fields
    )


async def test_spar_protocol_agent(agent_server: FakeAgent) -> None:
    agent = http_agent(f"{agent_server.url}/agent/chat")

    reply = await call_agent(
        make_egress(),
        agent,
        session_id="sess-42",
        message="It is ABC123.",
        history=HISTORY,
        customer_context={"name": "Ada", "booking": {"id": "ABC123"}},
        metadata={"scenario_run_id": "run-1", "turn": 2},
    )

    assert reply.content == "you said: It is ABC123."
    assert (reply.input_tokens, reply.output_tokens) == (40, 9)
    assert reply.latency_ms > 0
    [received] = agent_server.requests
    assert (received.method, received.path) == ("POST", "/agent/chat")
    assert received.json == {
        "session_id": "sess-42",
        "message": "It is ABC123.",
        "messages": [*HISTORY, {"role": "user", "content": "It is ABC123."}],
        "customer_context": {"name": "Ada", "booking": {"id": "ABC123"}},
        "metadata": {"scenario_run_id": "run-1", "turn": 2},
    }


async def test_spar_protocol_defaults_and_optional_usage(agent_server: FakeAgent) -> None:
    agent_server.usage = None

    reply = await call_agent(
        make_egress(), http_agent(agent_server.url), session_id="s", message="hi", history=[]
    )

    assert (reply.content, reply.input_tokens, reply.output_tokens) == ("you said: hi", 0, 0)
    assert agent_server.requests[0].path == "/"
    body = agent_server.requests[0].json
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["customer_context"] == {}
    assert body["metadata"] == {}


async def test_openai_chat_protocol_agent(openai: FakeOpenAI) -> None:
    openai.reply = lambda body: f"{len(body['messages'])} messages seen"
    agent = http_agent(f"{openai.url}/v1/chat/completions", "openai_chat", model="agent-model")

    reply = await call_agent(
        make_egress(), agent, session_id="s", message="Third message", history=HISTORY
    )

    assert reply.content == "3 messages seen"
    assert (reply.input_tokens, reply.output_tokens) == (21, 4)
    [received] = openai.requests
    assert received.path == "/v1/chat/completions"
    assert received.json == {
        "model": "agent-model",
        "messages": [*HISTORY, {"role": "user", "content": "Third message"}],
    }


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_llm_agent_calls_its_provider_with_its_system_prompt_and_model(
    openai: FakeOpenAI, anthropic: FakeAnthropic, kind: str
) -> None:
    base_url = f"{openai.url}/v1" if kind == "openai" else anthropic.url
    agent = AgentConfig(
        id=uuid4(),
        name="concierge",
        kind="llm",
        model="agent-model",
        system_prompt="You are the hotel concierge.",
        provider=provider_for(kind, base_url, model="provider-default"),
    )

    reply = await call_agent(make_egress(), agent, session_id="s", message="A room?", history=[])

    fake = openai if kind == "openai" else anthropic
    assert reply.content == ("Hello from OpenAI" if kind == "openai" else "Hello from Claude")
    assert reply.input_tokens == (21 if kind == "openai" else 31)
    [received] = fake.requests
    body = received.json
    assert body["model"] == "agent-model"
    if kind == "openai":
        assert received.header("authorization") == f"Bearer {API_KEY}"
        assert body["messages"] == [
            {"role": "system", "content": "You are the hotel concierge."},
            {"role": "user", "content": "A room?"},
        ]
    else:
        assert received.header("x-api-key") == API_KEY
        assert body["system"] == "You are the hotel concierge."
        assert body["messages"] == [{"role": "user", "content": "A room?"}]


async def test_an_agent_failing_persistently_raises_agent_error_after_retries(
    agent_server: FakeAgent,
) -> None:
    agent_server.enqueue(*[Reply(status=500, body="internal error")] * 3)

    with pytest.raises(AgentError, match="HTTP 500"):
        await call_agent(
            make_egress(max_attempts=3),
            http_agent(agent_server.url),
            session_id="s",
            message="hi",
            history=[],
        )

    assert len(agent_server.requests) == 3


async def test_an_agent_error_never_shows_part_of_a_credential(
    agent_server: FakeAgent,
) -> None:
    token = "agent-token-" + "Zz9Yy8Xx7W" * 3
    policy = EgressPolicy(
        rules=[DomainRule("127.0.0.1", headers={"X-Token": "{{credentials.AGENT_TOKEN}}"})],
        credentials={"AGENT_TOKEN": token},
        allow_private=True,
    )
    agent_server.enqueue(Reply(status=400, body="y" * 280 + token))

    with pytest.raises(AgentError) as failed:
        await call_agent(
            EgressClient(policy, timeout_s=1.0, backoff_s=0.01),
            http_agent(agent_server.url),
            session_id="s",
            message="hi",
            history=[],
        )

    assert agent_server.requests[0].header("x-token") == token
    assert "HTTP 400" in str(failed.value)
    assert token[:16] not in str(failed.value)


async def test_an_agent_recovering_within_the_retries_answers(agent_server: FakeAgent) -> None:
    agent_server.enqueue(Reply(status=502), Reply(status=429, headers={"Retry-After": "0"}))

    reply = await call_agent(
        make_egress(max_attempts=3),
        http_agent(agent_server.url),
        session_id="s",
        message="hi",
        history=[],
    )

    assert reply.content == "you said: hi"
    assert len(agent_server.requests) == 3


@pytest.mark.parametrize(
    ("protocol", "reply"),
    [
        ("spar", Reply(body="plain text, not JSON")),
        ("spar", Reply(json={"text": "wrong field"})),
        ("spar", Reply(json={"content": 42})),
        ("spar", Reply(json={"content": None})),
        ("spar", Reply(json=["content"])),
        ("openai_chat", Reply(json={"content": "a spar answer"})),
        ("openai_chat", Reply(json={"choices": []})),
        ("openai_chat", Reply(json=openai_completion(None))),
    ],
    ids=[
        "spar-not-json",
        "spar-no-content",
        "spar-content-int",
        "spar-content-null",
        "spar-array",
        "openai-spar-shape",
        "openai-empty-choices",
        "openai-null-content",
    ],
)
async def test_a_malformed_agent_reply_raises_agent_error(
    agent_server: FakeAgent, protocol: str, reply: Reply
) -> None:
    agent_server.enqueue(reply)

    with pytest.raises(AgentError, match=f"not of the {protocol} protocol"):
        await call_agent(
            make_egress(),
            http_agent(agent_server.url, protocol),
            session_id="s",
            message="hi",
            history=[],
        )

    assert len(agent_server.requests) == 1  # a bad answer is not retried by the client


async def test_an_agent_off_the_allow_list_is_refused_by_name(agent_server: FakeAgent) -> None:
    egress = EgressClient(EgressPolicy(rules=[DomainRule("agents.example.com")]), timeout_s=1.0)

    with pytest.raises(HostNotAllowed) as refused:
        await call_agent(
            egress, http_agent(agent_server.url), session_id="s", message="hi", history=[]
        )

    assert refused.value.host == "127.0.0.1"
    assert agent_server.requests == []


# --- end to end: REST API → database → egress -----------------------------------------------------


async def test_configuration_from_the_api_reaches_the_fakes_with_decrypted_credentials(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    openai: FakeOpenAI,
    agent_server: FakeAgent,
) -> None:
    secret = "s3cr3t-value-from-the-vault"
    org = await tenant(client)
    headers = org.owner.headers
    base = f"/v1/orgs/{org.id}"

    responses = [
        await client.put(
            f"{base}/credentials/KEY",
            json={"value": secret, "description": "the API key"},
            headers=headers,
        ),
        await client.post(
            f"{base}/allowed-domains/",
            json={"domain": "127.0.0.1", "headers": {"X-Api-Key": "{{credentials.KEY}}"}},
            headers=headers,
        ),
        await client.post(
            f"{base}/llm-providers/",
            json={
                "name": "fake openai",
                "provider": "openai",
                "base_url": f"{openai.url}/v1",
                "default_model": "gpt-e2e",
                "credential_key": "KEY",
            },
            headers=headers,
        ),
    ]
    assert [r.status_code for r in responses] == [201, 201, 201], [r.text for r in responses]
    provider_id = responses[2].json()["id"]
    for body in (
        {"name": "http bot", "kind": "http", "endpoint_url": f"{agent_server.url}/chat"},
        {
            "name": "llm bot",
            "kind": "llm",
            "llm_provider_id": provider_id,
            "system_prompt": "You are the llm bot.",
        },
    ):
        created = await client.post(f"{base}/agents/", json=body, headers=headers)
        assert created.status_code == 201, created.text
        responses.append(created)
    http_agent_id, llm_agent_id = (r.json()["id"] for r in responses[3:])
    assert responses[3].json()["protocol"] == "spar"
    assert responses[4].json()["model"] == "gpt-e2e"

    # The API never shows the value, neither on write nor on read.
    for path in ("credentials/", "allowed-domains/", "llm-providers/", "agents/"):
        listed = await client.get(f"{base}/{path}", headers=headers)
        assert listed.status_code == 200, listed.text
        responses.append(listed)
    assert all(secret not in r.text for r in responses)

    org_id = UUID(org.id)
    async with app.state.database.transaction() as session:
        policy = await services.load_egress_policy(session, settings=settings, org_id=org_id)
        provider = await services.load_provider(
            session, settings=settings, org_id=org_id, provider_id=UUID(provider_id)
        )
    database = app.state.database
    http_agent_config = (
        await services.load_outbound(database, settings, org_id, UUID(http_agent_id), 0)
    ).agent
    llm_agent_config = (
        await services.load_outbound(database, settings, org_id, UUID(llm_agent_id), 0)
    ).agent

    assert policy.allow_private is True
    assert secret not in repr(provider)  # the key is kept out of reprs
    egress = EgressClient(policy, timeout_s=1.0, connect_timeout_s=1.0, backoff_s=0.01)

    result = await chat(egress, provider, [{"role": "user", "content": "ping"}])
    assert result.content == "Hello from OpenAI"
    received = openai.requests[-1]
    assert received.path == "/v1/chat/completions"
    assert received.json["model"] == "gpt-e2e"
    assert received.header("authorization") == f"Bearer {secret}"
    assert received.header("x-api-key") == secret

    reply = await call_agent(
        egress, http_agent_config, session_id="e2e", message="hello", history=[]
    )
    assert reply.content == "you said: hello"
    received = agent_server.requests[-1]
    assert received.path == "/chat"
    assert received.header("x-api-key") == secret
    assert received.header("authorization") is None

    reply = await call_agent(
        egress, llm_agent_config, session_id="e2e", message="who are you?", history=[]
    )
    assert reply.content == "Hello from OpenAI"
    received = openai.requests[-1]
    assert received.header("authorization") == f"Bearer {secret}"
    assert received.json["model"] == "gpt-e2e"
    assert received.json["messages"][0] == {"role": "system", "content": "You are the llm bot."}
    assert len(openai.requests) == 2
    assert len(agent_server.requests) == 1
