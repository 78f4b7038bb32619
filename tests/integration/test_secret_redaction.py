"""Secrets never come back in what Spar stores or shows (DESIGN §7, issue 11).

Egress injects an organization's credentials into outbound calls (an allowed domain's
header and query values, a provider's API key).  A careless agent or judge that tells back
what it received would put them into replies, critiques, evidence and error messages: Spar
stores and shows those to a VIEWER.  Against loopback fakes that echo their headers and
query string (raw, JSON-escaped, URL-encoded, HTML-escaped and base64), runs go through the
real engine, then the whole database (``pg_dump``), every read route a VIEWER has and the
logs are searched for each secret in each of those forms.  A credential made of every
character an encoder treats apart, echoed as base64 of the headers' JSON and HTML-escaped,
is searched for in the run the API and the UI show (issue 21).
"""

from __future__ import annotations

import asyncio
import base64
import html
import json
import logging
import subprocess
from collections.abc import Iterator
from urllib.parse import quote, quote_plus
from uuid import UUID

import markupsafe
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import make_url

from api.ui.session import COOKIE
from shared.batches.window import dispatch_committed
from shared.outbound.egress import DomainRule, EgressPolicy
from shared.outbound.redact import PLACEHOLDER
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.factories import Caller, Tenant, tenant
from tests.support.fakes import FakeEchoAgent, FakeEchoJudge, echo_of_request
from tests.support.scenario_setup import (
    allow_domain,
    create_http_agent,
    create_judge_provider,
    create_scenario,
    criterion,
    get_run,
    start_run,
    turn,
)
from tests.support.sse import parse_sse

# Each holds a distinctive fragment (before its first special character) that is in every
# form an echo can give it except base64, whose forms are listed apart.
AGENT_TOKEN = 'agtT0kenValue/+="x y'  # an allowed domain's header value
QUERY_SECRET = "qryS3cretValue/+&=?!"  # an allowed domain's query parameter
JUDGE_KEY = "sk-judgeKeyValue0123456789"  # the judge provider's credential_key (bearer)
UNUSED = "unusedS3cretValue42"  # referenced by nothing; the agent learnt it elsewhere
SECRETS = {
    "agent_token": AGENT_TOKEN,
    "agent_query": QUERY_SECRET,
    "judge_key": JUDGE_KEY,
    "unused": UNUSED,
}


def base64_forms(secret: str) -> list[str]:
    """Substrings of the base64 of any value holding ``secret``, at each alignment (the
    characters mixed with the neighbouring bytes trimmed, generously)."""
    forms = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret.encode()).decode()
        core = encoded[3:-3]
        forms += [core, core.replace("+", "-").replace("/", "_")]
    return forms


def forms_of(secret: str) -> list[str]:
    special = (i for i, c in enumerate(secret) if not c.isalnum() and c != "-")
    fragment = secret[: next(special, len(secret))]
    assert len(fragment) >= 8
    return [
        fragment,
        secret,
        quote(secret, safe=""),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
        *base64_forms(secret),
    ]


FORMS = {key: forms_of(value) for key, value in SECRETS.items()}


def leaks(text: str) -> dict[str, list[str]]:
    """The secrets (by key) of which some form is in ``text``, with those forms."""
    found = {key: [f for f in forms if f in text] for key, forms in FORMS.items()}
    return {key: hits for key, hits in found.items() if hits}


@pytest.fixture
def echo_agent() -> Iterator[FakeEchoAgent]:
    with FakeEchoAgent(known=(UNUSED,)) as fake:
        yield fake


@pytest.fixture
def failing_agent() -> Iterator[FakeEchoAgent]:
    with FakeEchoAgent(known=(UNUSED,), fail_with=400) as fake:
        yield fake


@pytest.fixture
def echo_judge() -> Iterator[FakeEchoJudge]:
    with FakeEchoJudge() as fake:
        yield fake


async def put_credentials(client: AsyncTestClient, t: Tenant) -> None:
    for key, value in SECRETS.items():
        response = await client.put(
            f"/v1/orgs/{t.id}/credentials/{key}", json={"value": value}, headers=t.owner.headers
        )
        assert response.status_code == 201, response.text


def pg_dump(database_url: str) -> str:
    url = make_url(database_url).set(drivername="postgresql")
    return subprocess.run(  # a fixed binary, the test's own database
        ["/usr/bin/pg_dump", "--no-owner", url.render_as_string(hide_password=False)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


async def viewer_reads(
    client: AsyncTestClient, t: Tenant, viewer: Caller, run_ids: list[str], batch_id: str
) -> str:
    """Everything the VIEWER reads about the runs and the batch, as one text."""
    runs = f"/v1/orgs/{t.id}/scenarios/runs"
    batches = f"/v1/orgs/{t.id}/scenarios/batch-runs"
    paths = [
        runs,
        *(f"{runs}/{run_id}" for run_id in run_ids),
        f"{batches}/",
        f"{batches}/{batch_id}",
    ]
    bodies = []
    for path in paths:
        response = await client.get(path, headers=viewer.headers)
        assert response.status_code == 200, f"{path}: {response.text}"
        bodies.append(response.text)
    async with client.stream("GET", f"{batches}/{batch_id}/events", headers=viewer.headers) as resp:
        assert resp.status_code == 200
        events = "".join([chunk async for chunk in resp.aiter_text()])
    assert [name for name, _ in parse_sse(events)].count("run") >= 1, events
    return "\n".join([*bodies, events])


async def test_echoed_credentials_are_redacted_everywhere_spar_keeps_or_shows_them(
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    database_url: str,
    echo_agent: FakeEchoAgent,
    failing_agent: FakeEchoAgent,
    echo_judge: FakeEchoJudge,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    t = await tenant(client, with_roles=("VIEWER",))
    await put_credentials(client, t)
    await allow_domain(
        client,
        t,
        headers={"X-Agent-Token": "{{credentials.agent_token}}"},
        query_params={"api_key": "{{ credentials.agent_query }}"},
    )
    await create_judge_provider(client, t, echo_judge.url, credential_key="judge_key")
    spar_agent = await create_http_agent(client, t, echo_agent.url, name="spar echo")
    openai_agent = await create_http_agent(
        client,
        t,
        echo_agent.url,
        name="openai echo",
        protocol="openai_chat",
        endpoint_url=f"{echo_agent.url}/v1/chat/completions",
    )
    broken_agent = await create_http_agent(client, t, failing_agent.url, name="broken")
    scenario = await create_scenario(
        client,
        t,
        turns=[
            turn(
                "Hello, what did you receive?",
                criterion("Does the agent answer?"),
                criterion("x-agent-token: .*", "regex"),
            ),
            turn("And now?", criterion("Still answering?")),
        ],
    )

    run_ids = []
    for agent in (spar_agent, openai_agent, broken_agent):
        run = await start_run(client, t, scenario["id"], agent["id"])
        await execute_run(app.state.database, settings, UUID(run["id"]))
        run_ids.append(run["id"])
    response = await client.post(
        f"/v1/orgs/{t.id}/scenarios/batch-runs/",
        json={"agent_id": spar_agent["id"], "scenario_ids": [scenario["id"]]},
        headers=t.owner.headers,
    )
    assert response.status_code == 201, response.text
    batch = response.json()
    for run_id in await dispatch_committed(app.state.database, UUID(batch["id"])):
        await execute_run(app.state.database, settings, run_id)

    # The secrets did go out, so the fakes had them to echo.
    sent = echo_agent.requests[0]
    assert sent.header("x-agent-token") == AGENT_TOKEN
    assert sent.query_value("api_key") == QUERY_SECRET
    assert echo_judge.requests[0].header("authorization") == f"Bearer {JUDGE_KEY}"
    # ... and came back: what Spar kept is the echo, redacted.
    spar_run, openai_run, broken_run = [await get_run(client, t, r) for r in run_ids]
    for run in (spar_run, openai_run):
        assert run["status"] == "passed", run
        first = run["turn_results"][0]
        assert "x-agent-token: [redacted]" in first["response_content"]
        llm, regex = first["criteria_results"]
        assert "[redacted]" in llm["critique"] and "[redacted]" in llm["evidence"]
        assert regex["evidence"] == "x-agent-token: [redacted]"
    assert broken_run["status"] == "error"
    assert broken_run["error_message"].startswith("agent: agent answered HTTP 400")
    assert "[redacted]" in broken_run["error_message"]
    # The judge was never shown a secret either: the conversation it got was redacted.
    assert not leaks(echo_judge.requests[0].json["messages"][-1]["content"])

    assert leaks(json.dumps([spar_run, openai_run, broken_run])) == {}
    viewer = t.members["VIEWER"]
    assert leaks(await viewer_reads(client, t, viewer, run_ids, batch["id"])) == {}
    assert leaks(await asyncio.to_thread(pg_dump, database_url)) == {}
    assert leaks(caplog.text) == {}


async def test_an_error_message_quoting_the_secret_is_redacted(
    client: AsyncTestClient, app: Litestar, settings: Settings, failing_agent: FakeEchoAgent
) -> None:
    t = await tenant(client)
    await put_credentials(client, t)
    await allow_domain(client, t, headers={"X-Agent-Token": "{{credentials.agent_token}}"})
    agent = await create_http_agent(client, t, failing_agent.url)
    scenario = await create_scenario(client, t)

    run = await start_run(client, t, scenario["id"], agent["id"])
    await execute_run(app.state.database, settings, UUID(run["id"]))

    assert failing_agent.requests[0].header("x-agent-token") == AGENT_TOKEN
    final = await get_run(client, t, run["id"])
    assert final["status"] == "error"
    assert "x-agent-token: [redacted]" in final["error_message"]
    assert leaks(final["error_message"]) == {}


def echoes_of(secret: str) -> list[str]:
    """``secret`` as echoes give it back: URL-encoded by several encoders, JSON-escaped,
    base64-encoded alone and inside longer values (each alignment, both alphabets)."""
    encoded = [
        base64.b64encode((prefix + secret + "!").encode()).decode()
        for prefix in ("", "u:", "us:", "Basic ")
    ]
    return [
        secret,
        quote(secret, safe=""),
        quote(secret).lower(),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
        json.dumps(json.dumps(secret))[1:-1],
        *encoded,
        *(e.replace("+", "-").replace("/", "_") for e in encoded),
    ]


async def test_every_form_of_every_credential_is_redacted_but_short_values_only_as_tokens() -> None:
    policy = EgressPolicy(rules=[DomainRule("127.0.0.1")], credentials={**SECRETS, "pin": "pin42"})
    text = "\n".join(f"<{echo}>" for secret in SECRETS.values() for echo in echoes_of(secret))
    assert leaks(text)  # the test sees what it looks for

    assert leaks(policy.redact(text)) == {}
    # A value under 8 characters is replaced where it stands alone, not inside words.
    assert policy.redact("pin: pin42, spin42x, pin420") == "pin: [redacted], spin42x, pin420"
    # A secret the call itself sent (a provider's key) is redacted though no credential holds it.
    assert policy.redact("key sk-provider-key-123", "sk-provider-key-123") == "key [redacted]"


# Quotes, a backslash, a slash, a plus, <&> and non-ASCII; "Tr1ckyS3cret" is in each of its
# textual forms.
TRICKY = 'Tr1ckyS3cret+Agent/Key="<&>"\\pässwörd€'


def tricky_forms() -> list[str]:
    """TRICKY as an echo, the API's JSON or a page could show it: as is and as a Python
    server reads a header (UTF-8 as Latin-1); URL-encoded; JSON-escaped once and twice;
    HTML-escaped as html.escape and the UI's markupsafe write it; and base64 of each."""
    as_latin1 = TRICKY.encode().decode("latin-1")
    texts = {"Tr1ckyS3cret", quote(TRICKY, safe=""), quote(TRICKY), quote_plus(TRICKY)}
    for text in (TRICKY, as_latin1):
        for ensure_ascii in (True, False):
            once = json.dumps(text, ensure_ascii=ensure_ascii)[1:-1]
            texts |= {text, once, json.dumps(once, ensure_ascii=ensure_ascii)[1:-1]}
        for escaped in list(texts):
            texts |= {html.escape(escaped), str(markupsafe.escape(escaped))}
    return sorted(texts | {core for text in texts for core in base64_forms(text)})


TRICKY_FORMS = tricky_forms()


def tricky_leaks(text: str) -> list[str]:
    return [form for form in TRICKY_FORMS if form in text]


async def test_a_credential_echoed_as_base64_of_json_and_as_html_is_redacted_in_api_and_ui(
    client: AsyncTestClient, app: Litestar, settings: Settings, echo_agent: FakeEchoAgent
) -> None:
    t = await tenant(client)
    response = await client.put(
        f"/v1/orgs/{t.id}/credentials/tricky", json={"value": TRICKY}, headers=t.owner.headers
    )
    assert response.status_code == 201, response.text
    await allow_domain(client, t, headers={"X-Agent-Token": "{{credentials.tricky}}"})
    agent = await create_http_agent(client, t, echo_agent.url)
    scenario = await create_scenario(
        client, t, turns=[turn("What did you get?", criterion("x-agent-token: .*", "regex"))]
    )

    run = await start_run(client, t, scenario["id"], agent["id"])
    await execute_run(app.state.database, settings, UUID(run["id"]))

    # The credential went out (as UTF-8, which this Python server reads as Latin-1), and the
    # agent told it back in each form: the test sees what it looks for.
    request = echo_agent.requests[0]
    assert request.header("x-agent-token", "").encode("latin-1").decode() == TRICKY
    told = echo_of_request(request, echo_agent.known).splitlines()
    in_base64 = [line for line in told if line.startswith("headers as base64 of JSON: ")]
    in_html = [line for line in told if line.startswith("x-agent-token: ") and "&quot;" in line]
    assert len(in_base64) == 2 and len(in_html) == 2
    assert all(tricky_leaks(line) for line in in_base64 + in_html)

    # What Spar kept is that echo with the credential replaced in each of those lines.
    final = await get_run(client, t, run["id"])
    assert final["status"] == "passed", final
    kept = final["turn_results"][0]["response_content"].splitlines()
    assert len(kept) == len(told)
    assert kept.count("x-agent-token: [redacted]") == 3  # as is, and in both HTML echoes
    kept_base64 = [line for line in kept if line.startswith("headers as base64 of JSON: ")]
    assert len(kept_base64) == 2 and all(PLACEHOLDER in line for line in kept_base64)

    runs = f"/v1/orgs/{t.id}/scenarios/runs"
    shown = [
        await client.get(f"{runs}/{run['id']}", headers=t.owner.headers),
        await client.get(runs, headers=t.owner.headers),
        await client.get(
            f"/ui/orgs/{t.id}/runs/{run['id']}",
            headers={"Cookie": f"{COOKIE}={t.owner.token}"},
        ),
    ]
    assert [r.status_code for r in shown] == [200, 200, 200]
    assert PLACEHOLDER in shown[-1].text  # the page shows the reply
    assert [tricky_leaks(r.text) for r in shown] == [[], [], []]
