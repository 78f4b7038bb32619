"""What a run calls out with: its agent, the organization's egress policy, its judge and
its default simulator, loaded at call time (:func:`load_egress_policy`,
:func:`load_provider`, :func:`load_agent`, all of them for a run in :func:`load_outbound`)
and cached per worker process.

The organization's allow-list comes with its credentials resolved, a provider with its API
key decrypted.  Decrypted values live only in a worker's memory (for a call, or in the
cache until a change to the organization's outbound configuration replaces them); they are
never stored, returned or logged.  The configuration itself is written by
:mod:`shared.outbound.services`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from shared.crypto import secret_box
from shared.db.engine import Database
from shared.db.models import Agent, AllowedDomain, Credential, LLMProvider
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
    session: AsyncSession, *, settings: Settings, org_id: UUID, provider_id: UUID
) -> ProviderConfig:
    provider = await provider_in_org(session, org_id=org_id, provider_id=provider_id)
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
        request_options=dict(provider.request_options),
        anthropic_version=provider.anthropic_version,
    )


async def load_agent(
    session: AsyncSession, *, settings: Settings, org_id: UUID, agent_id: UUID
) -> AgentConfig:
    """An agent ready to call, its provider (kind ``llm``) loaded with its key."""
    agent = await agent_in_org(session, org_id=org_id, agent_id=agent_id)
    provider = None
    if agent.kind == "llm" and agent.llm_provider_id is not None:
        provider = await load_provider(
            session, settings=settings, org_id=org_id, provider_id=agent.llm_provider_id
        )
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


async def _default_provider_id(session: AsyncSession, org_id: UUID, flag: Any) -> UUID | None:
    return await session.scalar(
        select(LLMProvider.id)
        .where(LLMProvider.organization_id == org_id, flag)
        .order_by(LLMProvider.created_at)
        .limit(1)
    )


async def default_judge_provider_id(session: AsyncSession, *, org_id: UUID) -> UUID | None:
    return await _default_provider_id(session, org_id, LLMProvider.is_default_judge)


async def simulator_provider_of(
    session: AsyncSession, *, org_id: UUID, judge: UUID | None
) -> UUID | None:
    """The simulator of a scenario that names none: the organization's default simulator,
    else the agent's ``judge``; ``None`` when there is neither."""
    own = await _default_provider_id(session, org_id, LLMProvider.is_default_simulator)
    return own or judge


async def judge_provider_of(
    session: AsyncSession, *, org_id: UUID, own: UUID | None
) -> UUID | None:
    """The judge an agent uses: its own ``judge_provider_id``, else the organization's
    default judge; ``None`` when there is neither."""
    return own or await default_judge_provider_id(session, org_id=org_id)


async def destinations_of(
    session: AsyncSession, *, org_id: UUID, agent_id: UUID
) -> list[Destination]:
    """Where a run of the agent calls out (:mod:`shared.outbound.limits`): its endpoint's
    or its LLM provider's host (``agent``), its judge's (``judge``) and the default
    simulator's (``simulator``: the one of scenarios that name none)."""
    agent = await session.get(Agent, agent_id)
    if agent is None or agent.organization_id != org_id:
        return []
    urls: list[tuple[str, str | None]] = [("agent", agent.endpoint_url)]
    if agent.llm_provider_id is not None:
        urls.append(("agent", await _base_url(session, agent.llm_provider_id)))
    judge_id = await judge_provider_of(session, org_id=org_id, own=agent.judge_provider_id)
    if judge_id is not None:
        urls.append(("judge", await _base_url(session, judge_id)))
    simulator_id = await simulator_provider_of(session, org_id=org_id, judge=judge_id)
    if simulator_id is not None:
        urls.append(("simulator", await _base_url(session, simulator_id)))
    found = []
    for kind, url in urls:
        host = urlsplit(url).hostname if url else None
        if host:
            found.append(Destination(str(org_id), kind, normalize_host(host)))
    return found


async def _base_url(session: AsyncSession, provider_id: UUID) -> str | None:
    return await session.scalar(select(LLMProvider.base_url).where(LLMProvider.id == provider_id))


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
    agent = await load_agent(session, settings=settings, org_id=org_id, agent_id=agent_id)
    judge_id = await judge_provider_of(session, org_id=org_id, own=agent.judge_provider_id)
    simulator_id = await simulator_provider_of(session, org_id=org_id, judge=judge_id)
    loaded = {
        provider_id: await load_provider(
            session, settings=settings, org_id=org_id, provider_id=provider_id
        )
        for provider_id in {judge_id, simulator_id} - {None}
    }
    return OutboundConfig(
        agent=agent,
        policy=await load_egress_policy(session, settings=settings, org_id=org_id),
        judge=loaded.get(judge_id) if judge_id else None,
        simulator=loaded.get(simulator_id) if simulator_id else None,
    )


OUTBOUND_CACHE_SIZE = 256
_outbound_cache: OrderedDict[tuple[UUID, UUID, int, Settings], OutboundConfig] = OrderedDict()
_loading: dict[tuple[asyncio.AbstractEventLoop, tuple[UUID, UUID, int, Settings]], asyncio.Lock]
_loading = {}
