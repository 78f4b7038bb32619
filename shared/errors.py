"""Domain errors.  Services raise these; ``api/exceptions.py`` maps them to HTTP answers."""

from __future__ import annotations

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


class TooManyRequests(SparError):
    """The caller must wait ``retry_after`` seconds before trying again (429)."""

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


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
