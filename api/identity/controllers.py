"""Identity endpoints: auth, organizations, members, roles, platform tokens (spec 1-4, 9)."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_204_NO_CONTENT

from api.deps import Access, Caller, Config, DbReads, DbSession, Page, PathId, listing, reading
from shared.identity import accounts, members, organizations, platform_tokens, roles, schemas
from shared.identity.access import AUTHENTICATED, PUBLIC, USER_ONLY, requires, requires_role
from shared.identity.permissions import ADMIN, OWNER


class AuthController(Controller):
    path = "/auth"
    tags = ["auth"]

    @post("/register", operation_id="register", access=PUBLIC)
    async def register(
        self, db_session: DbSession, settings: Config, data: JSONBody[schemas.RegisterBody]
    ) -> schemas.Registered:
        """Create an account (or activate an invited one) and return a first user token."""
        user, token, expires_at = await accounts.register(db_session, settings=settings, body=data)
        return schemas.Registered(
            user=schemas.UserRead.from_row(user), access_token=token, expires_at=expires_at
        )

    @post(
        "/login",
        operation_id="login",
        access=PUBLIC,
        status_code=HTTP_200_OK,
        responses={
            429: ResponseSpec(
                None,
                description="Too many failed logins for this account or from this address; "
                "the `Retry-After` header says how many seconds to wait.",
            )
        },
    )
    async def login(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        settings: Config,
        data: JSONBody[schemas.LoginBody],
    ) -> schemas.AccessToken:
        """Exchange email and password for a user token (`ust_…`); failed logins are throttled."""
        token, expires_at = await accounts.login(
            db_session,
            settings=settings,
            body=data,
            throttle=request.app.state.login_throttle,
            # uvicorn has already applied the proxy headers it trusts to the ASGI scope.
            address=request.client.host if request.client else "unknown",
        )
        return schemas.AccessToken(access_token=token, expires_at=expires_at)

    @post("/logout", operation_id="logout", access=USER_ONLY, status_code=HTTP_204_NO_CONTENT)
    async def logout(self, db_session: DbSession, principal: Caller) -> None:
        """Revoke the user token this request presents."""
        await accounts.logout(db_session, principal=principal)

    @get("/me", operation_id="getCurrentUser", access=USER_ONLY)
    async def me(self, db_reads: DbReads, principal: Caller) -> schemas.Me:
        """The current user with each organization, its role and effective permissions."""
        return await reading(db_reads, accounts.me, principal=principal)


class OrganizationController(Controller):
    path = "/organizations"
    tags = ["organizations"]

    @get("/", operation_id="listOrganizations", access=AUTHENTICATED)
    async def list_organizations(
        self, db_reads: DbReads, principal: Caller, paging: Page
    ) -> schemas.OrganizationList:
        """The organizations the caller can see, paged."""
        return listing(
            schemas.OrganizationList,
            await reading(
                db_reads, organizations.read_organizations, principal=principal, paging=paging
            ),
        )

    @post("/", operation_id="createOrganization", access=USER_ONLY)
    async def create_organization(
        self, db_session: DbSession, principal: Caller, data: JSONBody[schemas.OrganizationCreate]
    ) -> schemas.OrganizationRead:
        """Create an organization; the caller becomes its OWNER."""
        org = await organizations.create_organization(db_session, principal=principal, body=data)
        return schemas.OrganizationRead.from_row(org)

    @get("/{org_id:str}", operation_id="getOrganization", access=requires("org:read"))
    async def get_organization(
        self, db_reads: DbReads, access: Access, org_id: PathId
    ) -> schemas.OrganizationRead:
        """One organization the caller belongs to."""
        return schemas.OrganizationRead.from_row(
            await reading(db_reads, organizations.read_organization, access=access)
        )

    @patch("/{org_id:str}", operation_id="updateOrganization", access=requires("org:write"))
    async def update_organization(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.OrganizationUpdate],
    ) -> schemas.OrganizationRead:
        """Change the name, business information or time zone; omitted fields stay."""
        return schemas.OrganizationRead.from_row(
            await organizations.update_organization(db_session, access=access, body=data)
        )

    @delete("/{org_id:str}", operation_id="deleteOrganization", access=requires_role(OWNER))
    async def delete_organization(
        self, db_session: DbSession, access: Access, org_id: PathId
    ) -> None:
        """Delete the organization and everything it owns (OWNER only)."""
        await organizations.delete_organization(db_session, access=access)


class MemberController(Controller):
    path = "/organizations/{org_id:str}/members"
    tags = ["members"]

    @get("/", operation_id="listMembers", access=requires("members:read"))
    async def list_members(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.MemberList:
        """The organization's members with their roles and status, paged."""
        return listing(
            schemas.MemberList,
            await reading(db_reads, members.list_members, access=access, paging=paging),
        )

    @post("/", operation_id="inviteMember", access=requires("members:write"))
    async def invite_member(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.MemberInvite],
    ) -> schemas.MemberRead:
        """Add a member by email; an unknown email becomes an invited user."""
        return await members.invite_member(db_session, access=access, body=data)

    @get("/{user_id:str}", operation_id="getMember", access=requires("members:read"))
    async def get_member(
        self, db_reads: DbReads, access: Access, org_id: PathId, user_id: PathId
    ) -> schemas.MemberRead:
        """One member of the organization, with their role."""
        return schemas.MemberRead.from_row(
            await reading(db_reads, members.read_member, access=access, user_id=user_id)
        )

    @patch("/{user_id:str}", operation_id="updateMemberRole", access=requires("members:write"))
    async def update_member_role(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        user_id: PathId,
        data: JSONBody[schemas.MemberRoleUpdate],
    ) -> schemas.MemberRead:
        """Give the member another role; the membership keeps its id."""
        return await members.change_member_role(
            db_session, access=access, user_id=user_id, body=data
        )

    @delete("/{user_id:str}", operation_id="removeMember", access=requires("members:write"))
    async def remove_member(
        self, db_session: DbSession, access: Access, org_id: PathId, user_id: PathId
    ) -> None:
        """Remove a member from the organization (the owner cannot be removed)."""
        await members.remove_member(db_session, access=access, user_id=user_id)


class RoleController(Controller):
    path = "/orgs/{org_id:str}/roles"
    tags = ["roles"]

    @get("/", operation_id="listRoles", access=requires("roles:read"))
    async def list_roles(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.RoleList:
        """The organization's system and custom roles with their permissions, paged."""
        return listing(
            schemas.RoleList,
            await reading(db_reads, roles.list_roles, access=access, paging=paging),
        )

    @post("/", operation_id="createRole", access=requires("roles:write"))
    async def create_role(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.RoleCreate],
    ) -> schemas.RoleRead:
        """Create a custom role: a name and a list of known permissions."""
        return schemas.RoleRead.from_row(
            await roles.create_role(db_session, access=access, body=data)
        )

    @get("/{role_id:str}", operation_id="getRole", access=requires("roles:read"))
    async def get_role(
        self, db_reads: DbReads, access: Access, org_id: PathId, role_id: PathId
    ) -> schemas.RoleRead:
        """One role with its permissions."""
        return schemas.RoleRead.from_row(
            await reading(db_reads, roles.read_role, access=access, role_id=role_id)
        )

    @patch("/{role_id:str}", operation_id="updateRole", access=requires("roles:write"))
    async def update_role(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        role_id: PathId,
        data: JSONBody[schemas.RoleUpdate],
    ) -> schemas.RoleRead:
        """Change a role's name or permissions; omitted fields stay."""
        return schemas.RoleRead.from_row(
            await roles.update_role(db_session, access=access, role_id=role_id, body=data)
        )

    @delete("/{role_id:str}", operation_id="deleteRole", access=requires("roles:write"))
    async def delete_role(
        self, db_session: DbSession, access: Access, org_id: PathId, role_id: PathId
    ) -> None:
        """Delete a custom role (system roles: 409); its members move to GUEST."""
        await roles.delete_role(db_session, access=access, role_id=role_id)


class PlatformTokenController(Controller):
    path = "/orgs/{org_id:str}/platform-tokens"
    tags = ["platform tokens"]

    @get("/", operation_id="listPlatformTokens", access=requires_role(ADMIN))
    async def list_tokens(
        self, db_reads: DbReads, access: Access, org_id: PathId, paging: Page
    ) -> schemas.PlatformTokenList:
        """The organization's platform tokens, never their values, paged (ADMIN/OWNER)."""
        return listing(
            schemas.PlatformTokenList,
            await reading(
                db_reads, platform_tokens.list_platform_tokens, access=access, paging=paging
            ),
        )

    @post("/", operation_id="createPlatformToken", access=requires_role(ADMIN))
    async def create_token(
        self,
        db_session: DbSession,
        access: Access,
        org_id: PathId,
        data: JSONBody[schemas.PlatformTokenCreate],
    ) -> schemas.PlatformTokenCreated:
        """Create a token; the full `pat_…` value is in this response only."""
        return await platform_tokens.create_platform_token(db_session, access=access, body=data)

    @get("/{token_id:str}", operation_id="getPlatformToken", access=requires_role(ADMIN))
    async def get_token(
        self, db_reads: DbReads, access: Access, org_id: PathId, token_id: PathId
    ) -> schemas.PlatformTokenRead:
        """One platform token, never its value (ADMIN/OWNER)."""
        return schemas.PlatformTokenRead.from_row(
            await reading(
                db_reads, platform_tokens.read_platform_token, access=access, token_id=token_id
            )
        )

    @delete("/{token_id:str}", operation_id="revokePlatformToken", access=requires_role(ADMIN))
    async def revoke_token(
        self, db_session: DbSession, access: Access, org_id: PathId, token_id: PathId
    ) -> None:
        """Revoke the token (it stays listed with `is_active` false)."""
        await platform_tokens.revoke_platform_token(db_session, access=access, token_id=token_id)


CONTROLLERS = [
    AuthController,
    OrganizationController,
    MemberController,
    RoleController,
    PlatformTokenController,
]
