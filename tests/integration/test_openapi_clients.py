"""Clients generated from the served OpenAPI document work, checked with the tools users
run on it:

* ``openapi-spec-validator``: the document is valid OpenAPI 3.1;
* ``datamodel-code-generator``: its pydantic v2 models import and read real answers;
* ``openapi-python-client``: a generated client runs the main flow (register,
  organization, agent, scenario, run, batch) and fires and delivers to a trigger;
* ``openapi-typescript`` + ``openapi-fetch``: a TypeScript program on the generated types
  (a signed webhook delivery, a fire and a rotation without a body, the enums) compiles
  with ``tsc``;
* ``openapi-core``: every request and answer of a full flow matches the document.

One API for the module, served by uvicorn on a loopback port against the suite's
database; the agent and the judge are loopback fakes.  Each generator runs once, in a
temporary directory.  Runs, batches and calibrations are played in the test's process as
the workers play them, on the database of the suite's app (which the ``client`` fixture
starts).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import importlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from openapi_core import Config, OpenAPI
from openapi_core.deserializing.media_types.util import plain_loads
from openapi_core.testing import MockRequest, MockResponse
from openapi_spec_validator import validate as validate_spec
from sqlalchemy import select
from standardwebhooks import Webhook

from api.app import create_app
from shared.calibration.judging import judge_examples
from shared.db.models import Calibration
from shared.scenarios.runner import execute_run
from shared.settings import Settings
from tests.support.batches import drain
from tests.support.calibration import EXAMPLES
from tests.support.factories import PASSWORD, unique_email
from tests.support.fakes import FakeAgent, FakeOpenAI, verdict_from_marker
from tests.support.live_server import LiveServer
from tests.support.sse import parse_sse

pytestmark = [
    # One worker holds the server and the generated code.
    pytest.mark.xdist_group("openapi_clients"),
    # Litestar writes the paging parameters' `allowEmptyValue: false` (the default).
    pytest.mark.filterwarnings("ignore:Use of allowEmptyValue property is deprecated"),
]

TYPESCRIPT = Path(__file__).resolve().parents[1] / "typescript"
BIN = Path(sys.executable).parent  # the tools' commands, installed beside this Python
METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture(scope="module")
def server(settings: Settings) -> Iterator[LiveServer]:
    with LiveServer(create_app(settings)) as live:
        yield live


@pytest.fixture(scope="module")
def document(server: LiveServer) -> dict[str, Any]:
    served = httpx.get(f"{server.url}/schema/openapi.json")
    assert served.status_code == 200, served.text
    return served.json()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory, document: dict[str, Any]) -> Path:
    """A directory holding the served document (``openapi.json``), for the generators."""
    where = tmp_path_factory.mktemp("generated")
    (where / "openapi.json").write_text(json.dumps(document))
    return where


@pytest.fixture(scope="module")
def agent() -> Iterator[FakeAgent]:
    with FakeAgent(reply="hello, how can I help?") as fake:
        yield fake


@pytest.fixture(scope="module")
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(reply=verdict_from_marker) as fake:
        yield fake


def run_tool(*command: str | Path, cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{output}"
    return output


def import_generated(directory: Path, name: str) -> ModuleType:
    """Import the generated package or module ``name`` from ``directory``."""
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(directory))


def walk(node: Any, at: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object of the document, with its JSON pointer."""
    if isinstance(node, dict):
        yield at, node
        for key, value in node.items():
            yield from walk(value, f"{at}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{at}/{index}")


def sign(secret: str, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body``, made by the reference library."""
    msg_id = f"msg_{uuid4().hex}"
    at = datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, body.decode()),
    }


# --- openapi-spec-validator ------------------------------------------------------------------


# Answer fields whose values are an enum's (a status, a verdict, a kind): the document
# says which values, so generated clients get the enum and not any string.
ENUM_FIELDS = {
    "AccessToken": ["token_type"],
    "Registered": ["token_type"],
    "UserRead": ["status"],
    "AgentRead": ["kind", "protocol"],
    "LLMProviderRead": ["provider"],
    "ProviderReference": ["provider"],
    "CriterionRead": ["criteria_type"],
    "FewShotExampleRead": ["verdict"],
    "CriterionResultRead": ["verdict"],
    "ScenarioRunRead": ["status"],
    "BatchRunItemSummary": ["status"],
    "BatchRunRead": ["status"],
    "CalibrationRead": ["status"],
    "CalibrationPending": ["status"],
    "CalibrationResultItem": ["human_verdict", "judge_verdict"],
    "DocumentRead": ["mimeType", "processingStatus", "bookmarkMode"],
    "DocumentStatus": ["status"],
    "BookmarkRead": ["bookmarkMode"],
    "TriggerRead": ["trigger_type", "status", "action"],
    "TriggerCreated": ["trigger_type", "status", "action"],
    "ExecutionRead": ["source", "status"],
    "HealthStatus": ["status"],
}


def enumerated(document: dict[str, Any], schema: dict[str, Any]) -> bool:
    """Whether ``schema`` allows only listed values (null aside)."""
    if "$ref" in schema:
        return enumerated(document, document["components"]["schemas"][schema["$ref"][21:]])
    if "enum" in schema or "const" in schema:
        return True
    members = [m for m in schema.get("oneOf", ()) if m.get("type") != "null"]
    return bool(members) and all(enumerated(document, m) for m in members)


def test_the_served_document_is_valid_openapi_and_says_things_one_way(
    document: dict[str, Any],
) -> None:
    validate_spec(document)
    assert document["openapi"].startswith("3.1")
    found: dict[str, list[str]] = {
        "examples": [],
        "type lists": [],
        "error answers without a JSON body": [],
        "answers without X-Request-ID": [],
        "answers without Retry-After": [],
        "answer fields without their enum": [],
    }
    for at, node in walk(document):
        # Litestar's generated examples are random strings that describe nothing.
        is_properties = at.endswith("/properties")  # there, "examples" may be a field's name
        if not is_properties and ("example" in node or "examples" in node):
            found["examples"].append(at)
        # Null is said as oneOf [..., {type: null}] everywhere, never as a list of types.
        if isinstance(node.get("type"), list):
            found["type lists"].append(at)
    for path, item in document["paths"].items():
        for method in METHODS:
            for status, answer in item.get(method, {}).get("responses", {}).items():
                where = f"{method} {path} {status}"
                headers = answer.get("headers", {})
                if int(status) >= 400 and "application/json" not in answer.get("content", {}):
                    found["error answers without a JSON body"].append(where)
                if "X-Request-ID" not in headers:
                    found["answers without X-Request-ID"].append(where)
                retried = status == "429" or (status == "503" and path.startswith("/v1/"))
                if retried and "Retry-After" not in headers:
                    found["answers without Retry-After"].append(where)
    schemas = document["components"]["schemas"]
    for name, fields in ENUM_FIELDS.items():
        for field in fields:
            if not enumerated(document, schemas[name]["properties"][field]):
                found["answer fields without their enum"].append(f"{name}.{field}")
    assert found == {key: [] for key in found}
    # The batch's event stream says which events come, and what each one's data is.
    stream = document["paths"]["/v1/orgs/{org_id}/scenarios/batch-runs/{batch_run_id}/events"]
    said = stream["get"]["responses"]["200"]["description"]
    for event, data in (("progress", "BatchRunRead"), ("run", "BatchRunItemSummary")):
        assert f"`{event}`" in said and f"`{data}`" in said, said
    assert "`end`" in said


# --- datamodel-code-generator ----------------------------------------------------------------


@pytest.fixture(scope="module")
def pydantic_models(generated: Path) -> ModuleType:
    run_tool(
        BIN / "datamodel-codegen",
        "--input",
        generated / "openapi.json",
        "--input-file-type",
        "openapi",
        "--output-model-type",
        "pydantic_v2.BaseModel",
        "--formatters",
        "builtin",
        "--output",
        generated / "spar_pydantic_models.py",
        cwd=generated,
    )
    return import_generated(generated, "spar_pydantic_models")


async def test_pydantic_models_from_datamodel_code_generator_import_and_read_answers(
    pydantic_models: ModuleType, server: LiveServer
) -> None:
    import pydantic

    models = pydantic_models
    async with httpx.AsyncClient(base_url=server.url) as http:
        body = {
            "email": unique_email("pydantic"),
            "password": PASSWORD,
            "first_name": "Py",
            "last_name": "Dantic",
        }
        registered = await http.post("/v1/auth/register", json=body)
        assert registered.status_code == 201, registered.text
        models.Registered.model_validate(registered.json())
        refused = await http.post("/v1/auth/register", json={**body, "email": "nobody"})
        assert refused.status_code == 422, refused.text
        models.ValidationError.model_validate(refused.json())
    # The document's rules hold in the models: a tag is 1 to 100 storable characters.
    turn = {"user_message": "Hi", "criteria": []}
    models.ScenarioCreate.model_validate({"name": "ok", "turns": [turn], "tags": ["smoke"]})
    for tag in ("", "x" * 101, "nul\x00"):
        with pytest.raises(pydantic.ValidationError):
            models.ScenarioCreate.model_validate({"name": "ok", "turns": [turn], "tags": [tag]})


# --- openapi-python-client -------------------------------------------------------------------


@pytest.fixture(scope="module")
def python_client(generated: Path) -> ModuleType:
    config = generated / "openapi-python-client.yaml"
    config.write_text("post_hooks: []\n")  # no formatting pass: the code only has to run
    run_tool(
        BIN / "openapi-python-client",
        "generate",
        "--path",
        generated / "openapi.json",
        "--meta",
        "none",
        "--config",
        config,
        "--output-path",
        generated / "spar_api_client",
        cwd=generated,
    )
    return import_generated(generated, "spar_api_client")


async def test_a_generated_python_client_runs_the_main_flow(
    python_client: ModuleType,
    server: LiveServer,
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
) -> None:
    package = python_client.__name__

    def api(name: str) -> Any:
        return importlib.import_module(f"{package}.api.{name}")

    models = importlib.import_module(f"{package}.models")
    anonymous = python_client.Client(base_url=server.url, raise_on_unexpected_status=True)

    registered = await api("auth.register").asyncio(
        client=anonymous,
        body=models.RegisterBody(
            email=unique_email("generated"), password=PASSWORD, first_name="Gen", last_name="Erated"
        ),
    )
    assert isinstance(registered, models.Registered), registered
    me = python_client.AuthenticatedClient(
        base_url=server.url, token=registered.access_token, raise_on_unexpected_status=True
    )
    org = await api("organizations.create_organization").asyncio(
        client=me, body=models.OrganizationCreate(name="Generated clients")
    )
    assert isinstance(org, models.OrganizationRead), org
    domain = await api("allowed_domains.create_allowed_domain").asyncio(
        org.id, client=me, body=models.AllowedDomainCreate(domain="127.0.0.1")
    )
    assert isinstance(domain, models.AllowedDomainRead), domain
    made = await api("agents.create_agent").asyncio(
        org.id,
        client=me,
        body=models.AgentCreate.from_dict(
            {"name": "bot", "kind": "http", "protocol": "spar", "endpoint_url": f"{agent.url}/chat"}
        ),
    )
    assert isinstance(made, models.AgentRead), made
    assert isinstance(made.kind, enum.Enum) and made.kind.value == "http"
    scenario = await api("scenarios.create_scenario").asyncio(
        org.id,
        client=me,
        body=models.ScenarioCreate.from_dict(
            {
                "name": "greets",
                "tags": ["smoke"],
                "turns": [
                    {
                        "user_message": "Hi",
                        "criteria": [{"question": "hello", "criteria_type": "contains"}],
                    }
                ],
            }
        ),
    )
    assert isinstance(scenario, models.ScenarioRead), scenario

    run = await api("scenarios.run_scenario").asyncio(
        org.id, scenario.id, client=me, body=models.RunCreate(agent_id=made.id)
    )
    assert isinstance(run, models.ScenarioRunRead), run
    await execute_run(app.state.database, settings, run.id)
    done = await api("scenarios.get_scenario_run").asyncio(org.id, run.id, client=me)
    assert isinstance(done, models.ScenarioRunRead), done
    assert isinstance(done.status, enum.Enum) and done.status.value == "passed"
    (result,) = done.turn_results[0].criteria_results
    assert isinstance(result.verdict, enum.Enum) and result.verdict.value == "PASS"

    batch = await api("batch_runs.create_batch_run").asyncio(
        org.id, client=me, body=models.BatchRunCreate(agent_id=made.id, tags=["smoke"])
    )
    assert isinstance(batch, models.BatchRunRead), batch
    await drain(app, settings, str(batch.id))
    finished = await api("batch_runs.get_batch_run").asyncio(org.id, batch.id, client=me)
    assert isinstance(finished, models.BatchRunRead), finished
    assert finished.status.value == "completed" and finished.passed_scenarios == 1

    # A webhook trigger: fired and rotated with no body, then a signed delivery.
    trigger = await api("triggers.create_trigger").asyncio(
        org.id,
        client=me,
        body=models.TriggerCreate.from_dict(
            {
                "name": "deploys",
                "trigger_type": "webhook",
                "agent_id": str(made.id),
                "message": "Deployed {{ payload.version }}",
            }
        ),
    )
    assert isinstance(trigger, models.TriggerCreated), trigger
    fired = await api("triggers.fire_trigger").asyncio(org.id, trigger.id, client=me)
    assert isinstance(fired, models.ExecutionRead), fired
    assert fired.payload is None and fired.source.value == "manual"
    rotated = await api("triggers.rotate_trigger_secret").asyncio(org.id, trigger.id, client=me)
    assert isinstance(rotated, models.TriggerCreated), rotated
    payload = {"version": "1.2.3"}
    # Signed as the client sends it: compact JSON (httpx's encoding of json=).
    headers = sign(rotated.webhook_secret, json.dumps(payload, separators=(",", ":")).encode())
    accepted = await api("webhooks.receive_trigger_webhook").asyncio(
        trigger.id,
        client=anonymous,
        body=payload,
        webhook_id=headers["webhook-id"],
        webhook_timestamp=int(headers["webhook-timestamp"]),
        webhook_signature=headers["webhook-signature"],
    )
    assert isinstance(accepted, models.HookAccepted), accepted
    executions = await api("triggers.list_trigger_executions").asyncio(
        org.id, trigger.id, client=me
    )
    assert {e.source.value for e in executions.executions} == {"manual", "webhook"}
    delivered = next(e for e in executions.executions if e.source.value == "webhook")
    assert delivered.payload == payload


# --- openapi-typescript + openapi-fetch, compiled with tsc -----------------------------------


def test_a_typescript_client_from_openapi_typescript_and_openapi_fetch_compiles(
    generated: Path, tmp_path: Path
) -> None:
    modules = TYPESCRIPT / "node_modules"
    assert (modules / ".bin" / "tsc").exists(), (
        f"the TypeScript tools are not installed: run `npm ci` in {TYPESCRIPT}"
    )
    for name in ("client.ts", "tsconfig.json", "package.json"):
        shutil.copy(TYPESCRIPT / name, tmp_path / name)
    (tmp_path / "node_modules").symlink_to(modules, target_is_directory=True)
    run_tool(
        "npx",
        "--no-install",
        "openapi-typescript",
        generated / "openapi.json",
        "--output",
        tmp_path / "spar-api.d.ts",
        cwd=tmp_path,
    )
    run_tool("npx", "--no-install", "tsc", "--noEmit", "-p", "tsconfig.json", cwd=tmp_path)


# --- openapi-core: every exchange of a full flow ---------------------------------------------


INVALID_ON_PURPOSE = "spar_invalid_on_purpose"


def describe(exc: Exception) -> str:
    """What openapi-core found, one line per schema error."""
    lines = []
    for error in (exc, exc.__cause__):
        for schema_error in getattr(error, "schema_errors", None) or ():
            at = "/".join(map(str, schema_error.absolute_path))
            lines.append(f"at {at or '.'}: {schema_error.message[:200]}")
    if not lines:
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        lines.append(f"{type(exc).__name__}: {exc}{cause}"[:400])
    return "; ".join(lines)


class Checked:
    """An HTTP client of the live API that checks every request and answer against the
    document with openapi-core, and counts the operations it called."""

    def __init__(self, document: dict[str, Any], base_url: str) -> None:
        # The event stream is text, as text/plain is (openapi-core reads unknown types as bytes).
        config = Config(extra_media_type_deserializers={"text/event-stream": plain_loads})
        self.openapi = OpenAPI.from_dict(document, config=config)
        self.problems: list[str] = []
        self.called: set[str] = set()
        # Literal paths before templated ones: /scenarios/runs is not /scenarios/{id}.
        templates = sorted(document["paths"], key=lambda path: path.count("{"))
        self._routes = [
            (re.compile(re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), document["paths"][path])
            for path in templates
        ]
        self.http = httpx.AsyncClient(
            base_url=base_url, timeout=60, event_hooks={"response": [self._check]}
        )

    async def _check(self, response: httpx.Response) -> None:
        await response.aread()
        request = response.request
        mock_request = MockRequest(
            host_url=f"{request.url.scheme}://{request.url.netloc.decode()}",
            method=request.method,
            path=request.url.path,
            args=list(request.url.params.multi_items()),  # type: ignore[arg-type]
            headers=dict(request.headers),
            data=request.content or None,
            content_type=request.headers.get("content-type", ""),
        )
        mock_response = MockResponse(
            data=response.content,
            status_code=response.status_code,
            headers=dict(response.headers),
            content_type=response.headers.get("content-type", ""),
        )
        where = f"{request.method} {request.url.path} -> {response.status_code}"
        checks = [("response", self.openapi.validate_response, (mock_request, mock_response))]
        if not request.extensions.get(INVALID_ON_PURPOSE):
            checks.insert(0, ("request", self.openapi.validate_request, (mock_request,)))
        for what, check, args in checks:
            try:
                check(*args)
            except Exception as exc:  # any mismatch, and any crash of the validator
                self.problems.append(f"{where}: the {what} {describe(exc)}")
        for pattern, item in self._routes:
            if pattern.match(request.url.path):
                operation = item.get(request.method.lower())
                if operation is not None:
                    self.called.add(operation["operationId"])
                break

    async def call(
        self,
        method: str,
        path: str,
        expect: int,
        *,
        token: str | None = None,
        invalid: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``invalid``: the request breaks the document on purpose (only the answer is
        checked)."""
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        response = await self.http.request(
            method, path, headers=headers, extensions={INVALID_ON_PURPOSE: invalid}, **kwargs
        )
        assert response.status_code == expect, f"{method} {path}: {response.text[:500]}"
        if "json" in response.headers.get("content-type", ""):
            return response.json()
        return response.text


async def judge_the_calibration(app: Litestar, settings: Settings, org_id: str) -> None:
    """Play the calibration actor for the org's first calibration once it is recorded."""
    database = app.state.database
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        async with database.transaction() as session:
            found = await session.scalar(
                select(Calibration.id).where(Calibration.organization_id == UUID(org_id))
            )
        if found is not None:
            await judge_examples(database, settings, found)
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no calibration was recorded")


# The operations a full flow calls; the rest of the API is fuzzed by schemathesis.
FLOW = {
    "healthLive",
    "healthReady",
    "register",
    "login",
    "getCurrentUser",
    "createOrganization",
    "listOrganizations",
    "getOrganization",
    "updateOrganization",
    "listMembers",
    "listRoles",
    "createPlatformToken",
    "listPlatformTokens",
    "createAllowedDomain",
    "listAllowedDomains",
    "putCredential",
    "listCredentials",
    "createLLMProvider",
    "listLLMProviders",
    "createAgent",
    "listAgents",
    "getAgent",
    "updateAgent",
    "createScenario",
    "listScenarios",
    "getScenario",
    "updateScenario",
    "runScenario",
    "getScenarioRun",
    "listScenarioRuns",
    "createBatchRun",
    "getBatchRun",
    "listBatchRuns",
    "streamBatchRunEvents",
    "compareBatchRuns",
    "calibrateJudge",
    "getCalibration",
    "listCalibrations",
    "createKnowledgeCollection",
    "uploadKnowledgeDocument",
    "getKnowledgeDocumentStatus",
    "createTrigger",
    "listTriggers",
    "getTrigger",
    "updateTrigger",
    "fireTrigger",
    "listTriggerExecutions",
    "getTriggerExecution",
    "rotateTriggerSecret",
    "receiveTriggerWebhook",
    "deleteScenario",
}


async def test_every_exchange_of_a_full_flow_matches_the_document(
    document: dict[str, Any],
    server: LiveServer,
    client: AsyncTestClient,
    app: Litestar,
    settings: Settings,
    agent: FakeAgent,
    judge: FakeOpenAI,
) -> None:
    api = Checked(document, server.url)
    try:
        await full_flow(api, app, settings, agent, judge)
    finally:
        await api.http.aclose()
    assert not api.problems, "\n".join(api.problems)
    assert api.called >= FLOW, sorted(FLOW - api.called)


async def full_flow(
    api: Checked, app: Litestar, settings: Settings, agent: FakeAgent, judge: FakeOpenAI
) -> None:
    call = api.call
    await call("GET", "/health/live", 200)
    await call("GET", "/health/ready", 200)

    # Identity: an account, a wrong password until the throttle answers 429, a token.
    email = unique_email("core")
    person = {"email": email, "password": PASSWORD, "first_name": "Core", "last_name": "Flow"}
    token = (await call("POST", "/v1/auth/register", 201, json=person))["access_token"]
    await call("POST", "/v1/auth/register", 409, json=person)
    await call("POST", "/v1/auth/register", 422, invalid=True, json={**person, "email": "nobody"})
    wrong = {"email": email, "password": "not-the-password"}
    for _ in range(settings.login_pair_limit):
        await call("POST", "/v1/auth/login", 401, json=wrong)
    await call("POST", "/v1/auth/login", 429, json=wrong)
    other = {**person, "email": unique_email("core")}
    await call("POST", "/v1/auth/register", 201, json=other)
    login = {"email": other["email"], "password": PASSWORD}
    token = (await call("POST", "/v1/auth/login", 200, json=login))["access_token"]
    await call("GET", "/v1/auth/me", 200, token=token)
    await call("GET", "/v1/auth/me", 401, invalid=True)

    org = await call("POST", "/v1/organizations", 201, token=token, json={"name": "Core"})
    o = f"/v1/orgs/{org['id']}"
    await call("GET", "/v1/organizations", 200, token=token)
    await call("GET", f"/v1/organizations/{org['id']}", 200, token=token)
    await call("GET", f"/v1/organizations/{uuid4()}", 404, token=token)
    await call(
        "PATCH", f"/v1/organizations/{org['id']}", 200, token=token, json={"timezone": "UTC"}
    )
    await call("GET", f"/v1/organizations/{org['id']}/members", 200, token=token)
    await call("GET", f"{o}/roles", 200, token=token)
    await call(
        "POST",
        f"{o}/platform-tokens",
        201,
        token=token,
        json={"name": "ci", "permissions": ["scenarios:read"]},
    )
    await call("GET", f"{o}/platform-tokens", 200, token=token)
    await call("GET", f"{o}/roles?limit=2&unknown=1", 422, token=token, invalid=True)

    # Outbound: the loopback fakes allowed, a judge provider, an agent.
    await call("POST", f"{o}/allowed-domains", 201, token=token, json={"domain": "127.0.0.1"})
    await call("GET", f"{o}/allowed-domains", 200, token=token)
    await call("PUT", f"{o}/credentials/JUDGE_KEY", 201, token=token, json={"value": "sk-test"})
    await call("GET", f"{o}/credentials", 200, token=token)
    provider = await call(
        "POST",
        f"{o}/llm-providers",
        201,
        token=token,
        json={
            "name": "judge",
            "provider": "openai_compatible",
            "base_url": f"{judge.url}/v1",
            "default_model": "judge-model",
            "credential_key": "JUDGE_KEY",
            "is_default_judge": True,
        },
    )
    assert provider["provider"] == "openai_compatible"
    await call("GET", f"{o}/llm-providers", 200, token=token)
    bot = await call(
        "POST",
        f"{o}/agents",
        201,
        token=token,
        json={"name": "bot", "kind": "http", "protocol": None, "endpoint_url": f"{agent.url}/c"},
    )
    await call("GET", f"{o}/agents", 200, token=token)
    await call("GET", f"{o}/agents/{bot['id']}", 200, token=token)
    await call("PATCH", f"{o}/agents/{bot['id']}", 200, token=token, json={"protocol": "spar"})

    # Scenarios, a run played to its end, a batch (its integer given as 13.0).
    turn = {
        "user_message": "Hi {{ name }}",
        "criteria": [
            {"question": "hello", "criteria_type": "contains"},
            {"question": "Polite? [judge:PASS]", "criteria_type": "llm_evaluated"},
        ],
    }
    scenario = await call(
        "POST",
        f"{o}/scenarios",
        201,
        token=token,
        json={
            "name": "greets",
            "tags": ["smoke"],
            "turns": [turn],
            "customer_context": {"name": "Ada"},
        },
    )
    spare = await call(
        "POST",
        f"{o}/scenarios",
        201,
        token=token,
        json={"name": "spare", "turns": [turn], "customer_context": {"name": "Bo"}},
    )
    await call(
        "POST", f"{o}/scenarios", 422, token=token, invalid=True, json={"name": "x", "turns": []}
    )
    await call("GET", f"{o}/scenarios?tag=smoke", 200, token=token)
    await call("GET", f"{o}/scenarios/{scenario['id']}", 200, token=token)
    await call("PUT", f"{o}/scenarios/{spare['id']}", 200, token=token, json={"description": None})
    await call("DELETE", f"{o}/scenarios/{spare['id']}", 204, token=token)
    run = await call(
        "POST",
        f"{o}/scenarios/{scenario['id']}/run",
        201,
        token=token,
        json={"agent_id": bot["id"]},
    )
    await execute_run(app.state.database, settings, UUID(run["id"]))
    done = await call("GET", f"{o}/scenarios/runs/{run['id']}", 200, token=token)
    assert done["status"] == "passed", done
    await call("GET", f"{o}/scenarios/runs?status=passed", 200, token=token)
    await call("GET", f"{o}/scenarios/runs/{uuid4()}", 404, token=token)
    batches = f"{o}/scenarios/batch-runs"
    batch = await call(
        "POST",
        batches,
        201,
        token=token,
        json={"agent_id": bot["id"], "tags": ["smoke"], "max_concurrency": 13.0},
    )
    assert batch["max_concurrency"] == 13
    await drain(app, settings, batch["id"])
    over = await call("GET", f"{batches}/{batch['id']}", 200, token=token)
    assert over["status"] == "completed", over
    events = await call("GET", f"{batches}/{batch['id']}/events", 200, token=token)
    assert [name for name, _ in parse_sse(events)][-1] == "end"
    await call("GET", batches, 200, token=token)
    await call("GET", f"{batches}/compare?a={batch['id']}&b={batch['id']}", 200, token=token)

    # A calibration judged while the request waits: the 200 answer, with its metrics.
    calibrated, _ = await asyncio.gather(
        call(
            "POST",
            f"{o}/scenarios/calibrate?agent_id={bot['id']}",
            200,
            token=token,
            json={"examples": EXAMPLES},
        ),
        judge_the_calibration(app, settings, org["id"]),
    )
    assert calibrated["status"] == "completed", calibrated
    await call("GET", f"{o}/scenarios/calibrations/{calibrated['id']}", 200, token=token)
    await call("GET", f"{o}/scenarios/calibrations", 200, token=token)

    # Knowledge: a collection, a document, and a media type Spar does not take (415).
    collection = await call(
        "POST", f"{o}/knowledge/collections", 201, token=token, json={"name": "Help"}
    )
    upload = {"collectionId": collection["id"], "filename": "refunds.md", "content": "# Refunds"}
    document = await call(
        "POST", f"{o}/knowledge/documents/structured", 201, token=token, json=upload
    )
    await call("GET", f"{o}/knowledge/documents/{document['id']}/status", 200, token=token)
    await call(
        "POST",
        f"{o}/knowledge/documents/structured",
        415,
        token=token,
        json={**upload, "mimeType": "text/html"},
    )

    # Triggers: listed, fired and rotated with no body, and their webhook delivered to.
    triggers = f"{o}/triggers"
    trigger = await call(
        "POST",
        triggers,
        201,
        token=token,
        json={
            "name": "deploys",
            "trigger_type": "webhook",
            "agent_id": bot["id"],
            "message": "Deployed {{ payload.version }}",
        },
    )
    t = f"{triggers}/{trigger['id']}"
    await call("GET", triggers, 200, token=token)
    await call("GET", f"{triggers}?trigger_type=webhook&status=active", 200, token=token)
    await call("GET", t, 200, token=token)
    fired = await call("POST", f"{t}/fire", 202, token=token)
    assert fired["payload"] is None and fired["status"] == "queued", fired
    await call("POST", f"{t}/fire", 202, token=token, json={"payload": {"version": "2"}})
    await call("POST", f"{t}/fire", 202, token=token, json={"payload": None})
    await call("POST", f"{t}/rotate-secret", 200, token=token)
    rotated = await call(
        "POST", f"{t}/rotate-secret", 200, token=token, json={"previous_valid_for_s": 0}
    )
    secret = rotated["webhook_secret"]
    hook = f"/v1/hooks/triggers/{trigger['id']}"
    as_json = {"content-type": "application/json"}
    body = b'{"version": "1.2.3"}'
    accepted = await call(
        "POST", hook, 202, content=body, headers={**as_json, **sign(secret, body)}
    )
    await call("POST", hook, 202, headers=sign(secret, b""))  # no body: a null payload
    forged = sign("whsec_" + base64.b64encode(b"not the secret" * 3).decode(), body)
    await call("POST", hook, 401, content=body, headers={**as_json, **forged})
    huge = json.dumps({"version": "x" * (256 * 1024)}).encode()
    await call("POST", hook, 413, content=huge, headers={**as_json, **sign(secret, huge)})
    listed = await call("GET", f"{t}/executions", 200, token=token)
    assert any(e["payload"] is None for e in listed["executions"])
    await call("GET", f"{t}/executions/{accepted['execution_id']}", 200, token=token)
    await call("GET", f"{t}/executions?status=queued", 200, token=token)
    await call("PATCH", t, 200, token=token, json={"status": "inactive"})
    await call("POST", hook, 409, content=body, headers={**as_json, **sign(secret, body)})
