"""The set-up a CI job needs before it pushes scenarios and runs them, without curl:
``spar orgs create``, ``spar hosts allow``, ``spar credentials set``, ``spar providers
add``, ``spar agents add`` and ``spar tokens create``.

Each prints what it made (``--json``: the API's answer, for scripts).  Names are keys,
as in ``spar scenarios push``: naming an organization, a host, a provider or an agent
that exists updates it, or leaves it as it is, rather than making a second one, so a
set-up script can run again.  A platform token is made anew each time.  The CLI takes
names where the REST API takes ids (an agent's provider, a run's agent) and looks them up.

Secrets (API keys, credential values) come from standard input, an environment variable
the command is told, or a prompt without echo (:func:`client.terminal.read_secret`),
and are never printed; the one exception is a new platform token, shown once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
import msgspec

from client.api import Api, UsageProblem
from client.profiles import org_option, profile_option, save_profile, target
from client.terminal import json_option, make_console, print_json, read_secret, say
from shared.identity.permissions import ALL_PERMISSIONS
from shared.identity.schemas import OrganizationRead, PlatformTokenCreated
from shared.outbound.schemas import AgentRead, AllowedDomainRead, CredentialRead, LLMProviderRead

T = TypeVar("T")
# What `spar scenarios push` and `spar batch run` need, and no more: a CI job's token.
CI_PERMISSIONS = ("scenarios:read", "scenarios:write", "scenarios:run", "agents:read")
PROVIDER_KINDS = ("openai", "anthropic", "openai_compatible")
NEEDS_A_KEY = ("openai", "anthropic")


def _connected(profile: str | None, org: str | None) -> Api:
    return Api(target(profile, org))


def _named(api: Api, rest: str, key: str, name: str, field: str = "name") -> dict[str, Any] | None:
    """The organization's item of ``rest`` whose ``field`` is ``name``; ``None`` when none."""
    found = [item for item in api.pages(rest, key) if item[field] == name]
    if len(found) > 1:
        raise UsageProblem(f"{len(found)} {key} are named {name!r}: rename all but one")
    return found[0] if found else None


def _provider_id(api: Api, name_or_id: str) -> str:
    for provider in api.pages("llm-providers", "llm_providers"):
        if name_or_id in (provider["id"], provider["name"]):
            return str(provider["id"])
    raise UsageProblem(f"no LLM provider {name_or_id!r} (spar providers add NAME makes one)")


def _show(as_json: bool, made: Any, *lines: str) -> None:
    if as_json:
        print_json(made)
        return
    console = make_console()
    for line in lines:
        say(console, line)


def _read(api: Api, method: str, rest: str, into: type[T], body: dict[str, Any]) -> T:
    return api.read(api.path(rest), into, method=method, json=body)


def _setter(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options every command of an organization takes."""
    return profile_option(org_option(json_option(command)))


# --- organizations --------------------------------------------------------------------------------


@click.group("orgs")
def orgs() -> None:
    """Organizations."""


@orgs.command("create")
@click.argument("name")
@click.option(
    "--timezone", metavar="ZONE", default="UTC", show_default=True, help="Its IANA time zone."
)
@profile_option
@json_option
def create_org(name: str, timezone: str, profile: str | None, as_json: bool) -> None:
    """Create the organization NAME with you as its OWNER (a user's token: spar login),
    unless you already reach one of that name; the profile in use then keeps it, so the
    other commands work in it without --org."""
    chosen = target(profile)
    api = Api(chosen)
    try:
        existing = [o for o in api.organizations() if o["name"] == name]
        if existing:
            made = msgspec.convert(existing[0], OrganizationRead)
            verb = "exists"
        else:
            body = {"name": name, "timezone": timezone}
            made = api.read("/v1/organizations", OrganizationRead, method="POST", json=body)
            verb = "created"
    finally:
        api.close()
    lines = [f"organization {made.name} ({made.id}) {verb}"]
    if chosen.profile is not None:
        save_profile(chosen.profile, org=str(made.id))
        lines.append(f"profile {chosen.profile!r} now works in {made.name}")
    _show(as_json, made, *lines)


# --- hosts Spar may call ------------------------------------------------------------------------


def _header(raw: str) -> tuple[str, str]:
    name, colon, value = raw.partition(":")
    if not colon or not name.strip():
        raise click.BadParameter(f"{raw!r}: give 'Name: value'", param_hint="--header")
    return name.strip(), value.strip()


@click.group("hosts")
def hosts() -> None:
    """The hosts Spar may call (the organization's allowed domains)."""


@hosts.command("allow")
@click.argument("host")
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="A header added to every call to the host (repeatable); a value may hold "
    "{{credentials.KEY}} (spar credentials set KEY).",
)
@_setter
def allow_host(
    host: str, headers: tuple[str, ...], profile: str | None, org: str | None, as_json: bool
) -> None:
    """Let Spar call HOST: a host name, an IP address or *.example.com (no scheme, port or
    path; every port of the host).  Agents and LLM providers are called only on allowed
    hosts.  An allowed host is left as it is, or given the --header values."""
    wanted = dict(_header(h) for h in headers)
    api = _connected(profile, org)
    try:
        key = host.strip().lower().rstrip(".")
        existing = _named(api, "allowed-domains", "domains", key, field="domain")
        if existing is None:
            body = {"domain": host, "headers": wanted}
            made = _read(api, "POST", "allowed-domains", AllowedDomainRead, body)
            verb = "allowed"
        elif wanted and wanted != existing["headers"]:
            rest = f"allowed-domains/{existing['id']}"
            made = _read(api, "PATCH", rest, AllowedDomainRead, {"headers": wanted})
            verb = "allowed, its headers updated"
        else:
            made = msgspec.convert(existing, AllowedDomainRead)
            verb = "was already allowed"
    finally:
        api.close()
    names = f" with headers {', '.join(made.headers)}" if made.headers else ""
    _show(as_json, made, f"host {made.domain} ({made.id}) {verb}{names}")


# --- credentials ---------------------------------------------------------------------------------


@click.group("credentials")
def credentials() -> None:
    """Secrets Spar sends on your behalf (API keys, agents' tokens)."""


@credentials.command("set")
@click.argument("key")
@click.option("--value-stdin", is_flag=True, help="Read the secret from standard input.")
@click.option(
    "--value-env", metavar="VAR", help="Read the secret from the environment variable VAR."
)
@click.option("--description", default="", help="What the secret is for (shown in listings).")
@_setter
def set_credential(
    key: str,
    value_stdin: bool,
    value_env: str | None,
    description: str,
    profile: str | None,
    org: str | None,
    as_json: bool,
) -> None:
    """Store the secret KEY (made or replaced), encrypted; Spar never shows it again.  It
    is read from standard input (--value-stdin), the variable --value-env names, or asked
    without echo.  A provider uses it as its API key (spar providers add --credential
    KEY), a host's header as {{credentials.KEY}} (spar hosts allow --header)."""
    value = read_secret(f"value of {key}", from_stdin=value_stdin, env=value_env)
    api = _connected(profile, org)
    try:
        body = {"value": value, "description": description}
        made = _read(api, "PUT", f"credentials/{key}", CredentialRead, body)
    finally:
        api.close()
    _show(as_json, made, f"credential {made.key} stored (its value is never shown)")


# --- LLM providers -------------------------------------------------------------------------------


def _key_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).upper() + "_API_KEY"


@click.group("providers")
def providers() -> None:
    """LLM providers: the judge, and the model behind llm agents."""


@providers.command("add")
@click.argument("name")
@click.option(
    "--provider",
    "kind",
    type=click.Choice(PROVIDER_KINDS),
    required=True,
    help="The API it speaks.",
)
@click.option("--model", required=True, metavar="MODEL", help="Its default model.")
@click.option(
    "--base-url",
    metavar="URL",
    help="Its API's base URL: required for openai_compatible, with the version path "
    "(http://127.0.0.1:11434/v1); see docs/agents.md.",
)
@click.option("--api-key-stdin", is_flag=True, help="Read the API key from standard input.")
@click.option(
    "--api-key-env", metavar="VAR", help="Read the API key from the environment variable VAR."
)
@click.option(
    "--credential",
    "credential_key",
    metavar="KEY",
    help="The credential holding the API key: where a given key is stored (default: "
    "NAME_API_KEY), else an existing credential to use.",
)
@click.option("--judge", is_flag=True, help="Make it the organization's default judge.")
@_setter
def add_provider(
    name: str,
    kind: str,
    model: str,
    base_url: str | None,
    api_key_stdin: bool,
    api_key_env: str | None,
    credential_key: str | None,
    judge: bool,
    profile: str | None,
    org: str | None,
    as_json: bool,
) -> None:
    """Add the LLM provider NAME, or update the one of that name.  Its API key is stored
    as a credential, read from standard input (--api-key-stdin), the variable
    --api-key-env names, or asked without echo (openai and anthropic; an
    openai_compatible provider may need none).  Its host must be allowed (spar hosts
    allow)."""
    key = None
    if api_key_stdin or api_key_env or (kind in NEEDS_A_KEY and credential_key is None):
        key = read_secret(f"API key of {name}", from_stdin=api_key_stdin, env=api_key_env)
    api = _connected(profile, org)
    try:
        if key is not None:
            credential_key = credential_key or _key_name(name)
            body = {"value": key, "description": f"API key of the LLM provider {name}"}
            _read(api, "PUT", f"credentials/{credential_key}", CredentialRead, body)
        fields: dict[str, Any] = {"provider": kind, "default_model": model}
        if base_url is not None:
            fields["base_url"] = base_url
        if credential_key is not None:
            fields["credential_key"] = credential_key
        if judge:
            fields["is_default_judge"] = True
        existing = _named(api, "llm-providers", "llm_providers", name)
        if existing is None:
            body = {"name": name, **fields}
            made = _read(api, "POST", "llm-providers", LLMProviderRead, body)
            verb = "added"
        else:
            rest = f"llm-providers/{existing['id']}"
            made = _read(api, "PATCH", rest, LLMProviderRead, fields)
            verb = "updated"
    finally:
        api.close()
    key_line = f", API key in credential {made.credential_key}" if made.credential_key else ""
    judge_line = ", the default judge" if made.is_default_judge else ""
    _show(
        as_json,
        made,
        f"provider {made.name} ({made.id}) {verb}: {made.provider} at {made.base_url}, model "
        f"{made.default_model}{key_line}{judge_line}",
    )


# --- agents ----------------------------------------------------------------------------------


@click.group("agents")
def agents() -> None:
    """The agents Spar tests."""


@agents.command("add")
@click.argument("name")
@click.option(
    "--url",
    "endpoint_url",
    metavar="URL",
    help="An http agent: the URL Spar POSTs each turn to (its host allowed: spar hosts allow).",
)
@click.option(
    "--protocol",
    type=click.Choice(("spar", "openai_chat")),
    help="What the http agent speaks (default: spar); see docs/agents.md.",
)
@click.option(
    "--llm",
    "llm_provider",
    metavar="PROVIDER",
    help="An llm agent: the LLM provider, by name or id, whose model answers.",
)
@click.option(
    "--model",
    metavar="MODEL",
    help="The model: an llm agent's (default: the provider's), or the model field an "
    "openai_chat agent is sent (default: the agent's name).",
)
@click.option("--system-prompt", metavar="TEXT", help="An llm agent's system prompt.")
@click.option(
    "--judge",
    "judge_provider",
    metavar="PROVIDER",
    help="The provider, by name or id, that judges its llm_evaluated criteria (default: "
    "the organization's default judge).",
)
@click.option("--judge-model", metavar="MODEL", help="The judge's model (default: its provider's).")
@click.option("--description", help="What the agent is.")
@_setter
def add_agent(
    name: str,
    endpoint_url: str | None,
    protocol: str | None,
    llm_provider: str | None,
    model: str | None,
    system_prompt: str | None,
    judge_provider: str | None,
    judge_model: str | None,
    description: str | None,
    profile: str | None,
    org: str | None,
    as_json: bool,
) -> None:
    """Add the agent NAME, or update the one of that name: an http agent (--url: your
    service) or an llm agent (--llm: a provider's model with a system prompt).  The REST
    API takes providers and, to run, agents by id (llm_provider_id, agent_id); the CLI
    takes their names and looks them up (spar batch run --agent NAME)."""
    if endpoint_url and llm_provider:
        raise click.UsageError("give --url (an http agent) or --llm (an llm agent), not both")
    api = _connected(profile, org)
    try:
        existing = _named(api, "agents", "agents", name)
        if existing is None and not (endpoint_url or llm_provider):
            raise click.UsageError("give --url (an http agent) or --llm (an llm agent)")
        fields: dict[str, Any] = {}
        if endpoint_url:
            fields.update(kind="http", endpoint_url=endpoint_url, llm_provider_id=None)
            fields["protocol"] = protocol or "spar"
        elif protocol:
            fields["protocol"] = protocol
        if llm_provider:
            fields.update(kind="llm", llm_provider_id=_provider_id(api, llm_provider))
            fields.update(endpoint_url=None, protocol=None)
        optional = {
            "model": model,
            "system_prompt": system_prompt,
            "judge_model": judge_model,
            "description": description,
        }
        fields.update({k: v for k, v in optional.items() if v is not None})
        if judge_provider:
            fields["judge_provider_id"] = _provider_id(api, judge_provider)
        if existing is None:
            made = _read(api, "POST", "agents", AgentRead, {"name": name, **fields})
            verb = "added"
        else:
            made = _read(api, "PATCH", f"agents/{existing['id']}", AgentRead, fields)
            verb = "updated"
    finally:
        api.close()
    what = (
        f"http agent at {made.endpoint_url} ({made.protocol})"
        if made.kind == "http"
        else f"llm agent on provider {llm_provider or made.llm_provider_id}"
    )
    if made.judge_provider_id:
        what += f", judged by provider {judge_provider or made.judge_provider_id}"
    _show(as_json, made, f"agent {made.name} ({made.id}) {verb}: {what}")


# --- platform tokens -----------------------------------------------------------------------------


@click.group("tokens")
def tokens() -> None:
    """Platform tokens: an organization's tokens for machines (CI)."""


@tokens.command("create")
@click.argument("name")
@click.option(
    "--permission",
    "permissions",
    multiple=True,
    type=click.Choice(ALL_PERMISSIONS),
    metavar="PERMISSION",
    help=f"A permission it holds (repeatable; default: {', '.join(CI_PERMISSIONS)}, what "
    "spar scenarios push and spar batch run need). See docs/permissions.md.",
)
@click.option(
    "--expires-in",
    "days",
    type=click.IntRange(min=1),
    metavar="DAYS",
    help="It expires after DAYS days (default: never; revoke it to end it).",
)
@_setter
def create_token(
    name: str,
    permissions: tuple[str, ...],
    days: int | None,
    profile: str | None,
    org: str | None,
    as_json: bool,
) -> None:
    """Create the platform token NAME (ADMIN or OWNER) and print it, this once: give it to
    CI as SPAR_TOKEN, with SPAR_URL.  It reaches its one organization with its
    permissions only."""
    body: dict[str, Any] = {"name": name, "permissions": list(permissions or CI_PERMISSIONS)}
    if days is not None:
        body["expires_at"] = (datetime.now(UTC) + timedelta(days=days)).isoformat()
    api = _connected(profile, org)
    try:
        made = _read(api, "POST", "platform-tokens", PlatformTokenCreated, body)
    finally:
        api.close()
    expiry = f"expires {made.expires_at:%Y-%m-%d}" if made.expires_at else "never expires"
    _show(
        as_json,
        made,
        f"platform token {made.name} ({made.id}) created: {', '.join(made.permissions)}; {expiry}",
        "the token, shown this once (keep it as CI's SPAR_TOKEN):",
        made.token,
    )
