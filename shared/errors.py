"""Domain errors.  Services raise these; ``api/exceptions.py`` maps them to HTTP answers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class SparError(Exception):
    """Base of every error a service raises on purpose."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(SparError):
    """The resource does not exist, or belongs to an organization the caller cannot see."""


class Conflict(SparError):
    """The request contradicts the current state (duplicate, protected resource...)."""


class PermissionDenied(SparError):
    """The caller is known but not allowed to do this."""


class Unauthorized(SparError):
    """No usable credentials: missing, malformed, unknown, expired or revoked token."""


class TooLarge(SparError):
    """The request carries more than Spar accepts (413)."""


class UnsupportedMediaType(SparError):
    """The request's content is of a type Spar does not take (415)."""


class RetryLater(SparError):
    """The request may succeed if sent again after ``retry_after`` seconds."""

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class TooManyRequests(RetryLater):
    """The caller must wait before trying again (429)."""


class ServiceUnavailable(RetryLater):
    """Spar cannot serve now, through no fault of the request: its database is out of
    reach or out of connections (503)."""


class InvalidInput(SparError):
    """Input that passed decoding but breaks a rule only a service can check (422).

    ``loc`` follows the spec's validation body: ``("body", "timezone")``.
    """

    def __init__(
        self,
        loc: tuple[str, ...],
        msg: str,
        *,
        type: str = "value_error",
        input: Any = None,
        ctx: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(msg)
        self.loc = loc
        self.type = type
        self.input = input
        self.ctx = ctx or {}


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it, through the exception groups on the way (Litestar wraps
    errors of dependencies in them), each once: those chains can loop."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.append(current.__cause__)
