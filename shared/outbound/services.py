"""Outbound configuration rules: writing an organization's allowed domains, credentials,
LLM providers and agents, and reading them as the API shows them.

Every function takes the caller's session (the caller owns the transaction) and the
caller's :class:`OrgAccess`.  What a run loads of this configuration to call out with is
:mod:`shared.outbound.configuration`'s.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID, uuid4

import msgspec
from psycopg import AsyncConnection
from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.crypto import secret_box
from shared.db.direct import Statement, read_together
from shared.db.models import (
    Agent,
    AllowedDomain,
    Credential,
    LLMProvider,
    Organization,
    Scenario,
    Trigger,
)
from shared.db.queries import flush_unique, found, one_in_org, page_in_org, row_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.llm.clients import ANTHROPIC_VERSION
from shared.llm.models import MAX_OPTIONS_BYTES, spar_field_in
from shared.outbound import schemas
from shared.outbound.egress import CREDENTIAL_REF
from shared.paging import Paging
from shared.settings import Settings

Row = TypeVar("Row", LLMProvider, Agent)

_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


# --- validation ------------------------------------------------------------------------------


def normalize_domain(raw: str, loc: tuple[str, ...] = ("body", "domain")) -> str:
    """A host name, an IP address or ``*.suffix``: no scheme, path, port or user info."""
    domain = raw.strip().lower().rstrip(".")

    def invalid(why: str) -> InvalidInput:
        return InvalidInput(loc, f"Invalid domain: {why}", input=raw)

    if not domain:
        raise invalid("empty")
    if "://" in domain or any(c in domain for c in "/?#@ \t"):
        raise invalid("give a host name, IP or *.suffix, without scheme, path or user")
    try:
        return str(ipaddress.ip_address(domain.strip("[]")))
    except ValueError:
        pass
    if ":" in domain:
        raise invalid("no port: the entry allows every port of the host")
    host = domain[2:] if domain.startswith("*.") else domain
    if "*" in host:
        raise invalid("a wildcard is only allowed as a leading '*.'")
    labels = host.split(".")
    if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        raise invalid("not a valid host name")
    if domain.startswith("*.") and len(labels) < 2:
        raise invalid("a wildcard needs a suffix of at least two labels, e.g. *.example.com")
    return domain


def check_url(url: str, loc: tuple[str, ...]) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        _ = parts.port  # raises for a port that is not a number from 0 to 65535
    except ValueError:  # an unclosed "[" (IPv6), a bad port
        raise InvalidInput(loc, "Expected an absolute http(s) URL", input=url) from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise InvalidInput(loc, "Expected an absolute http(s) URL", input=url)
    return url


def _check_header_map(values: dict[str, str], loc: tuple[str, ...], *, headers: bool) -> None:
    for name, value in values.items():
        if headers and not _HEADER_NAME.match(name):
            raise InvalidInput((*loc, name), "Invalid header name", input=name)
        if "\r" in value or "\n" in value:
            raise InvalidInput((*loc, name), "Values cannot contain line breaks", input=value)


def referenced_credentials(*maps: dict[str, str]) -> set[str]:
    return {
        key for values in maps for value in values.values() for key in CREDENTIAL_REF.findall(value)
    }


async def _require_credentials(
    session: AsyncSession, org_id: UUID, keys: set[str], loc: tuple[str, ...]
) -> None:
    if not keys:
        return
    found = set(
        await session.scalars(
            select(Credential.key).where(
                Credential.organization_id == org_id, Credential.key.in_(keys)
            )
        )
    )
    missing = sorted(keys - found)
    if missing:
        raise InvalidInput(
            loc, f"Unknown credential: {', '.join(missing)}; create it first", input=missing
        )


# --- allowed domains ---------------------------------------------------------------------------


async def list_domains(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[Sequence[Any], int]:
    return await page_in_org(connection, AllowedDomain, access.organization_id, paging)


async def get_domain(session: AsyncSession, *, access: OrgAccess, domain_id: UUID) -> AllowedDomain:
    return await one_in_org(
        session, AllowedDomain, access.organization_id, domain_id, "allowed domain"
    )


async def read_domain(
    connection: AsyncConnection[Any], *, access: OrgAccess, domain_id: UUID
) -> Any:
    return await row_in_org(
        connection, AllowedDomain, access.organization_id, domain_id, "allowed domain"
    )


async def _check_domain_maps(
    session: AsyncSession, org_id: UUID, headers: dict[str, str], query_params: dict[str, str]
) -> None:
    _check_header_map(headers, ("body", "headers"), headers=True)
    _check_header_map(query_params, ("body", "query_params"), headers=False)
    await _require_credentials(
        session, org_id, referenced_credentials(headers), ("body", "headers")
    )
    await _require_credentials(
        session, org_id, referenced_credentials(query_params), ("body", "query_params")
    )


async def create_domain(
    session: AsyncSession, *, access: OrgAccess, body: schemas.AllowedDomainCreate
) -> AllowedDomain:
    domain = normalize_domain(body.domain)
    await _check_domain_maps(session, access.organization_id, body.headers, body.query_params)
    entry = AllowedDomain(
        organization_id=access.organization_id,
        domain=domain,
        headers=dict(body.headers),
        query_params=dict(body.query_params),
    )
    session.add(entry)
    await flush_unique(session, f"{domain} is already allowed")
    return entry


async def update_domain(
    session: AsyncSession, *, access: OrgAccess, domain_id: UUID, body: schemas.AllowedDomainUpdate
) -> AllowedDomain:
    entry = await get_domain(session, access=access, domain_id=domain_id)
    domain = {} if body.domain is schemas.UNSET else {"domain": normalize_domain(body.domain)}
    # The maps as they will be, each the body's or else the entry's.
    changed = {"headers": entry.headers, "query_params": entry.query_params} | body.changes()
    await _check_domain_maps(
        session, access.organization_id, changed["headers"], changed["query_params"]
    )
    body.apply_to(entry, **domain)
    await flush_unique(session, f"{entry.domain} is already allowed")
    return entry


async def delete_domain(session: AsyncSession, *, access: OrgAccess, domain_id: UUID) -> None:
    await session.delete(await get_domain(session, access=access, domain_id=domain_id))
    await session.flush()


# --- credentials --------------------------------------------------------------------------------


async def _credential(session: AsyncSession, org_id: UUID, key: str) -> Credential:
    credential = await session.scalar(
        select(Credential).where(Credential.organization_id == org_id, Credential.key == key)
    )
    if credential is None:
        raise NotFound("credential not found")
    return credential


async def put_credential(
    session: AsyncSession,
    *,
    settings: Settings,
    access: OrgAccess,
    key: str,
    body: schemas.CredentialPut,
) -> tuple[Credential, bool]:
    """Create or replace the credential ``key``; returns it and whether it was created."""
    ciphertext = secret_box(settings.secret_key).encrypt(body.value)
    credential = await session.scalar(
        select(Credential)
        .where(Credential.organization_id == access.organization_id, Credential.key == key)
        .with_for_update()
    )
    created = credential is None
    if credential is None:
        credential = Credential(organization_id=access.organization_id, key=key)
        session.add(credential)
    credential.ciphertext = ciphertext
    credential.description = body.description
    await flush_unique(session, f"credential {key} was created concurrently; retry")
    return credential, created


async def list_credentials(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[Sequence[Any], int]:
    return await page_in_org(connection, Credential, access.organization_id, paging)


# What references a credential: the providers naming it (``credential_key``) and the
# domains, of which those with a ``{{credentials.KEY}}`` in a header or query value are
# kept (:func:`_usage`).  Read alike by the API's read, straight on psycopg, and by a
# delete, in its transaction.
_providers, _domains = LLMProvider.__table__, AllowedDomain.__table__
_USING_KEY = (
    select(_providers.c.id, _providers.c.provider, _providers.c.name)
    .where(
        _providers.c.organization_id == bindparam("p_org"),
        _providers.c.credential_key == bindparam("p_key"),
    )
    .order_by(_providers.c.created_at, _providers.c.id),
    select(_domains.c.id, _domains.c.domain, _domains.c.headers, _domains.c.query_params)
    .where(_domains.c.organization_id == bindparam("p_org"))
    .order_by(_domains.c.created_at, _domains.c.id),
)
_KEY_IN_ORG = select(Credential.__table__.c.key).where(
    Credential.__table__.c.organization_id == bindparam("p_org"),
    Credential.__table__.c.key == bindparam("p_key"),
)
_USAGE = [Statement(query) for query in (_KEY_IN_ORG, *_USING_KEY)]


def _usage(key: str, providers: Sequence[Any], domains: Sequence[Any]) -> schemas.CredentialUsage:
    return schemas.CredentialUsage(
        llm_providers=[schemas.ProviderReference.from_row(p) for p in providers],
        domains=[
            schemas.DomainReference.from_row(d)
            for d in domains
            if key in referenced_credentials(d.headers, d.query_params)
        ],
    )


async def credential_usage(
    connection: AsyncConnection[Any], *, access: OrgAccess, key: str
) -> schemas.CredentialUsage:
    """Exactly the providers and domains that reference ``key`` (404 when the organization
    has no such credential): three reads in one round trip."""
    given = {"p_org": access.organization_id, "p_key": key}
    keys, providers, domains = await read_together(
        connection, *((statement, given) for statement in _USAGE)
    )
    found(keys, "credential")
    return _usage(key, providers, domains)


async def delete_credential(session: AsyncSession, *, access: OrgAccess, key: str) -> None:
    credential = await _credential(session, access.organization_id, key)
    given = {"p_org": access.organization_id, "p_key": key}
    usage = _usage(key, *[(await session.execute(query, given)).all() for query in _USING_KEY])
    if usage.llm_providers or usage.domains:
        names = [f"llm provider {p.name} ({p.id})" for p in usage.llm_providers] + [
            f"domain {d.domain} ({d.id})" for d in usage.domains
        ]
        raise Conflict(f"credential {key} is referenced by {', '.join(names)}")
    await session.delete(credential)
    await session.flush()


# --- LLM providers and agents: written under the organization's outbound lock -------------


async def _lock_outbound(session: AsyncSession, org_id: UUID) -> None:
    """Wait for the organization's other writers of providers and agents, then hold them
    off until this transaction ends.

    At most one default judge (and one default simulator) per organization (partial
    unique indexes say it too): a provider becomes it by clearing the others in the same
    transaction, and two doing so at once would each find none to clear.  So every write
    to an organization's providers takes its organization row first (FOR NO KEY UPDATE:
    rows that merely reference the organization are still inserted meanwhile), before it
    reads what it changes.  Agents too: an agent's row holds its providers' rows (foreign
    keys), and the trigger of migration 0008 takes the organization row after any row
    written, so a writer that took them in the other order could deadlock with one of
    these."""
    await session.execute(
        select(Organization.id).where(Organization.id == org_id).with_for_update(key_share=True)
    )


@dataclass(frozen=True, slots=True)
class _Kind(Generic[Row]):
    """LLM providers or agents: what is written of them the same way."""

    model: type[Row]
    what: str
    # Checks a row as built or changed, and fills in its defaults (reads do not flush it).
    settle: Callable[[AsyncSession, Row], Awaitable[None]]
    # The names of the rows that need this one, by their kind ("agents": [...]): it is not
    # deleted while there are any.
    used_by: Callable[[AsyncSession, Row], Awaitable[dict[str, list[str]]]]

    async def get(self, session: AsyncSession, org_id: UUID, row_id: UUID) -> Row:
        return await one_in_org(session, self.model, org_id, row_id, self.what)

    async def read(self, connection: AsyncConnection[Any], access: OrgAccess, row_id: UUID) -> Any:
        return await row_in_org(connection, self.model, access.organization_id, row_id, self.what)

    async def page(
        self, connection: AsyncConnection[Any], access: OrgAccess, paging: Paging
    ) -> tuple[Sequence[Any], int]:
        return await page_in_org(connection, self.model, access.organization_id, paging)

    async def create(self, session: AsyncSession, access: OrgAccess, body: schemas.Input) -> Row:
        await _lock_outbound(session, access.organization_id)
        row = self.model(id=uuid4(), organization_id=access.organization_id, **body.changes())
        return await self._write(session, row)

    async def update(
        self, session: AsyncSession, access: OrgAccess, row_id: UUID, body: schemas.Input
    ) -> Row:
        await _lock_outbound(session, access.organization_id)
        row = await self.get(session, access.organization_id, row_id)
        body.apply_to(row)
        return await self._write(session, row)

    async def delete(self, session: AsyncSession, access: OrgAccess, row_id: UUID) -> None:
        await _lock_outbound(session, access.organization_id)
        row = await self.get(session, access.organization_id, row_id)
        users = {kind: names for kind, names in (await self.used_by(session, row)).items() if names}
        if users:
            named = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in users.items())
            raise Conflict(f"{self.what} is used by {named}")
        await session.delete(row)
        await session.flush()

    async def _write(self, session: AsyncSession, row: Row) -> Row:
        await self.settle(session, row)
        session.add(row)
        await session.flush()
        return row


async def _settle_provider(session: AsyncSession, provider: LLMProvider) -> None:
    """Kind-specific rules, credential existence, and a single default judge and default
    simulator per org (the caller holds :func:`_lock_outbound`: the last to commit is the
    default)."""
    # The others first, before this provider is flushed (the reads below would autoflush
    # it): the unique indexes allow one default of each at any moment.
    for flag in (LLMProvider.is_default_judge, LLMProvider.is_default_simulator):
        if getattr(provider, flag.key):
            with session.no_autoflush:
                await session.execute(
                    update(LLMProvider)
                    .where(
                        LLMProvider.organization_id == provider.organization_id,
                        flag,
                        LLMProvider.id != provider.id,
                    )
                    .values({flag.key: False})
                )
    if provider.base_url is None:
        if provider.provider == "openai_compatible":
            raise InvalidInput(
                ("body", "base_url"), "base_url is required for openai_compatible providers"
            )
        provider.base_url = DEFAULT_BASE_URLS[provider.provider]
    check_url(provider.base_url, ("body", "base_url"))
    _check_request_options(provider.request_options)
    if provider.provider == "anthropic":
        provider.anthropic_version = provider.anthropic_version or ANTHROPIC_VERSION
    elif provider.anthropic_version is not None:
        raise InvalidInput(
            ("body", "anthropic_version"),
            f"anthropic_version is for anthropic providers only; {provider.provider} takes "
            "none (set it to null when changing the provider's kind)",
            input=provider.anthropic_version,
        )
    if provider.credential_key:
        await _require_credentials(
            session, provider.organization_id, {provider.credential_key}, ("body", "credential_key")
        )


def _check_request_options(options: dict[str, Any]) -> None:
    """Bounded in size, and none of the fields Spar sets itself (shared.llm.models)."""
    size = len(msgspec.json.encode(options))
    if size > MAX_OPTIONS_BYTES:
        raise InvalidInput(
            ("body", "request_options"),
            f"request_options is {size} bytes as JSON; at most {MAX_OPTIONS_BYTES} are taken",
            type="too_long",
            ctx={"max_length": MAX_OPTIONS_BYTES},
        )
    owned = spar_field_in(options)
    if owned is not None:
        raise InvalidInput(
            ("body", "request_options", *owned),
            f"{'.'.join(owned)} is set by Spar itself; request_options cannot set it",
            input=options[owned[0]] if len(owned) == 1 else options[owned[0]][owned[1]],
        )


async def _provider_users(session: AsyncSession, provider: LLMProvider) -> dict[str, list[str]]:
    """The agents calling the provider (as their model or their judge) and the scenarios
    whose simulated user it plays."""
    agents = await session.scalars(
        select(Agent.name).where(
            Agent.organization_id == provider.organization_id,
            (Agent.llm_provider_id == provider.id) | (Agent.judge_provider_id == provider.id),
        )
    )
    scenarios = await session.scalars(
        select(Scenario.name).where(
            Scenario.organization_id == provider.organization_id,
            Scenario.simulation["provider_id"].astext == str(provider.id),
        )
    )
    return {"agents": sorted(agents), "scenarios (as their simulator)": sorted(scenarios)}


async def _settle_agent(session: AsyncSession, agent: Agent) -> None:
    """Kind-specific rules and defaults, and providers of the agent's organization only.
    The reads do not flush the agent's change first: a provider id that names no row is
    answered 404 here, not met by its foreign key in PostgreSQL."""
    with session.no_autoflush:
        if agent.kind == "http":
            if not agent.endpoint_url:
                raise InvalidInput(
                    ("body", "endpoint_url"), "endpoint_url is required for http agents"
                )
            check_url(agent.endpoint_url, ("body", "endpoint_url"))
            agent.protocol = agent.protocol or "spar"
        elif agent.llm_provider_id is None:
            raise InvalidInput(
                ("body", "llm_provider_id"), "llm_provider_id is required for llm agents"
            )
        # Every provider reference must be a provider of this organization, whatever the kind.
        if agent.llm_provider_id is not None:
            provider = await provider_in_org(
                session, org_id=agent.organization_id, provider_id=agent.llm_provider_id
            )
            if agent.kind == "llm":
                agent.model = agent.model or provider.default_model
        if agent.judge_provider_id is not None:
            await provider_in_org(
                session, org_id=agent.organization_id, provider_id=agent.judge_provider_id
            )


async def _triggers_naming(session: AsyncSession, agent: Agent) -> dict[str, list[str]]:
    names = await session.scalars(
        select(Trigger.name).where(Trigger.agent_id == agent.id).order_by(Trigger.name)
    )
    return {"triggers": list(names)}


_PROVIDERS = _Kind(LLMProvider, "llm provider", _settle_provider, _provider_users)
_AGENTS = _Kind(Agent, "agent", _settle_agent, _triggers_naming)


async def provider_in_org(session: AsyncSession, *, org_id: UUID, provider_id: UUID) -> LLMProvider:
    return await _PROVIDERS.get(session, org_id, provider_id)


async def agent_in_org(session: AsyncSession, *, org_id: UUID, agent_id: UUID) -> Agent:
    return await _AGENTS.get(session, org_id, agent_id)


async def list_providers(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[Sequence[Any], int]:
    return await _PROVIDERS.page(connection, access, paging)


async def read_provider(
    connection: AsyncConnection[Any], *, access: OrgAccess, provider_id: UUID
) -> Any:
    return await _PROVIDERS.read(connection, access, provider_id)


async def create_provider(
    session: AsyncSession, *, access: OrgAccess, body: schemas.LLMProviderCreate
) -> LLMProvider:
    return await _PROVIDERS.create(session, access, body)


async def update_provider(
    session: AsyncSession, *, access: OrgAccess, provider_id: UUID, body: schemas.LLMProviderUpdate
) -> LLMProvider:
    return await _PROVIDERS.update(session, access, provider_id, body)


async def delete_provider(session: AsyncSession, *, access: OrgAccess, provider_id: UUID) -> None:
    """Delete a provider no agent or scenario uses (409 names them)."""
    await _PROVIDERS.delete(session, access, provider_id)


async def list_agents(
    connection: AsyncConnection[Any], *, access: OrgAccess, paging: Paging
) -> tuple[Sequence[Any], int]:
    return await _AGENTS.page(connection, access, paging)


async def read_agent(connection: AsyncConnection[Any], *, access: OrgAccess, agent_id: UUID) -> Any:
    return await _AGENTS.read(connection, access, agent_id)


async def create_agent(
    session: AsyncSession, *, access: OrgAccess, body: schemas.AgentCreate
) -> Agent:
    return await _AGENTS.create(session, access, body)


async def update_agent(
    session: AsyncSession, *, access: OrgAccess, agent_id: UUID, body: schemas.AgentUpdate
) -> Agent:
    return await _AGENTS.update(session, access, agent_id, body)


async def delete_agent(session: AsyncSession, *, access: OrgAccess, agent_id: UUID) -> None:
    """Delete an agent no trigger names (409 names the triggers)."""
    await _AGENTS.delete(session, access, agent_id)
