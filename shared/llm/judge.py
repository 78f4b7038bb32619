"""The LLM judge, shared by scenario runs and calibration (DESIGN §5.5).

Prompt: the criterion question, its few-shot examples, the conversation so far (each
assistant message followed by the tools the agent called for it, one line each:
``[tool call] name({"arguments"}) -> output``) and the organization's business
information.  A turn's criterion is asked of the agent's latest reply; a conversation
criterion (DESIGN §5.9) of the whole conversation.  Structured output (JSON schema) where
the provider supports it (OpenAI's ``response_format``; Anthropic's
``output_config.format``, or a forced tool for models before it), tolerant parsing
otherwise (:func:`shared.llm.clients.answer_object`).  A malformed answer or a refusal is
retried, then raised as :class:`JudgeError` — never read as a PASS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.llm.clients import LLMError, answer_object, chat
from shared.metrics import judge_labels, observed_call
from shared.outbound.agents import Message
from shared.outbound.egress import EgressClient, ProviderConfig, storable
from shared.traces import llm_span

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["PASS", "FAIL"]},
        "critique": {"type": "string"},
        "evidence": {"type": "string"},
    },
    "required": ["verdict", "critique", "evidence"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = """You are a strict, fair evaluator of a conversational AI agent.
You are given a criterion (a yes/no question about the agent's latest reply), optional
labelled examples, and the conversation so far. Decide whether the agent's LATEST reply
satisfies the criterion. Answer PASS only if it clearly does; otherwise FAIL.
Respond with a JSON object: {"verdict": "PASS" | "FAIL", "critique": one or two sentences
explaining the decision, "evidence": a short quote from the reply supporting it}."""

CONVERSATION_SYSTEM_PROMPT = """You are a strict, fair evaluator of a conversational AI agent.
You are given a criterion (a yes/no question about the conversation as a whole), optional
labelled examples, and the whole conversation. Decide whether the agent's conduct over the
WHOLE conversation satisfies the criterion. Answer PASS only if it clearly does; otherwise
FAIL. Respond with a JSON object: {"verdict": "PASS" | "FAIL", "critique": one or two
sentences explaining the decision, "evidence": a short quote from the conversation
supporting it}."""

MAX_ATTEMPTS = 2


class JudgeError(LLMError):
    """The judge could not give a usable verdict."""


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: str  # "PASS" or "FAIL"
    critique: str
    evidence: str
    input_tokens: int
    output_tokens: int
    latency_ms: float
    calls: int


TOOL_CALLS_NOTE = (
    "A [tool call] line under an ASSISTANT message is a tool the agent called to produce "
    "that message: name(arguments as JSON) -> what the tool returned."
)


def transcript(conversation: Sequence[Message]) -> str:
    """The conversation as the judge reads it: ``ROLE: content`` per message, each tool call
    of an assistant message on a line of its own under it."""
    lines = []
    for message in conversation:
        lines.append(f"{message['role'].upper()}: {message['content']}")
        lines += (f"  [tool call] {call.compact()}" for call in message.get("tool_calls") or ())
    return "\n".join(lines)


def build_prompt(
    question: str,
    conversation: Sequence[Message],
    few_shot_examples: list[dict[str, Any]] | None = None,
    business_information: str | None = None,
    *,
    whole_conversation: bool = False,
) -> str:
    parts = []
    if business_information:
        parts.append(f"Context about the business the agent serves:\n{business_information}")
    parts.append(f"Criterion: {question}")
    shown = "Conversation" if whole_conversation else "Reply"
    for n, example in enumerate(few_shot_examples or [], start=1):
        parts.append(
            f"Example {n}:\n{shown}: {example.get('response', '')}\n"
            f"Verdict: {example.get('verdict', '')}\nCritique: {example.get('critique', '')}"
        )
    if any(message.get("tool_calls") for message in conversation):
        parts.append(TOOL_CALLS_NOTE)
    if whole_conversation:
        parts.append(f"The whole conversation (judge all of it):\n{transcript(conversation)}")
    else:
        parts.append(
            "Conversation so far (the last ASSISTANT message is the one to judge):\n"
            + transcript(conversation)
        )
    return "\n\n".join(parts)


def parse_verdict(content: str) -> tuple[str, str, str] | None:
    """(verdict, critique, evidence) from a reply; ``None`` when it is not a usable verdict."""
    data = answer_object(content)
    if data is None:
        return None
    verdict = str(data.get("verdict", "")).strip().upper()
    if verdict not in {"PASS", "FAIL"}:
        return None
    return verdict, str(data.get("critique") or ""), str(data.get("evidence") or "")


@observed_call("judge", judge_labels)
@llm_span("judge")
async def judge(
    egress: EgressClient,
    provider: ProviderConfig,
    *,
    question: str,
    conversation: Sequence[Message],
    few_shot_examples: list[dict[str, Any]] | None = None,
    business_information: str | None = None,
    model: str | None = None,
    whole_conversation: bool = False,
) -> Judgement:
    """The judge's verdict on the agent's latest reply in ``conversation`` or, with
    ``whole_conversation``, on all of it (a conversation criterion)."""
    prompt = build_prompt(
        question,
        conversation,
        few_shot_examples,
        business_information,
        whole_conversation=whole_conversation,
    )
    input_tokens = output_tokens = 0
    latency_ms = 0.0
    refusal = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = await chat(
            egress,
            provider,
            [{"role": "user", "content": prompt}],
            model=model,
            system=CONVERSATION_SYSTEM_PROMPT if whole_conversation else SYSTEM_PROMPT,
            json_schema=VERDICT_SCHEMA,
            max_tokens=512,
            kind="judge",
        )
        input_tokens += result.input_tokens
        output_tokens += result.output_tokens
        latency_ms += result.latency_ms
        if result.refusal:
            refusal = result.content
            continue
        parsed = parse_verdict(result.content)
        if parsed is not None:
            verdict, critique, evidence = parsed
            # The content came redacted from egress; parsing it unescaped its JSON strings,
            # so what is kept is made storable and redacted again in its final form.
            redactor = egress.policy.redactor(provider.api_key)
            critique, evidence = (redactor.text(storable(part)) for part in (critique, evidence))
            return Judgement(
                verdict, critique, evidence, input_tokens, output_tokens, latency_ms, attempt
            )
    if refusal is not None:
        raise JudgeError(f"the judge refused to judge: {refusal[:300]}")
    raise JudgeError(f"the judge gave no usable verdict after {MAX_ATTEMPTS} attempts")
