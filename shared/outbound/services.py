"""Outbound configuration rules: allowed domains, credentials, LLM providers, agents.

Also builds what the egress client needs at call time (:func:`load_egress_policy`,
:func:`load_provider`, both together for a run in :func:`load_outbound`): the org's
allow-list with credentials resolved, and a provider with its API key decrypted.
Decrypted values live only in a worker's memory (for a call, or in the run configuration
cache until a change to the organization's outbound configuration replaces them); they
are never stored, returned or logged.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections import OrderedDict
from dataclasses import dataclass
from uuid import UUID, uuid4

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from shared.crypto import secret_box
from shared.db.base import utcnow
from shared.db.engine import Database
from shared.db.models import Agent, AllowedDomain, Credential, LLMProvider, Organization, Trigger
from shared.db.queries import flush_unique, one_in_org
from shared.errors import Conflict, InvalidInput, NotFound
from shared.identity.access import OrgAccess
from shared.outbound import schemas
from shared.outbound.agents import AgentConfig
from shared.outbound.egress import CREDENTIAL_REF, DomainRule, EgressPolicy, ProviderConfig
from shared.paging import Paging, paginate
from shared.settings import Settings

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


def _check_url(url: str, loc: tuple[str, ...]) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
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
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[AllowedDomain], int]:
    query = select(AllowedDomain).where(AllowedDomain.organization_id == access.organization_id)
    return await paginate(session, query, paging, AllowedDomain.created_at, AllowedDomain.id)


async def get_domain(session: AsyncSession, *, access: OrgAccess, domain_id: UUID) -> AllowedDomain:
    return await one_in_org(
        session, AllowedDomain, access.organization_id, domain_id, "allowed domain"
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
    if body.domain is not schemas.UNSET:
        entry.domain = normalize_domain(body.domain)
    headers = entry.headers if body.headers is schemas.UNSET else dict(body.headers)
    query_params = (
        entry.query_params if body.query_params is schemas.UNSET else dict(body.query_params)
    )
    await _check_domain_maps(session, access.organization_id, headers, query_params)
    entry.headers, entry.query_params = headers, query_params
    entry.updated_at = utcnow()
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
    now = utcnow()
    if credential is None:
        credential = Credential(
            organization_id=access.organization_id, key=key, ciphertext=ciphertext, created_at=now
        )
        session.add(credential)
    credential.ciphertext = ciphertext
    credential.description = body.description
    credential.updated_at = now
    await flush_unique(session, f"credential {key} was created concurrently; retry")
    return credential, created


async def list_credentials(
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[Credential], int]:
    query = select(Credential).where(Credential.organization_id == access.organization_id)
    return await paginate(session, query, paging, Credential.created_at, Credential.id)


async def credential_usage(
    session: AsyncSession, *, access: OrgAccess, key: str
) -> schemas.CredentialUsage:
    """Exactly the providers (``credential_key``) and domains (a ``{{credentials.KEY}}``
    in a header or query value) that reference ``key``."""
    await _credential(session, access.organization_id, key)
    providers = await session.scalars(
        select(LLMProvider)
        .where(
            LLMProvider.organization_id == access.organization_id, LLMProvider.credential_key == key
        )
        .order_by(LLMProvider.created_at, LLMProvider.id)
    )
    domains = await session.scalars(
        select(AllowedDomain)
        .where(AllowedDomain.organization_id == access.organization_id)
        .order_by(AllowedDomain.created_at, AllowedDomain.id)
    )
    return schemas.CredentialUsage(
        llm_providers=[
            schemas.ProviderReference(id=p.id, provider=p.provider, name=p.name) for p in providers
        ],
        domains=[
            schemas.DomainReference(id=d.id, domain=d.domain)
            for d in domains
            if key in referenced_credentials(d.headers, d.query_params)
        ],
    )


async def delete_credential(session: AsyncSession, *, access: OrgAccess, key: str) -> None:
    credential = await _credential(session, access.organization_id, key)
    usage = await credential_usage(session, access=access, key=key)
    if usage.llm_providers or usage.domains:
        names = [f"llm provider {p.name} ({p.id})" for p in usage.llm_providers] + [
            f"domain {d.domain} ({d.id})" for d in usage.domains
        ]
        raise Conflict(f"credential {key} is referenced by {', '.join(names)}")
    await session.delete(credential)
    await session.flush()


# --- LLM providers -------------------------------------------------------------------------------


async def get_provider(
    session: AsyncSession, *, access: OrgAccess, provider_id: UUID
) -> LLMProvider:
    return await _provider_in_org(session, access.organization_id, provider_id)


async def _provider_in_org(session: AsyncSession, org_id: UUID, provider_id: UUID) -> LLMProvider:
    return await one_in_org(session, LLMProvider, org_id, provider_id, "llm provider")


async def list_providers(
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[LLMProvider], int]:
    query = select(LLMProvider).where(LLMProvider.organization_id == access.organization_id)
    return await paginate(session, query, paging, LLMProvider.created_at, LLMProvider.id)


async def _lock_outbound(session: AsyncSession, org_id: UUID) -> None:
    """Wait for the organization's other writers of providers and agents, then hold them
    off until this transaction ends.

    At most one default judge per organization (a partial unique index says it too): a
    provider becomes it by clearing the others in the same transaction, and two doing so
    at once would each find none to clear.  So every write to an organization's providers
    takes its organization row first (FOR NO KEY UPDATE: rows that merely reference the
    organization are still inserted meanwhile), before it reads what it changes.  Agents
    too: an agent's row holds its providers' rows (foreign keys), and the trigger of
    migration 0008 takes the organization row after any row written, so a writer that
    took them in the other order could deadlock with one of these."""
    await session.execute(
        select(Organization.id).where(Organization.id == org_id).with_for_update(key_share=True)
    )


async def _settle_provider(session: AsyncSession, provider: LLMProvider) -> None:
    """Kind-specific rules, credential existence, and a single default judge per org (the
    caller holds :func:`_lock_outbound`: the last to commit is the default)."""
    # The others first, before this provider is flushed (the reads below would autoflush
    # it): the unique index allows one default at any moment.
    if provider.is_default_judge:
        with session.no_autoflush:
            await session.execute(
                update(LLMProvider)
                .where(
                    LLMProvider.organization_id == provider.organization_id,
                    LLMProvider.is_default_judge,
                    LLMProvider.id != provider.id,
                )
                .values(is_default_judge=False)
            )
    if provider.base_url is None:
        if provider.provider == "openai_compatible":
            raise InvalidInput(
                ("body", "base_url"), "base_url is required for openai_compatible providers"
            )
        provider.base_url = DEFAULT_BASE_URLS[provider.provider]
    _check_url(provider.base_url, ("body", "base_url"))
    if provider.credential_key:
        await _require_credentials(
            session, provider.organization_id, {provider.credential_key}, ("body", "credential_key")
        )


async def create_provider(
    session: AsyncSession, *, access: OrgAccess, body: schemas.LLMProviderCreate
) -> LLMProvider:
    await _lock_outbound(session, access.organization_id)
    provider = LLMProvider(
        id=uuid4(),
        organization_id=access.organization_id,
        name=body.name,
        provider=body.provider,
        base_url=body.base_url,
        default_model=body.default_model,
        credential_key=body.credential_key,
        input_cost_per_mtok=body.input_cost_per_mtok,
        output_cost_per_mtok=body.output_cost_per_mtok,
        is_default_judge=body.is_default_judge,
    )
    await _settle_provider(session, provider)
    session.add(provider)
    await session.flush()
    return provider


async def update_provider(
    session: AsyncSession, *, access: OrgAccess, provider_id: UUID, body: schemas.LLMProviderUpdate
) -> LLMProvider:
    await _lock_outbound(session, access.organization_id)
    provider = await get_provider(session, access=access, provider_id=provider_id)
    _apply(provider, body)
    provider.updated_at = utcnow()
    await _settle_provider(session, provider)
    await session.flush()
    return provider


async def delete_provider(session: AsyncSession, *, access: OrgAccess, provider_id: UUID) -> None:
    await _lock_outbound(session, access.organization_id)
    provider = await get_provider(session, access=access, provider_id=provider_id)
    users = list(
        await session.scalars(
            select(Agent.name).where(
                Agent.organization_id == access.organization_id,
                (Agent.llm_provider_id == provider.id) | (Agent.judge_provider_id == provider.id),
            )
        )
    )
    if users:
        raise Conflict(f"llm provider is used by agents: {', '.join(sorted(users))}")
    await session.delete(provider)
    await session.flush()


# --- agents ---------------------------------------------------------------------------------------


async def get_agent(session: AsyncSession, *, access: OrgAccess, agent_id: UUID) -> Agent:
    return await agent_in_org(session, access.organization_id, agent_id)


async def agent_in_org(session: AsyncSession, org_id: UUID, agent_id: UUID) -> Agent:
    return await one_in_org(session, Agent, org_id, agent_id, "agent")


async def list_agents(
    session: AsyncSession, *, access: OrgAccess, paging: Paging
) -> tuple[list[Agent], int]:
    query = select(Agent).where(Agent.organization_id == access.organization_id)
    return await paginate(session, query, paging, Agent.created_at, Agent.id)


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
            _check_url(agent.endpoint_url, ("body", "endpoint_url"))
            agent.protocol = agent.protocol or "spar"
        elif agent.llm_provider_id is None:
            raise InvalidInput(
                ("body", "llm_provider_id"), "llm_provider_id is required for llm agents"
            )
        # Every provider reference must be a provider of this organization, whatever the kind.
        if agent.llm_provider_id is not None:
            provider = await _provider_in_org(session, agent.organization_id, agent.llm_provider_id)
            if agent.kind == "llm":
                agent.model = agent.model or provider.default_model
        if agent.judge_provider_id is not None:
            await _provider_in_org(session, agent.organization_id, agent.judge_provider_id)


async def create_agent(
    session: AsyncSession, *, access: OrgAccess, body: schemas.AgentCreate
) -> Agent:
    await _lock_outbound(session, access.organization_id)
    agent = Agent(organization_id=access.organization_id, **_fields(body))
    await _settle_agent(session, agent)
    session.add(agent)
    await session.flush()
    return agent


async def update_agent(
    session: AsyncSession, *, access: OrgAccess, agent_id: UUID, body: schemas.AgentUpdate
) -> Agent:
    await _lock_outbound(session, access.organization_id)
    agent = await get_agent(session, access=access, agent_id=agent_id)
    _apply(agent, body)
    agent.updated_at = utcnow()
    await _settle_agent(session, agent)
    await session.flush()
    return agent


async def delete_agent(session: AsyncSession, *, access: OrgAccess, agent_id: UUID) -> None:
    """Delete an agent no trigger names (409 names the triggers)."""
    await _lock_outbound(session, access.organization_id)
    agent = await get_agent(session, access=access, agent_id=agent_id)
    triggers = list(
        await session.scalars(
            select(Trigger.name).where(Trigger.agent_id == agent.id).order_by(Trigger.name)
        )
    )
    if triggers:
        raise Conflict(f"agent is used by triggers: {', '.join(triggers)}")
    await session.delete(agent)
    await session.flush()


# --- what the egress client needs at call time ---------------------------------------------------


async def _decrypted_credentials(
    session: AsyncSession, settings: Settings, org_id: UUID, keys: set[str] | None
) -> dict[str, str]:
    """The values of ``keys`` (all of the organization's when ``None``)."""
    if keys is not None and not keys:
        return {}
    query = select(Credential).where(Credential.organization_id == org_id)
    rows = await session.scalars(query if keys is None else query.where(Credential.key.in_(keys)))
    box = secret_box(settings.secret_key)
    return {row.key: box.decrypt(row.ciphertext) for row in rows}


async def load_egress_policy(
    session: AsyncSession, settings: Settings, org_id: UUID
) -> EgressPolicy:
    domains = list(
        await session.scalars(select(AllowedDomain).where(AllowedDomain.organization_id == org_id))
    )
    # All of them, not only the referenced ones: egress redacts every value from what it
    # brings back (a provider's key, a value an agent learnt some other way).
    credentials = await _decrypted_credentials(session, settings, org_id, None)
    return EgressPolicy(
        rules=[
            DomainRule(pattern=d.domain, headers=dict(d.headers), query_params=dict(d.query_params))
            for d in domains
        ],
        credentials=credentials,
        allow_private=settings.egress_allow_private,
    )


async def load_provider(
    session: AsyncSession, settings: Settings, org_id: UUID, provider_id: UUID
) -> ProviderConfig:
    provider = await _provider_in_org(session, org_id, provider_id)
    api_key = None
    if provider.credential_key:
        found = await _decrypted_credentials(session, settings, org_id, {provider.credential_key})
        api_key = found.get(provider.credential_key)
    return ProviderConfig(
        id=provider.id,
        provider=provider.provider,
        base_url=provider.base_url,
        default_model=provider.default_model,
        api_key=api_key,
        input_cost_per_mtok=provider.input_cost_per_mtok,
        output_cost_per_mtok=provider.output_cost_per_mtok,
    )


async def load_agent(
    session: AsyncSession, settings: Settings, org_id: UUID, agent_id: UUID
) -> AgentConfig:
    """An agent ready to call, its provider (kind ``llm``) loaded with its key."""
    agent = await agent_in_org(session, org_id, agent_id)
    provider = None
    if agent.kind == "llm" and agent.llm_provider_id is not None:
        provider = await load_provider(session, settings, org_id, agent.llm_provider_id)
    return AgentConfig(
        id=agent.id,
        name=agent.name,
        kind=agent.kind,
        endpoint_url=agent.endpoint_url,
        protocol=agent.protocol,
        model=agent.model,
        system_prompt=agent.system_prompt,
        provider=provider,
        judge_provider_id=agent.judge_provider_id,
        judge_model=agent.judge_model,
    )


async def default_judge_provider_id(session: AsyncSession, org_id: UUID) -> UUID | None:
    return await session.scalar(
        select(LLMProvider.id)
        .where(LLMProvider.organization_id == org_id, LLMProvider.is_default_judge)
        .order_by(LLMProvider.created_at)
        .limit(1)
    )


async def judge_provider_of(session: AsyncSession, org_id: UUID, own: UUID | None) -> UUID | None:
    """The judge an agent uses: its own ``judge_provider_id``, else the organization's
    default judge; ``None`` when there is neither."""
    return own or await default_judge_provider_id(session, org_id)


@dataclass(frozen=True, slots=True)
class OutboundConfig:
    """What a run calls out with: its agent, the organization's egress policy, its judge
    (the agent's own, else the organization's default judge; ``None`` if it has neither)."""

    agent: AgentConfig
    policy: EgressPolicy
    judge: ProviderConfig | None


async def load_outbound(
    database: Database,
    settings: Settings,
    org_id: UUID,
    agent_id: UUID,
    version: int,
) -> OutboundConfig:
    """The agent's :class:`OutboundConfig`, as of the organization's ``outbound_version``
    (read by the caller).  Cached per worker process under that version: a batch of
    hundreds of runs loads it once, and any change to the agents, providers, credentials
    or allowed domains (a trigger on each of those tables bumps the version, migration
    0008) is seen by the next run to start.  A session of ``database`` is opened only to
    load.  Raises :class:`NotFound` when the agent or its
    provider is gone."""
    key = (org_id, agent_id, version, settings)
    cached = _outbound_cache.get(key)
    if cached is not None:
        _outbound_cache.move_to_end(key)
        return cached
    # One load per key at a time: a batch's first window starts a hundred runs of one
    # agent at once, and they would all miss together.
    loading = (asyncio.get_running_loop(), key)
    try:
        async with _loading.setdefault(loading, asyncio.Lock()):
            cached = _outbound_cache.get(key)
            if cached is None:
                async with database.transaction() as session:
                    cached = await _load_outbound(session, settings, org_id, agent_id)
                _outbound_cache[key] = cached
                while len(_outbound_cache) > OUTBOUND_CACHE_SIZE:
                    _outbound_cache.popitem(last=False)
    finally:
        _loading.pop(loading, None)
    return cached


async def _load_outbound(
    session: AsyncSession, settings: Settings, org_id: UUID, agent_id: UUID
) -> OutboundConfig:
    agent = await load_agent(session, settings, org_id, agent_id)
    judge_id = await judge_provider_of(session, org_id, agent.judge_provider_id)
    return OutboundConfig(
        agent=agent,
        policy=await load_egress_policy(session, settings, org_id),
        judge=await load_provider(session, settings, org_id, judge_id) if judge_id else None,
    )


OUTBOUND_CACHE_SIZE = 256
_outbound_cache: OrderedDict[tuple[UUID, UUID, int, Settings], OutboundConfig] = OrderedDict()
_loading: dict[tuple[asyncio.AbstractEventLoop, tuple[UUID, UUID, int, Settings]], asyncio.Lock]
_loading = {}


# --- plumbing and response shapes --------------------------------------------------------------


def _fields(body: schemas.Input) -> dict[str, object]:
    return {name: getattr(body, name) for name in body.__struct_fields__}


def _apply(row: object, body: schemas.Input) -> None:
    """Copy the fields the client sent (UNSET means: keep)."""
    for name, value in _fields(body).items():
        if value is not schemas.UNSET:
            setattr(row, name, value)
