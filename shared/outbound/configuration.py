"""What a run calls out with: its agent, the organization's egress policy, its judge and
its default simulator, loaded at call time (:func:`load_egress_policy`,
:func:`load_provider`, all of them for a run in :func:`load_outbound`, cached per worker
process).

The organization's allow-list comes with its credentials resolved, a provider with its API
key decrypted.  Decrypted values live only in a worker's memory (for a call, or in the
cache until a change to the organization's outbound configuration replaces them); they are
never stored, returned or logged.  The configuration itself is written by
:mod:`shared.outbound.services`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit
from uuid import UUID

from psycopg import AsyncConnection
from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.crypto import secret_box
from shared.db.direct import Statement, read_together
from shared.db.engine import Database
from shared.db.models import Agent, AllowedDomain, Credential, LLMProvider
from shared.errors import NotFound
from shared.outbound.agents import AgentConfig
from shared.outbound.egress import DomainRule, EgressPolicy, ProviderConfig, normalize_host
from shared.outbound.limits import Destination
from shared.outbound.services import agent_in_org, provider_in_org
from shared.settings import Settings


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
    session: AsyncSession, *, settings: Settings, org_id: UUID
) -> EgressPolicy:
    return _egress_policy(
        settings,
        await _allowed_domains(session, org_id),
        # All of them, not only the referenced ones: egress redacts every value from what
        # it brings back (a provider's key, a value an agent learnt some other way).
        await _decrypted_credentials(session, settings, org_id, None),
    )


async def _allowed_domains(session: AsyncSession, org_id: UUID) -> list[AllowedDomain]:
    return list(
        await session.scalars(select(AllowedDomain).where(AllowedDomain.organization_id == org_id))
    )


def _egress_policy(
    settings: Settings, domains: list[AllowedDomain], credentials: dict[str, str]
) -> EgressPolicy:
    return EgressPolicy(
        rules=[
            DomainRule(pattern=d.domain, headers=dict(d.headers), query_params=dict(d.query_params))
            for d in domains
        ],
        credentials=credentials,
        allow_private=settings.egress_allow_private,
    )


async def load_provider(
    session: AsyncSession, *, settings: Settings, org_id: UUID, provider_id: UUID
) -> ProviderConfig:
    provider = await provider_in_org(session, org_id=org_id, provider_id=provider_id)
    keys = {provider.credential_key} if provider.credential_key else set()
    return _provider_config(provider, await _decrypted_credentials(session, settings, org_id, keys))


def _provider_config(provider: LLMProvider, credentials: dict[str, str]) -> ProviderConfig:
    """``provider`` with its API key, one of the organization's ``credentials``."""
    return ProviderConfig(
        id=provider.id,
        provider=provider.provider,
        base_url=provider.base_url,
        default_model=provider.default_model,
        api_key=credentials.get(provider.credential_key) if provider.credential_key else None,
        input_cost_per_mtok=provider.input_cost_per_mtok,
        output_cost_per_mtok=provider.output_cost_per_mtok,
        request_options=dict(provider.request_options),
        anthropic_version=provider.anthropic_version,
    )


def _agent_config(agent: Agent, provider: ProviderConfig | None) -> AgentConfig:
    """An agent ready to call, with its provider (kind ``llm``) loaded with its key."""
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


async def _providers(session: AsyncSession, org_id: UUID) -> list[LLMProvider]:
    """The organization's providers, oldest first."""
    return list(
        await session.scalars(
            select(LLMProvider)
            .where(LLMProvider.organization_id == org_id)
            .order_by(LLMProvider.created_at, LLMProvider.id)
        )
    )


def _default(providers: Sequence[Any], flag: str) -> UUID | None:
    """The first of ``providers`` (oldest first) marked ``flag`` (at most one is)."""
    return next((p.id for p in providers if getattr(p, flag)), None)


def _judge_of(own: UUID | None, providers: Sequence[Any]) -> UUID | None:
    return own or _default(providers, "is_default_judge")


def _simulator_of(judge: UUID | None, providers: Sequence[Any]) -> UUID | None:
    return _default(providers, "is_default_simulator") or judge


async def simulator_provider_of(
    session: AsyncSession, *, org_id: UUID, judge: UUID | None
) -> UUID | None:
    """The simulator of a scenario that names none: the organization's default simulator,
    else the agent's ``judge``; ``None`` when there is neither."""
    return _simulator_of(judge, await _providers(session, org_id))


async def judge_provider_of(
    session: AsyncSession, *, org_id: UUID, own: UUID | None
) -> UUID | None:
    """The judge an agent uses: its own ``judge_provider_id``, else the organization's
    default judge; ``None`` when there is neither."""
    if own is not None:
        return own
    return _judge_of(own, await _providers(session, org_id))


# Where an agent's runs call out, read straight on psycopg: the agent's references, and its
# organization's providers (oldest first, as :func:`_providers`) to resolve them with.
_agent, _provider = Agent.__table__, LLMProvider.__table__
_AGENT_AND_PROVIDERS = (
    Statement(
        select(_agent.c.endpoint_url, _agent.c.llm_provider_id, _agent.c.judge_provider_id).where(
            _agent.c.id == bindparam("p_agent", type_=_agent.c.id.type),
            _agent.c.organization_id == bindparam("p_org", type_=_agent.c.organization_id.type),
        )
    ),
    Statement(
        select(
            _provider.c.id,
            _provider.c.base_url,
            _provider.c.is_default_judge,
            _provider.c.is_default_simulator,
        )
        .where(
            _provider.c.organization_id
            == bindparam("p_org", type_=_provider.c.organization_id.type)
        )
        .order_by(_provider.c.created_at, _provider.c.id)
    ),
)


async def destinations_of(
    connection: AsyncConnection[Any], *, org_id: UUID, agent_id: UUID
) -> list[Destination]:
    """Where a run of the agent calls out (:mod:`shared.outbound.limits`): its endpoint's
    or its LLM provider's host (``agent``), its judge's (``judge``) and the default
    simulator's (``simulator``: the one of scenarios that name none).  One round trip."""
    agents, providers = await read_together(
        connection,
        *(
            (statement, {"p_agent": agent_id, "p_org": org_id})
            for statement in _AGENT_AND_PROVIDERS
        ),
    )
    if not agents:
        return []
    (agent,) = agents
    base_urls = {provider.id: provider.base_url for provider in providers}
    urls: list[tuple[str, str | None]] = [("agent", agent.endpoint_url)]
    if agent.llm_provider_id is not None:
        urls.append(("agent", base_urls.get(agent.llm_provider_id)))
    judge_id = _judge_of(agent.judge_provider_id, providers)
    if judge_id is not None:
        urls.append(("judge", base_urls.get(judge_id)))
    simulator_id = _simulator_of(judge_id, providers)
    if simulator_id is not None:
        urls.append(("simulator", base_urls.get(simulator_id)))
    found = []
    for kind, url in urls:
        host = urlsplit(url).hostname if url else None
        if host:
            found.append(Destination(str(org_id), kind, normalize_host(host)))
    return found


@dataclass(frozen=True, slots=True)
class OutboundConfig:
    """What a run calls out with: its agent, the organization's egress policy, its judge
    (the agent's own, else the organization's default judge; ``None`` if it has neither)
    and the simulator of scenarios that name none (:func:`simulator_provider_of`)."""

    agent: AgentConfig
    policy: EgressPolicy
    judge: ProviderConfig | None
    simulator: ProviderConfig | None = None


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
    # agent at once, and they would all miss together.  Each waits for the one load (which
    # a waiter cancelled does not cancel), and each gets its outcome.
    loop = asyncio.get_running_loop()
    loading = _loading.get((loop, key))
    if loading is None:
        loading = _loading[(loop, key)] = loop.create_task(
            _load_outbound(database, settings, org_id, agent_id)
        )
        loading.add_done_callback(lambda done: _loaded(loop, key, done))
    return await asyncio.shield(loading)


def _loaded(loop: asyncio.AbstractEventLoop, key: _Key, done: asyncio.Task[OutboundConfig]) -> None:
    del _loading[(loop, key)]
    if done.cancelled() or done.exception() is not None:
        return
    _outbound_cache[key] = done.result()
    while len(_outbound_cache) > OUTBOUND_CACHE_SIZE:
        _outbound_cache.popitem(last=False)


async def _load_outbound(
    database: Database, settings: Settings, org_id: UUID, agent_id: UUID
) -> OutboundConfig:
    """The agent, the organization's providers and its allowed domains read at once, each
    on a connection of its own in autocommit, then its credentials.  A batch's whole first
    window waits on this load: on a busy worker, seven statements one after the other
    (with BEGIN and COMMIT) took 40-55 ms.  One transaction would see no steadier a
    configuration (each statement of a READ COMMITTED transaction takes its own snapshot),
    but the order of the snapshots matters, and these reads keep what one after the other
    kept: what a row names was committed before it, so a read that starts after it sees it.

    * The credentials are read after the providers and the domains, which name them (a
      provider's key, a domain's header templates).
    * A provider the agent names was there when the agent was written to name it (and
      cannot go while it does: a foreign key), but the providers' read may have taken its
      snapshot before the agent's: the providers are then read again, after it.

    The judge and the default simulator are picked from the providers."""

    async def read(load: Callable[[AsyncSession], Awaitable[_Read]]) -> _Read:
        async with database.transaction(read_only=True) as session:
            return await load(session)

    agent, providers, domains = await _all(
        read(lambda session: agent_in_org(session, org_id=org_id, agent_id=agent_id)),
        read(lambda session: _providers(session, org_id)),
        read(lambda session: _allowed_domains(session, org_id)),
    )
    named = {agent.judge_provider_id, agent.llm_provider_id if agent.kind == "llm" else None}
    if named - {None} - {provider.id for provider in providers}:  # read before the agent's
        providers = await read(lambda session: _providers(session, org_id))
    # All of them: egress redacts every value from what it brings back.
    credentials = await read(
        lambda session: _decrypted_credentials(session, settings, org_id, None)
    )
    by_id = {provider.id: provider for provider in providers}

    def provider(provider_id: UUID | None) -> ProviderConfig | None:
        if provider_id is None:
            return None
        if provider_id not in by_id:  # not the organization's
            raise NotFound("llm provider not found")
        return _provider_config(by_id[provider_id], credentials)

    judge_id = _judge_of(agent.judge_provider_id, providers)
    return OutboundConfig(
        agent=_agent_config(
            agent, provider(agent.llm_provider_id) if agent.kind == "llm" else None
        ),
        policy=_egress_policy(settings, domains, credentials),
        judge=provider(judge_id),
        simulator=provider(_simulator_of(judge_id, providers)),
    )


async def _all(*reads: Awaitable[Any]) -> list[Any]:
    """The results of ``reads``, run at once; the first failure raised once all are done
    (none is left running, as :func:`asyncio.gather` would leave the others)."""
    results = await asyncio.gather(*reads, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


OUTBOUND_CACHE_SIZE = 256
_Key = tuple[UUID, UUID, int, Settings]
_Read = TypeVar("_Read")
_outbound_cache: OrderedDict[_Key, OutboundConfig] = OrderedDict()
_loading: dict[tuple[asyncio.AbstractEventLoop, _Key], asyncio.Task[OutboundConfig]] = {}
