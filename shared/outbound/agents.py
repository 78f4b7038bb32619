"""Calling an agent under test: protocol ``spar``, protocol ``openai_chat``, or kind ``llm``
(Spar itself calls the provider with the agent's system prompt).  All through egress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import msgspec

from shared.llm.clients import chat, openai_reply
from shared.metrics import agent_labels, observed_call
from shared.outbound.egress import EgressClient, EgressError, ProviderConfig


class AgentError(EgressError):
    """The agent answered, but not with a usable reply."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    id: UUID
    name: str
    kind: str
    endpoint_url: str | None = None
    protocol: str | None = None
    model: str | None = None
    system_prompt: str | None = None
    provider: ProviderConfig | None = field(default=None, repr=False)
    judge_provider_id: UUID | None = None
    judge_model: str | None = None


@dataclass(frozen=True, slots=True)
class AgentReply:
    content: str  # redacted: what may be stored, shown and sent to the judge
    input_tokens: int
    output_tokens: int
    latency_ms: float
    # The reply as the agent sent it, secrets included: for deterministic checks only
    # (a criterion looking for a leaked key must see it), never stored, shown or logged.
    received: str = field(default="", repr=False)
    # The credential keys whose values ``content`` had redacted out of ``received``.
    redacted_keys: tuple[str, ...] = ()
    # The model refused (an llm agent's provider, or an openai_chat agent): ``content`` is
    # its refusal.
    refusal: bool = False


def _reply(
    egress: EgressClient,
    received: str,
    content: str,
    input_tokens: int,
    output_tokens: int,
    latency_ms: float,
    refusal: bool = False,
) -> AgentReply:
    """A reply, ``content`` being ``received`` redacted; which credentials it held is
    looked up only when redaction changed something."""
    keys = egress.policy.keys_in(received) if content != received else ()
    return AgentReply(
        content,
        input_tokens,
        output_tokens,
        latency_ms,
        received,
        redacted_keys=tuple(keys),
        refusal=refusal,
    )


@observed_call("agent", agent_labels)
async def call_agent(
    egress: EgressClient,
    agent: AgentConfig,
    *,
    session_id: str,
    message: str,
    history: list[dict[str, str]],
    customer_context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    system_context: str | None = None,
) -> AgentReply:
    """Send ``message`` after ``history`` (earlier user/assistant turns) and return the reply.
    ``system_context`` (an ``llm`` agent's knowledge for this turn) follows its system
    prompt."""
    messages = [*history, {"role": "user", "content": message}]
    if agent.kind == "llm":
        if agent.provider is None:
            raise AgentError(f"agent {agent.name!r} has no LLM provider")
        system = "\n\n".join(part for part in (agent.system_prompt, system_context) if part)
        result = await chat(
            egress, agent.provider, messages, model=agent.model, system=system or None
        )
        return _reply(
            egress,
            result.received,
            result.content,
            result.input_tokens,
            result.output_tokens,
            result.latency_ms,
            result.refusal,
        )
    if not agent.endpoint_url:
        raise AgentError(f"agent {agent.name!r} has no endpoint_url")
    if agent.protocol == "openai_chat":
        body: dict[str, Any] = {"model": agent.model or agent.name, "messages": messages}
    else:
        body = {
            "session_id": session_id,
            "message": message,
            "messages": messages,
            "customer_context": customer_context or {},
            "metadata": metadata or {},
        }
    response = await egress.request("POST", agent.endpoint_url, json=body)
    if response.status_code >= 400:
        body = response.text[:300]  # redacted by egress before the cut
        raise AgentError(f"agent answered HTTP {response.status_code}: {body}")
    refused = False
    try:
        data = response.json_as_received()
        if agent.protocol == "openai_chat":
            content, refused = openai_reply(data["choices"][0]["message"])
            usage = data.get("usage") or {}
            tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        else:
            content = data["content"]
            usage = data.get("usage") or {}
            tokens_in, tokens_out = usage.get("input_tokens"), usage.get("output_tokens")
        if not isinstance(content, str):
            raise TypeError(content)
        return _reply(
            egress,
            content,
            response.redactor.text(content),
            int(tokens_in or 0),
            int(tokens_out or 0),
            response.latency_ms,
            refused,
        )
    except (msgspec.DecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError):
        expected = (
            "choices[0].message.content" if agent.protocol == "openai_chat" else '{"content": ...}'
        )
        raise AgentError(
            f"agent reply is not of the {agent.protocol} protocol: expected {expected}"
        ) from None
