"""Calling an agent under test: protocol ``spar``, protocol ``openai_chat``, or kind ``llm``
(Spar itself calls the provider with the agent's system prompt).  All through egress."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict
from uuid import UUID

import msgspec

from shared.llm.clients import chat, openai_reply
from shared.metrics import agent_labels, observed_call
from shared.outbound import tool_calls
from shared.outbound.egress import EgressClient, EgressError, ProviderConfig
from shared.outbound.schemas import ToolCall
from shared.traces import agent_span


class AgentError(EgressError):
    """The agent answered, but not with a usable reply."""


class Message(TypedDict):
    """One message of a conversation with the agent under test.  The agent is sent ``role``
    (``user`` or ``assistant``) and ``content``; an assistant message may also carry the
    tools the agent called for it (redacted and capped, :mod:`shared.outbound.tool_calls`),
    which the judge reads."""

    role: str
    content: str
    tool_calls: NotRequired[list[ToolCall]]


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
    # The credential keys whose values ``content`` and ``tool_calls`` had redacted out of
    # ``received`` and ``received_tool_calls``.
    redacted_keys: tuple[str, ...] = ()
    # The model refused (an llm agent's provider, or an openai_chat agent): ``content`` is
    # its refusal.
    refusal: bool = False
    # The tools the agent reported calling for this reply, redacted (not capped: the turn's
    # calls are, shared.outbound.tool_calls.capped), and as it sent them (for deterministic
    # checks only, like ``received``).
    tool_calls: tuple[ToolCall, ...] = ()
    received_tool_calls: tuple[ToolCall, ...] = field(default=(), repr=False)


def _reply(
    egress: EgressClient,
    received: str,
    content: str,
    input_tokens: int,
    output_tokens: int,
    latency_ms: float,
    refusal: bool = False,
    *,
    calls: Sequence[ToolCall] = (),
    redact: Callable[[str], str] | None = None,
) -> AgentReply:
    """A reply, ``content`` being ``received`` redacted, and the ``calls`` received with
    it redacted by ``redact`` (the response's redactor; else the organization's
    credentials); which credentials they held is looked up only when redaction changed
    something."""
    keys = set(egress.policy.keys_in(received)) if content != received else set()
    kept: list[ToolCall] = []
    if calls:
        redact = redact or egress.policy.redactor().text
        kept, in_calls = tool_calls.redacted(calls, redact, egress.policy)
        keys.update(in_calls)
    return AgentReply(
        content,
        input_tokens,
        output_tokens,
        latency_ms,
        received,
        redacted_keys=tuple(sorted(keys)),
        refusal=refusal,
        tool_calls=tuple(kept),
        received_tool_calls=tuple(calls),
    )


@observed_call("agent", agent_labels)
@agent_span
async def call_agent(
    egress: EgressClient,
    agent: AgentConfig,
    *,
    session_id: str,
    message: str,
    history: Sequence[Message],
    customer_context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    system_context: str | None = None,
) -> AgentReply:
    """Send ``message`` after ``history`` (earlier user/assistant turns: their role and
    content) and return the reply.  ``system_context`` (an ``llm`` agent's knowledge for
    this turn) follows its system prompt."""
    messages = [{"role": m["role"], "content": m["content"]} for m in history]
    messages.append({"role": "user", "content": message})
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
            reply = data["choices"][0]["message"]
            calls = tool_calls.from_openai(reply)
            if calls and reply.get("content") is None and reply.get("refusal") is None:
                content = ""  # a reply that is only tool calls
            else:
                content, refused = openai_reply(reply)
            usage = data.get("usage") or {}
            tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        else:
            content = data["content"]
            calls = tool_calls.from_spar(data.get("tool_calls"))
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
            calls=calls,
            redact=response.redactor.text,
        )
    except tool_calls.MalformedToolCalls as exc:
        raise AgentError(f"agent reply is not of the {agent.protocol} protocol: {exc}") from None
    except (msgspec.DecodeError, KeyError, IndexError, TypeError, ValueError, AttributeError):
        expected = (
            "choices[0].message.content" if agent.protocol == "openai_chat" else '{"content": ...}'
        )
        raise AgentError(
            f"agent reply is not of the {agent.protocol} protocol: expected {expected}"
        ) from None
