"""The simulated user (DESIGN §5.9): an LLM playing the customer of a scenario.

It writes the customer's next message from the scenario's persona and goal, its
``customer_context`` and the conversation so far, through the same client, egress policy
and structured output as the judge (:mod:`shared.llm.clients`): a JSON object
``{message, done, outcome}``.  ``done`` ends the conversation (its ``message`` is not
sent) with ``outcome`` ``goal_reached`` or ``gave_up``.  Its calls are the organization's
``simulator`` destination of the outbound limits.

The conversation is shown as one transcript in one user message, not as turns with the
roles swapped: every provider takes that (Anthropic's messages must start with the
user's), and the model reads plainly whose words are whose.

An empty or malformed answer (or a refusal) is asked for again, once; a second one is
raised as :class:`SimulatorError`, which the run ends on as ``error``, as it does when the
provider cannot be reached — a fault of the simulator, never of the agent under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from shared.llm.clients import LLMError, answer_object, chat
from shared.metrics import judge_labels, observed_call
from shared.outbound.egress import EgressClient, ProviderConfig, storable
from shared.traces import llm_span

Outcome = Literal["goal_reached", "gave_up"]
OUTCOMES: tuple[Outcome, ...] = ("goal_reached", "gave_up")
MAX_ATTEMPTS = 2  # an unusable answer is asked for again once

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string"},
        "done": {"type": "boolean"},
        "outcome": {"type": ["string", "null"], "enum": [*OUTCOMES, None]},
    },
    "required": ["message", "done", "outcome"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = """You play a customer talking to a conversational AI agent, to test the
agent. Stay in the persona you are given and pursue the goal you are given. Write only the
customer's next message, in the customer's own words: never the agent's part. Keep it
short and natural, as a real customer would write it.

End the conversation as soon as it is over for the customer, instead of writing another
message: done = true with outcome "goal_reached" when the goal has been reached, or
"gave_up" when the customer would give up (the agent cannot help, or goes in circles).
Do not say goodbye first: when it is over, answer done. The message of a done answer is
never sent.

Respond with a JSON object: {"message": the customer's next message ("" when done),
"done": true | false, "outcome": "goal_reached" | "gave_up" when done, else null}."""


class SimulatorError(LLMError):
    """The simulator gave no usable answer."""


@dataclass(frozen=True, slots=True)
class SimulatedTurn:
    """The simulator's answer: the customer's next message, or the end (``done``, with its
    ``outcome``), and what asking cost."""

    message: str  # redacted, as everything an LLM answers
    done: bool
    outcome: Outcome | None
    input_tokens: int
    output_tokens: int
    latency_ms: float
    calls: int


def build_prompt(
    *,
    persona: str,
    goal: str,
    customer_context: dict[str, Any] | None,
    conversation: list[dict[str, str]],
    turns_left: int,
) -> str:
    """What the simulator is shown: who it is, what it wants, what it knows, the
    conversation so far (``role`` ``user`` is the customer) and how many messages it may
    still send."""
    exchanges = sum(1 for m in conversation if m["role"] == "user")
    parts = [f"Your persona:\n{persona}", f"Your goal:\n{goal}"]
    if customer_context:
        known = msgspec.json.encode(customer_context).decode()
        parts.append(f"What you know as this customer (JSON):\n{known}")
    transcript = "\n".join(
        f"{'CUSTOMER' if m['role'] == 'user' else 'AGENT'}: {m['content']}" for m in conversation
    )
    parts.append(
        f"Conversation so far ({exchanges} exchanges; you may send at most {turns_left} more "
        f"messages):\n{transcript}"
    )
    parts.append("Your next message, or done:")
    return "\n\n".join(parts)


def parse_answer(content: str) -> tuple[str, bool, Outcome | None] | None:
    """(message, done, outcome) from an answer; ``None`` when it is not usable: not the
    object asked for, ``done`` without a known outcome, or no message without ``done``."""
    data = answer_object(content)
    if data is None or not isinstance(data.get("done"), bool):
        return None
    message = data.get("message")
    message = message.strip() if isinstance(message, str) else ""
    if data["done"]:
        outcome = data.get("outcome")
        return (message, True, outcome) if outcome in OUTCOMES else None
    return (message, False, None) if message else None


@observed_call("simulator", judge_labels)
@llm_span("simulator")
async def next_turn(
    egress: EgressClient,
    provider: ProviderConfig,
    *,
    persona: str,
    goal: str,
    customer_context: dict[str, Any] | None,
    conversation: list[dict[str, str]],
    turns_left: int,
    model: str | None = None,
) -> SimulatedTurn:
    """The customer's next message in ``conversation``, or the end of it.  Raises
    :class:`SimulatorError` after :data:`MAX_ATTEMPTS` unusable answers, and the egress
    client's errors when the provider cannot be reached."""
    prompt = build_prompt(
        persona=persona,
        goal=goal,
        customer_context=customer_context,
        conversation=conversation,
        turns_left=turns_left,
    )
    input_tokens = output_tokens = 0
    latency_ms = 0.0
    problem = "no answer"
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = await chat(
            egress,
            provider,
            [{"role": "user", "content": prompt}],
            model=model,
            system=SYSTEM_PROMPT,
            json_schema=ANSWER_SCHEMA,
            max_tokens=512,
            temperature=1.0,
            kind="simulator",
        )
        input_tokens += result.input_tokens
        output_tokens += result.output_tokens
        latency_ms += result.latency_ms
        parsed = None if result.refusal else parse_answer(result.content)
        if parsed is None:
            if result.refusal:
                problem = f"a refusal: {result.content[:300]}"
            elif not result.content.strip():
                problem = "an empty answer"
            else:
                problem = f"a malformed answer: {result.content[:300]}"
            continue
        message, done, outcome = parsed
        # The content came redacted from egress; parsing it unescaped its JSON strings, so
        # what is kept is made storable and redacted again in its final form.
        message = egress.policy.redactor(provider.api_key).text(storable(message))
        return SimulatedTurn(
            message, done, outcome, input_tokens, output_tokens, latency_ms, attempt
        )
    raise SimulatorError(f"no usable answer after {MAX_ATTEMPTS} attempts (the last was {problem})")
