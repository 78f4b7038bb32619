"""The free deterministic checks of a criterion (DESIGN §5.2, §5.10): ``contains`` and
``not_contains`` (case-insensitive substring) and ``regex`` on the agent's reply;
``tool_called`` and ``tool_not_called`` on the tools it called (:func:`tool_verdict`, a
function of a list of calls: a turn's, or a whole conversation's).

A ``regex`` criterion runs the scenario author's pattern on the agent's reply, and a
pattern can backtrack for longer than the universe has left.  So patterns are compiled
and run by the ``regex`` package (the syntax of Python's ``re``, in its compatible V0
mode), under a time limit, on a thread of their own that releases the GIL while it
matches: a catastrophic pattern ends its own run as ``error`` instead of stalling every
run on the worker's event loop.  Creating a scenario compiles its patterns with the same
engine, so what is accepted is what runs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial
from typing import Any

import regex

from shared.outbound.schemas import ToolCall, compact_json

REGEX_TIMEOUT_S = 1.0
# Two at a time: a pattern that runs into the limit holds one for a second.
_regex_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spar-regex")

PatternError = regex.error


class CheckUndecided(Exception):
    """The check could not be decided: its pattern did not finish on the reply within
    :data:`REGEX_TIMEOUT_S`, or does not compile (a scenario saved before patterns were
    checked by this engine)."""


@lru_cache(maxsize=512)
def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """The compiled pattern; raises :data:`PatternError` with the reason it is invalid."""
    return regex.compile(pattern, regex.V0)


async def verdict(kind: str, pattern: str, reply: str) -> tuple[str, str, str]:
    """(verdict, critique, evidence) of a ``contains``, ``not_contains`` or ``regex``
    check on ``reply``; raises :class:`CheckUndecided`."""
    if kind == "regex":
        try:
            compiled = compile_pattern(pattern)
        except PatternError as exc:
            raise CheckUndecided(f"regex /{pattern}/ is invalid: {exc}") from None
        search = partial(compiled.search, reply, timeout=REGEX_TIMEOUT_S, concurrent=True)
        try:
            match = await asyncio.get_running_loop().run_in_executor(_regex_threads, search)
        except TimeoutError:
            raise CheckUndecided(
                f"regex /{pattern}/ ran longer than {REGEX_TIMEOUT_S:g} s on the reply"
            ) from None
        if match:
            return "PASS", f"reply matches /{pattern}/", match.group(0)
        return "FAIL", f"reply does not match /{pattern}/", ""
    found = pattern.casefold() in reply.casefold()
    if kind == "contains":
        if found:
            return "PASS", f"reply contains {pattern!r}", pattern
        return "FAIL", f"reply does not contain {pattern!r}", ""
    if found:
        return "FAIL", f"reply contains {pattern!r}", pattern
    return "PASS", f"reply does not contain {pattern!r}", ""


# --- tool calls --------------------------------------------------------------------------------

MAX_QUOTED = 2_000  # characters of a call quoted as evidence
MAX_NAMED = 20  # tools named in a critique's "calls seen"
MAX_EXPLAINED = 5  # calls of the tool whose mismatch a critique explains
MAX_VALUE = 200  # characters of a value a mismatch quotes


def tool_verdict(
    kind: str, tool: str, expected_arguments: dict[str, Any] | None, calls: Sequence[ToolCall]
) -> tuple[str, str, str]:
    """(verdict, critique, evidence) of a ``tool_called`` or ``tool_not_called`` check of
    ``tool`` on ``calls``.

    ``tool_called`` passes when some call of ``tool`` carries every key of
    ``expected_arguments`` with an equal value (:func:`mismatch`); ``tool_not_called``
    when no call has that name.  The critique names the calls seen, the evidence quotes the
    call that decided (the matching one, or the first of the tool's that did not match)."""
    of_tool = [call for call in calls if call.name == tool]
    seen = f"calls seen: {_names(calls)}"
    if kind == "tool_not_called":
        if not of_tool:
            return "PASS", f"{tool} was not called; {seen}", ""
        return "FAIL", f"{tool} was called {_times(len(of_tool))}; {seen}", _quoted(of_tool[0])
    if not of_tool:
        return "FAIL", f"{tool} was not called; {seen}", ""
    if expected_arguments is None:
        return "PASS", f"{tool} was called {_times(len(of_tool))}; {seen}", _quoted(of_tool[0])
    wanted = compact_json(expected_arguments)
    problems = [mismatch(expected_arguments, call.arguments) for call in of_tool]
    for call, problem in zip(of_tool, problems, strict=True):
        if problem is None:
            return "PASS", f"{tool} was called with {wanted}; {seen}", _quoted(call)
    explained = [f"call {n}: {p}" for n, p in enumerate(problems[:MAX_EXPLAINED], start=1)]
    if len(problems) > MAX_EXPLAINED:
        explained.append(f"and {len(problems) - MAX_EXPLAINED} more")
    why = "; ".join(explained)
    return (
        "FAIL",
        f"{tool} was called {_times(len(of_tool))}, never with {wanted} ({why}); {seen}",
        _quoted(of_tool[0]),
    )


def mismatch(expected: Any, actual: Any, path: str = "") -> str | None:
    """Why ``actual`` does not carry ``expected`` (``None`` when it does): each key of an
    expected object present with a matching value, nested objects matched the same way
    (a deep subset), anything else equal as JSON (lists whole, in order; ``1`` equals
    ``1.0``; ``true`` is not ``1``)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path or 'arguments'} is {_brief(actual)}, not an object"
        for key, value in expected.items():
            at = f"{path}.{key}" if path else key
            if key not in actual:
                return f"{at} is missing"
            problem = mismatch(value, actual[key], at)
            if problem is not None:
                return problem
        return None
    if json_equal(expected, actual):
        return None
    return f"{path} is {_brief(actual)}, expected {_brief(expected)}"


def json_equal(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are equal as JSON: numbers by value (``1`` and
    ``1.0``), booleans only to booleans, arrays element by element, objects key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _names(calls: Sequence[ToolCall]) -> str:
    """``lookup_order, refund_order (2 calls)``: each tool called, in the order first called."""
    if not calls:
        return "none"
    counted = Counter(call.name for call in calls)
    named = [name if n == 1 else f"{name} ({n} calls)" for name, n in counted.items()]
    if len(named) > MAX_NAMED:
        named = [*named[:MAX_NAMED], f"and {len(named) - MAX_NAMED} more"]
    return ", ".join(named)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _quoted(call: ToolCall) -> str:
    shown = call.compact()
    return shown if len(shown) <= MAX_QUOTED else shown[: MAX_QUOTED - 1] + "…"


def _brief(value: Any) -> str:
    shown = compact_json(value)
    return shown if len(shown) <= MAX_VALUE else shown[: MAX_VALUE - 1] + "…"
