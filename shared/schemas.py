"""Building blocks shared by every domain's request and response Structs."""

from __future__ import annotations

from typing import Annotated

import msgspec

# Characters PostgreSQL and UTF-8 can hold: no NUL, no lone surrogates.
_STORABLE = "\\x00\\ud800-\\udfff"
TEXT_PATTERN = f"^[^{_STORABLE}]*$"


def text(min_length: int = 0, max_length: int | None = None, **extra: str) -> msgspec.Meta:
    """Constraints of an input string: its length bounds, and storable characters only."""
    return msgspec.Meta(min_length=min_length, max_length=max_length, pattern=TEXT_PATTERN, **extra)


Name255 = Annotated[str, text(1, 255)]
Email = Annotated[
    str,
    msgspec.Meta(
        min_length=3,
        max_length=320,
        pattern=f"^[^@\\s{_STORABLE}]+@[^@\\s{_STORABLE}]+\\.[^@\\s{_STORABLE}]+$",
        description="An email address.",
    ),
]
TimezoneName = Annotated[str, text(1, 64, description="An IANA time zone, e.g. Europe/Paris.")]


class Input(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of request bodies: unknown fields are refused, so mass assignment is impossible."""


class Output(msgspec.Struct, kw_only=True):
    """Base of response bodies."""
