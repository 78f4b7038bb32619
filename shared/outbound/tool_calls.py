"""What an agent reports it did to produce a reply: its tool calls (DESIGN §5.10).

1. Read from the reply: protocol ``spar``'s ``tool_calls``, ``[{"name", "arguments"
   (object, ``{}`` when left out), "output" (any, optional)}]`` (:func:`from_spar`);
   protocol ``openai_chat``'s ``choices[0].message.tool_calls``, each call's
   ``function.name`` and its ``function.arguments`` JSON string parsed (:func:`from_openai`:
   arguments that are not a JSON object are kept whole, as the string under
   :data:`UNPARSED`).  Malformed calls raise :class:`MalformedToolCalls`, naming where.
   Spar's own ``llm`` agents report their knowledge search the same way
   (:mod:`shared.knowledge.context`).
2. Deterministic checks read the calls as received; the judge, the store and every page
   read them redacted (:func:`redacted`: every string inside, keys too) and capped
   (:func:`capped`): at most :data:`MAX_BYTES` of JSON per turn, whole calls in the order
   they came, then one call named :data:`~shared.outbound.schemas.CUT` whose arguments
   say how many were left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from shared.outbound.egress import EgressPolicy, storable, storable_json
from shared.outbound.schemas import CUT, ToolCall

MAX_BYTES = 64 * 1024  # of a turn's calls, as JSON
UNPARSED = "_unparsed"  # the key holding arguments that are not a JSON object


class MalformedToolCalls(Exception):
    """The reply's tool calls are not of the protocol's shape; the message says where."""


def from_spar(value: Any) -> list[ToolCall]:
    """The calls of a ``spar`` reply's ``tool_calls`` (absent or null: none)."""
    if value is None:
        return []
    try:
        return msgspec.convert(value, list[ToolCall])
    except msgspec.ValidationError as exc:
        problem, _, at = str(exc).partition(" - at `$")
        where = "tool_calls" + at.removesuffix("`")
        raise MalformedToolCalls(f"{where}: {problem[:1].lower()}{problem[1:]}") from None


def from_openai(message: Any) -> list[ToolCall]:
    """The function calls of a chat completion's ``choices[0].message`` (none when it has
    no ``tool_calls``)."""
    calls = message.get("tool_calls")
    if calls is None:
        return []
    where = "choices[0].message.tool_calls"
    if not isinstance(calls, list):
        raise MalformedToolCalls(f"{where}: expected an array")
    read = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise MalformedToolCalls(f"{where}[{index}].function.name: expected a string")
        assert isinstance(function, dict)
        read.append(ToolCall(name=name, arguments=_arguments(function.get("arguments"))))
    return read


def _arguments(value: Any) -> dict[str, Any]:
    """OpenAI's arguments (a JSON string, or an object from a lenient server) as an object;
    anything else kept whole under :data:`UNPARSED`."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = msgspec.json.decode(value)
        except msgspec.DecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return storable_json(parsed)  # a "\u0000" escape decodes to what cannot be stored
        return {UNPARSED: storable(value)}
    return {UNPARSED: msgspec.json.encode(value).decode()}


def redacted(
    calls: Sequence[ToolCall], redact: Callable[[str], str], policy: EgressPolicy
) -> tuple[list[ToolCall], list[str]]:
    """``calls`` with every string in them redacted by ``redact``, and the keys of the
    credentials that took out (looked up only when it took something out)."""
    if not calls:
        return [], []
    received = msgspec.to_builtins(calls)
    kept = storable_json(received, redact)
    if kept == received:
        return list(calls), []
    keys = policy.keys_in(msgspec.json.encode(received).decode())
    return msgspec.convert(kept, list[ToolCall]), keys


def capped(calls: Sequence[ToolCall]) -> list[ToolCall]:
    """The calls that fit in :data:`MAX_BYTES` of JSON, whole and in order, then (when some
    did not) one :data:`CUT` call saying how many were left out."""
    size = 2  # the array's brackets
    for index, call in enumerate(calls):
        size += len(msgspec.json.encode(call)) + (1 if index else 0)
        if size > MAX_BYTES:
            cut = ToolCall(
                name=CUT, arguments={"calls_cut": len(calls) - index, "max_bytes": MAX_BYTES}
            )
            return [*calls[:index], cut]
    return list(calls)
