"""LLM chat over the egress client: OpenAI chat completions (and compatibles), Anthropic
messages.  Each call returns the content and the token usage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.outbound.egress import EgressClient, EgressError, EgressResponse, ProviderConfig

ANTHROPIC_VERSION = "2023-06-01"


class LLMError(EgressError):
    """The provider answered, but not with a usable completion."""


@dataclass(frozen=True, slots=True)
class ChatResult:
    content: str  # redacted (shared.outbound.redact)
    input_tokens: int
    output_tokens: int
    latency_ms: float
    model: str
    # The completion as the provider sent it: for deterministic checks only, never kept.
    received: str = field(default="", repr=False)


async def chat(
    egress: EgressClient,
    provider: ProviderConfig,
    messages: list[dict[str, str]],
    *,
    model: str | None = None,
    system: str | None = None,
    json_schema: dict[str, Any] | None = None,
    max_tokens: int = 1024,
    temperature: float = 0.0,
) -> ChatResult:
    """One completion.  ``messages`` are ``{"role": "user"|"assistant", "content"}``;
    ``json_schema`` asks for structured output where the provider supports it."""
    model = model or provider.default_model
    if provider.provider == "anthropic":
        return await _anthropic(
            egress, provider, messages, model, system, json_schema, max_tokens, temperature
        )
    return await _openai(
        egress, provider, messages, model, system, json_schema, max_tokens, temperature
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


def _result(response: EgressResponse, received: str, usage: Any, model: str) -> ChatResult:
    return ChatResult(
        content=response.redactor.text(received),
        input_tokens=int(usage[0] or 0),
        output_tokens=int(usage[1] or 0),
        latency_ms=response.latency_ms,
        model=response.redactor.text(model),
        received=received,
    )


async def _openai(
    egress: EgressClient,
    provider: ProviderConfig,
    messages: list[dict[str, str]],
    model: str,
    system: str | None,
    json_schema: dict[str, Any] | None,
    max_tokens: int,
    temperature: float,
) -> ChatResult:
    body: dict[str, Any] = {
        "model": model,
        "messages": ([{"role": "system", "content": system}] if system else []) + messages,
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
    if json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": json_schema, "strict": True},
        }
    headers = {"Authorization": f"Bearer {provider.api_key}"} if provider.api_key else {}
    url = provider.base_url.rstrip("/") + "/chat/completions"
    response = await egress.request("POST", url, json=body, headers=headers)
    data = _ok_json(response, f"LLM provider {provider.provider}")
    try:
        content = data["choices"][0]["message"]["content"] or ""
        if not isinstance(content, str):
            raise TypeError(content)
        usage = data.get("usage") or {}
        tokens = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
        return _result(response, content, tokens, str(data.get("model") or model))
    except (KeyError, IndexError, TypeError, ValueError):
        raise LLMError("chat completion without choices[0].message.content") from None


async def _anthropic(
    egress: EgressClient,
    provider: ProviderConfig,
    messages: list[dict[str, str]],
    model: str,
    system: str | None,
    json_schema: dict[str, Any] | None,
    max_tokens: int,
    temperature: float,
) -> ChatResult:
    if json_schema is not None:
        instruction = (
            "Answer with a single JSON object, and nothing else, that matches this JSON schema: "
            + msgspec.json.encode(json_schema).decode()
        )
        system = f"{system}\n\n{instruction}" if system else instruction
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "messages": messages,
    }
    if system:
        body["system"] = system
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if provider.api_key:
        headers["x-api-key"] = provider.api_key
    url = provider.base_url.rstrip("/") + "/v1/messages"
    response = await egress.request("POST", url, json=body, headers=headers)
    data = _ok_json(response, "LLM provider anthropic")
    try:
        blocks = data["content"]
        content = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        usage = data.get("usage") or {}
        tokens = (usage.get("input_tokens"), usage.get("output_tokens"))
        return _result(response, content, tokens, str(data.get("model") or model))
    except (KeyError, TypeError, AttributeError, ValueError):
        raise LLMError("anthropic message without text content") from None
