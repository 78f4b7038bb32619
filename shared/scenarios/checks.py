"""The free deterministic checks of a criterion (DESIGN §5.2): ``contains`` and
``not_contains`` (case-insensitive substring), and ``regex``; on one reply, or, for a
conversation criterion (DESIGN §5.9), on every reply of the conversation.

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
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial

import regex

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


async def match(kind: str, pattern: str, reply: str) -> str | None:
    """What of ``reply`` a ``contains``, ``not_contains`` or ``regex`` check finds (the
    pattern itself, or a regex's match), ``None`` when it finds nothing; raises
    :class:`CheckUndecided`."""
    if kind == "regex":
        try:
            compiled = compile_pattern(pattern)
        except PatternError as exc:
            raise CheckUndecided(f"regex /{pattern}/ is invalid: {exc}") from None
        search = partial(compiled.search, reply, timeout=REGEX_TIMEOUT_S, concurrent=True)
        try:
            found = await asyncio.get_running_loop().run_in_executor(_regex_threads, search)
        except TimeoutError:
            raise CheckUndecided(
                f"regex /{pattern}/ ran longer than {REGEX_TIMEOUT_S:g} s on the reply"
            ) from None
        return found.group(0) if found else None
    return pattern if pattern.casefold() in reply.casefold() else None


def _found(kind: str, pattern: str, *, many: bool = False) -> str:
    if kind == "regex":
        return f"{'match' if many else 'matches'} /{pattern}/"
    return f"{'contain' if many else 'contains'} {pattern!r}"


def _missing(kind: str, pattern: str) -> str:
    return f"does not match /{pattern}/" if kind == "regex" else f"does not contain {pattern!r}"


async def verdict(kind: str, pattern: str, reply: str) -> tuple[str, str, str]:
    """(verdict, critique, evidence) of a ``contains``, ``not_contains`` or ``regex``
    check on ``reply``; raises :class:`CheckUndecided`."""
    found = await match(kind, pattern, reply)
    if found is None:
        verdict = "PASS" if kind == "not_contains" else "FAIL"
        return verdict, f"reply {_missing(kind, pattern)}", ""
    verdict = "FAIL" if kind == "not_contains" else "PASS"
    return verdict, f"reply {_found(kind, pattern)}", found


def over_conversation(
    kind: str, pattern: str, found: list[tuple[int, str]]
) -> tuple[str, str, str]:
    """(verdict, critique, evidence) of a check judged on a whole conversation, from what it
    ``found`` in each agent reply (``(turn_index, evidence)``, turns counted from 0):
    ``contains`` and ``regex`` pass when some reply matched, ``not_contains`` fails when
    some reply contained the text.  The critique names the replies (turns from 1), the
    evidence is what the first one held."""
    if not found:
        verdict = "PASS" if kind == "not_contains" else "FAIL"
        return verdict, f"no reply {_found(kind, pattern)}", ""
    many = len(found) > 1
    turns = ", ".join(str(index + 1) for index, _ in found)
    which = "the replies of turns" if many else "the reply of turn"
    verdict = "FAIL" if kind == "not_contains" else "PASS"
    return verdict, f"{which} {turns} {_found(kind, pattern, many=many)}", found[0][1]
