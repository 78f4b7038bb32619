"""Request and response bodies of identity: users, organizations, members, roles, tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self
from uuid import UUID

import msgspec

from shared.identity.permissions import Permission, ordered
from shared.schemas import SECRET, Email, Input, Name255, Output, TimezoneName, text

Password = Annotated[str, text(8, 128), SECRET]
PersonName = Annotated[str, text(1, 100)]
RoleName = Annotated[str, text(1, 100)]
BusinessInformation = Annotated[str, text(0, 20_000)]
UNSET = msgspec.UNSET
# "active" once the user has a password; "invited" while only an invitation exists.
UserStatus = Literal["active", "invited"]
TokenType = Literal["bearer"]


# --- users and sessions -------------------------------------------------------------------


class UserRead(Output):
    id: UUID
    email: str
    first_name: str
    last_name: str
    is_active: bool
    timezone: str
    created_at: datetime
    updated_at: datetime
    status: UserStatus
    invited_at: datetime | None


class RegisterBody(Input):
    email: Email
    password: Password
    first_name: PersonName
    last_name: PersonName
    timezone: TimezoneName = "UTC"


class LoginBody(Input):
    email: Annotated[str, text(1, 320)]
    password: Annotated[str, text(1, 128), SECRET]


class AccessToken(Output):
    access_token: str
    expires_at: datetime
    token_type: TokenType = "bearer"


class Registered(Output):
    user: UserRead
    access_token: str
    expires_at: datetime
    token_type: TokenType = "bearer"


# --- organizations ---------------------------------------------------------------------------


class RoleInfo(Output):
    id: UUID
    name: str
    is_system: bool


class OrganizationRead(Output):
    id: UUID
    name: str
    business_information: str
    timezone: str
    created_by_user_id: UUID
    owner_user_id: UUID
    created_at: datetime
    updated_at: datetime


class OrganizationWithAccess(OrganizationRead):
    role: RoleInfo
    permissions: list[str]


class Me(Output):
    user: UserRead
    organizations: list[OrganizationWithAccess]


class OrganizationList(Output):
    organizations: list[OrganizationRead]
    total: int


class OrganizationCreate(Input):
    name: Name255
    business_information: BusinessInformation = ""
    timezone: TimezoneName = "UTC"


class OrganizationUpdate(Input):
    name: Name255 | msgspec.UnsetType = UNSET
    business_information: BusinessInformation | msgspec.UnsetType = UNSET
    timezone: TimezoneName | msgspec.UnsetType = UNSET


# --- members -------------------------------------------------------------------------------


class MemberRead(Output):
    id: UUID
    user_id: UUID
    organization_id: UUID
    role_id: UUID
    created_at: datetime
    role: RoleInfo | None = None
    user: UserRead | None = None
    organization: OrganizationRead | None = None


class MemberList(Output):
    members: list[MemberRead]
    total: int


class MemberInvite(Input):
    email: Email
    role_id: UUID


class MemberRoleUpdate(Input):
    role_id: UUID


# --- roles ------------------------------------------------------------------------------------


class _HoldsPermissions(Output):
    """A body whose row holds permissions: shown in catalogue order, whatever the stored
    order (a system role's is its definition's)."""

    @classmethod
    def from_row(cls, row: Any, **computed: Any) -> Self:
        return super().from_row(row, **{"permissions": ordered(row.permissions), **computed})


class RoleRead(_HoldsPermissions):
    id: UUID
    organization_id: UUID
    name: str
    is_system: bool
    permissions: list[str]
    created_at: datetime
    updated_at: datetime


class RoleList(Output):
    roles: list[RoleRead]
    total: int


class RoleCreate(Input):
    name: RoleName
    permissions: list[Permission]


class RoleUpdate(Input):
    name: RoleName | msgspec.UnsetType = UNSET
    permissions: list[Permission] | msgspec.UnsetType = UNSET


# --- platform tokens ---------------------------------------------------------------------------


class PlatformTokenRead(_HoldsPermissions):
    id: UUID
    name: str
    organization_id: UUID
    permissions: list[str]
    expires_at: datetime | None
    last_used_at: datetime | None
    is_active: bool
    created_at: datetime
    updated_at: datetime
    token_preview: str


class PlatformTokenCreated(PlatformTokenRead):
    token: str


class PlatformTokenList(Output):
    tokens: list[PlatformTokenRead]
    total: int


class PlatformTokenCreate(Input):
    name: Name255
    permissions: list[Permission]
    expires_at: datetime | None = None
