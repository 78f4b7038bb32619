"""Who is calling and what they may do: principals, per-organization access, route rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from shared.errors import PermissionDenied
from shared.identity.permissions import ROLE_LEVELS


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller: a user (``ust_`` token) or a platform token (``pat_``)."""

    kind: Literal["user", "platform_token"]
    token_id: UUID
    user_id: UUID | None = None
    organization_id: UUID | None = None  # platform tokens only: the one org they work in
    permissions: frozenset[str] = frozenset()  # platform tokens only

    @property
    def is_user(self) -> bool:
        return self.kind == "user"


@dataclass(frozen=True, slots=True)
class OrgAccess:
    """A principal's standing in one organization, resolved once per request."""

    principal: Principal
    organization_id: UUID
    permissions: frozenset[str]
    role_name: str | None = None  # system role name, or None for custom roles and tokens

    def holds(self, permission: str) -> bool:
        return permission in self.permissions

    def require(self, permission: str, action: str | None = None) -> None:
        """Refuse unless the caller holds ``permission``; ``action`` names what needs it
        when that is more than the route itself (a service's own check)."""
        if not self.holds(permission):
            if action is None:
                raise PermissionDenied(f"missing permission {permission}")
            raise PermissionDenied(f"{action} needs permission {permission}")

    def require_role(self, level: str, action: str = "this endpoint") -> None:
        """Refuse unless the caller is a user whose system role is ``level`` or above.

        No set of permissions stands in for the role: a custom role holding every
        permission is refused, and so is a platform token, whatever it holds.
        """
        takes = f"{action} takes a member whose role is {' or '.join(ROLE_LEVELS[level])}"
        if not self.principal.is_user:
            raise PermissionDenied(f"{takes}; a platform token cannot")
        if self.role_name not in ROLE_LEVELS[level]:
            raise PermissionDenied(takes)

    def require_grantable(
        self,
        permissions: list[str] | tuple[str, ...],
        refusal: str = "cannot grant permissions you lack",
    ) -> None:
        """Nobody hands out, takes away or manages a permission they do not hold themselves.

        The one escalation rule: creating or editing a role, deleting one, giving a member
        a role or acting on a member all pass the permissions involved through here.
        """
        missing = [p for p in permissions if p not in self.permissions]
        if missing:
            raise PermissionDenied(f"{refusal}: {', '.join(missing)}")


@dataclass(frozen=True, slots=True)
class AccessRule:
    """What a route demands, declared on every handler (``access=...``) and enforced by one guard.

    ``public``: no token at all.  Otherwise a valid token; ``user_only`` refuses platform
    tokens; ``permission`` and ``role`` apply inside the organization named by ``org_id``.
    """

    public: bool = False
    user_only: bool = False
    permission: str | None = None
    role: str | None = None


PUBLIC = AccessRule(public=True)
AUTHENTICATED = AccessRule()
USER_ONLY = AccessRule(user_only=True)


def requires(permission: str) -> AccessRule:
    return AccessRule(permission=permission)


def requires_role(level: str) -> AccessRule:
    return AccessRule(role=level)
