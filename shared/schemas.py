"""Building blocks shared by every domain's request and response Structs."""

from __future__ import annotations

from typing import Annotated

import msgspec

Name255 = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
Email = Annotated[
    str,
    msgspec.Meta(
        min_length=3,
        max_length=320,
        pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$",
        description="An email address.",
    ),
]
TimezoneName = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=64, description="An IANA time zone, e.g. Europe/Paris."),
]


class Input(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of request bodies: unknown fields are refused, so mass assignment is impossible."""


class Output(msgspec.Struct, kw_only=True):
    """Base of response bodies."""
