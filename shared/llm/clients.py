"""LLM chat over the egress client: OpenAI chat completions (and compatibles), Anthropic
messages.  Each call returns the content and the token usage.

The body starts from Spar's defaults for the model (:mod:`shared.llm.models`: a reasoning
model gets ``max_completion_tokens`` and no temperature, a Claude model after Opus 4.6 no
temperature), then the provider's ``request_options`` are merged in, then Spar's own
fields (model, conversation, structured output) are set.  A refusal (OpenAI's ``refusal``
with no content, Anthropic's ``stop_reason: refusal``) is a reply: its text is the
content, and ``refusal`` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.llm.models import (
    DEFAULT_MAX_TOKENS,
    REASONING_MAX_TOKENS,
    ModelTraits,
    traits,
    with_options,
)
from shared.outbound.egress import (
    EgressClient,
    EgressError,
    EgressResponse,
    ProviderConfig,
    decode_json,
)
from shared.traces import response_model

ANTHROPIC_VERSION = "2023-06-01"
SCHEMA_NAME = "response"  # the JSON schema's (OpenAI) and the forced tool's (Anthropic) name


class LLMError(EgressError):
    """The provider answered, but not with a usable completion."""


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


def answer_object(content: str) -> dict[str, Any] | None:
    """The JSON object a structured answer holds, read tolerantly (a model without
    structured output may fence it in Markdown, or say something around it); ``None`` when
    there is none.  Its strings are as decoded: make them storable and redact them again
    before keeping them."""
    text = _FENCE.sub("", content.strip())
    candidates = [text]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            data = decode_json(candidate)
        except msgspec.DecodeError:
            continue
        if isinstance(data, dict):
            return data
    return None


@dataclass(frozen=True, slots=True)
class ChatResult:
    content: str  # redacted (shared.outbound.redact)
    input_tokens: int
    output_tokens: int
    latency_ms: float
    model: str
    # The completion as the provider sent it: for deterministic checks only, never kept.
    received: str = field(default="", repr=False)
    # The model refused: ``content`` is its refusal.
    refusal: bool = False


async def chat(
    egress: EgressClient,
    provider: ProviderConfig,
    messages: list[dict[str, str]],
    *,
    model: str | None = None,
    system: str | None = None,
    json_schema: dict[str, Any] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    kind: str = "agent",
) -> ChatResult:
    """One completion.  ``messages`` are ``{"role": "user"|"assistant", "content"}``;
    ``json_schema`` asks for structured output where the provider supports it.
    ``max_tokens`` and ``temperature`` are for the models that take them; ``kind`` is whose
    call it is (agent, judge, simulator: the destination of outbound limits)."""
    model = model or provider.default_model
    known = traits(provider.provider, model)
    if provider.provider == "anthropic":
        return await _anthropic(
            egress,
            provider,
            messages,
            model,
            known,
            system,
            json_schema,
            max_tokens,
            temperature,
            kind,
        )
    return await _openai(
        egress, provider, messages, model, known, system, json_schema, max_tokens, temperature, kind
    )


def _ok_json(response: EgressResponse, who: str) -> Any:
    """The answer's JSON as received (not redacted: :func:`_result` redacts what it keeps)."""
    if response.status_code >= 400:
        # Providers sometimes echo the key they were given: egress redacted it (the key went
        # out in a sensitive header) before this cut, so no part of it survives.
        body = response.text[:300]
        raise LLMError(f"{who} answered HTTP {response.status_code}: {body}")
    try:
        return response.json_as_received()
    except msgspec.DecodeError:
        raise LLMError(f"{who} answered with a body that is not JSON") from None


def _result(
    response: EgressResponse, received: str, usage: Any, model: str, *, refusal: bool = False
) -> ChatResult:
    model = response.redactor.text(model)
    response_model(model)
    return ChatResult(
        content=response.redactor.text(received),
        input_tokens=int(usage[0] or 0),
        output_tokens=int(usage[1] or 0),
        latency_ms=response.latency_ms,
        model=model,
        received=received,
        refusal=refusal,
    )


def _limits(
    known: ModelTraits, max_tokens: int, temperature: float, tokens_field: str
) -> dict[str, Any]:
    """Spar's defaults of length and sampling for a model with ``known`` traits."""
    if known.reasoning:
        return {tokens_field: max(max_tokens, REASONING_MAX_TOKENS)}
    limits: dict[str, Any] = {"max_tokens": max_tokens}
    if known.sampling:
        limits["temperature"] = temperature
    return limits


def openai_reply(message: Any) -> tuple[str, bool]:
    """``(text, refused)`` of a chat completion's ``choices[0].message``: its content, or
    its ``refusal`` when the model refused (``content`` null).  Raises ``TypeError`` when
    it has neither."""
    content = message.get("content")
    refusal = message.get("refusal")
    if content is None and isinstance(refusal, str):
        return refusal, True
    if not isinstance(content, str):
        raise TypeError(content)
    return content, False


async def _openai(
    egress: EgressClient,
    provider: ProviderConfig,
    messages: list[dict[str, str]],
    model: str,
    known: ModelTraits,
    system: str | None,
    json_schema: dict[str, Any] | None,
    max_tokens: int,
    temperature: float,
    kind: str,
) -> ChatResult:
    body = with_options(
        _limits(known, max_tokens, temperature, "max_completion_tokens"), provider.request_options
    )
    body["model"] = model
    body["messages"] = ([{"role": "system", "content": system}] if system else []) + messages
    if json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": SCHEMA_NAME, "schema": json_schema, "strict": True},
        }
    headers = {"Authorization": f"Bearer {provider.api_key}"} if provider.api_key else {}
    url = provider.base_url.rstrip("/") + "/chat/completions"
    response = await egress.request("POST", url, json=body, headers=headers, kind=kind)
    data = _ok_json(response, f"LLM provider {provider.provider}")
    try:
        content, refused = openai_reply(data["choices"][0]["message"])
        usage = data.get("usage") or {}
        tokens = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
        return _result(response, content, tokens, str(data.get("model") or model), refusal=refused)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise LLMError("chat completion without choices[0].message.content") from None


async def _anthropic(
    egress: EgressClient,
    provider: ProviderConfig,
    messages: list[dict[str, str]],
    model: str,
    known: ModelTraits,
    system: str | None,
    json_schema: dict[str, Any] | None,
    max_tokens: int,
    temperature: float,
    kind: str,
) -> ChatResult:
    body = with_options(
        _limits(known, max_tokens, temperature, "max_tokens"), provider.request_options
    )
    body["model"] = model
    body["messages"] = messages
    if system:
        body["system"] = system
    tool = None
    if json_schema is not None and known.structured == "tool":
        # Before structured outputs, a tool forced on the model is how it answers a schema.
        tool = SCHEMA_NAME
        body["tools"] = [
            {"name": tool, "description": "Give the answer.", "input_schema": json_schema}
        ]
        body["tool_choice"] = {"type": "tool", "name": tool}
    elif json_schema is not None:
        body["output_config"] = {
            **(body.get("output_config") or {}),
            "format": {"type": "json_schema", "schema": json_schema},
        }
    headers = {"anthropic-version": provider.anthropic_version or ANTHROPIC_VERSION}
    if provider.api_key:
        headers["x-api-key"] = provider.api_key
    url = provider.base_url.rstrip("/") + "/v1/messages"
    response = await egress.request("POST", url, json=body, headers=headers, kind=kind)
    data = _ok_json(response, "LLM provider anthropic")
    try:
        blocks = data["content"]
        content = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        if tool is not None:
            for block in blocks:
                if block.get("type") == "tool_use" and block.get("name") == tool:
                    content = msgspec.json.encode(block.get("input")).decode()
        usage = data.get("usage") or {}
        tokens = (usage.get("input_tokens"), usage.get("output_tokens"))
        refused = data.get("stop_reason") == "refusal"
        return _result(response, content, tokens, str(data.get("model") or model), refusal=refused)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise LLMError("anthropic message without text content") from None
