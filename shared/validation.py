"""Where a msgspec validation error is and what kind it is, in the API's 422 terms: the
API's error bodies (``api/exceptions.py``) and the client's local checks of the same bodies
(``spar scenarios push``, ``spar calibrate``) say the same ``loc`` and message.

Light on purpose: the client imports it, so it needs nothing but msgspec's messages.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

# msgspec's paths: ".name" and "[0]" lead somewhere; "[...]" (a dict's value) names no key.
_PATH_TOKEN = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
# (pattern on msgspec's message, error type, ctx key or None)
_MESSAGE_TYPES: list[tuple[re.Pattern[str], str, str | None]] = [
    (re.compile(r"^Object missing required field `(?P<field>[^`]+)`"), "missing", None),
    (re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`"), "extra_forbidden", None),
    (re.compile(r"^Expected `str` of length >= (?P<v>\d+)"), "string_too_short", "min_length"),
    (re.compile(r"^Expected `str` of length <= (?P<v>\d+)"), "string_too_long", "max_length"),
    (re.compile(r"^Expected `\w+` of length >= (?P<v>\d+)"), "too_short", "min_length"),
    (re.compile(r"^Expected `\w+` of length <= (?P<v>\d+)"), "too_long", "max_length"),
    (re.compile(r"^Expected `\w+` >= (?P<v>[-\d.]+)"), "greater_than_equal", "ge"),
    (re.compile(r"^Expected `\w+` <= (?P<v>[-\d.]+)"), "less_than_equal", "le"),
    (re.compile(r"^Expected `\w+` > (?P<v>[-\d.]+)"), "greater_than", "gt"),
    (re.compile(r"^Expected `\w+` < (?P<v>[-\d.]+)"), "less_than", "lt"),
    (
        re.compile(r"^Expected `str` matching regex (?P<v>.+)$"),
        "string_pattern_mismatch",
        "pattern",
    ),
    (re.compile(r"^Invalid UUID"), "uuid_parsing", None),
    (re.compile(r"^Invalid RFC3339"), "datetime_parsing", None),
    (re.compile(r"^Invalid enum value"), "enum", None),
    (re.compile(r"^Expected `(?P<t>\w+)`(?: \| `\w+`)*, got `\w+`"), "{t}_type", None),
]


def _number(raw: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            continue
    return raw.strip("`'\"")


def classify(message: str) -> tuple[str, dict[str, Any], str | None]:
    """(type, ctx, field named by the message) for one msgspec message."""
    for pattern, kind, ctx_key in _MESSAGE_TYPES:
        match = pattern.match(message)
        if match is None:
            continue
        groups = match.groupdict()
        ctx = {ctx_key: _number(groups["v"])} if ctx_key else {}
        return kind.format(t=groups.get("t", "")), ctx, groups.get("field")
    return "value_error", {}, None


def path_tokens(at: str) -> list[str]:
    """The keys and indexes of a msgspec error path (``$.turns[0].question``)."""
    return [a or b for a, b in _PATH_TOKEN.findall(at.rstrip("`")) if a or b]


def locate(error: msgspec.ValidationError) -> tuple[list[str], str]:
    """Where in the decoded document a msgspec error is (the tokens of the API's ``loc``
    after its source, a missing field named last) and its message: the API's 422 and the
    CLI's local checks of the same bodies say the same."""
    message, _, at = str(error).partition(" - at `")
    tokens = path_tokens(at)
    _, _, field = classify(message)
    return ([*tokens, field] if field is not None else tokens), message
