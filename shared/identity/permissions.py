"""The permission catalogue and the system roles every organization starts with (DESIGN §4)."""

from __future__ import annotations

from typing import Literal, get_args

Permission = Literal[
    "org:read",
    "org:write",
    "members:read",
    "members:write",
    "roles:read",
    "roles:write",
    "domains:read",
    "domains:write",
    "credentials:read",
    "credentials:write",
    "providers:read",
    "providers:write",
    "agents:read",
    "agents:write",
    "scenarios:read",
    "scenarios:write",
    "scenarios:run",
    "knowledge:read",
    "knowledge:write",
    "knowledge:delete",
    "triggers:read",
    "triggers:write",
    "notifications:read",
    "notifications:write",
]

ALL_PERMISSIONS: tuple[str, ...] = get_args(Permission)
_READ = tuple(p for p in ALL_PERMISSIONS if p.endswith(":read"))

OWNER = "OWNER"
ADMIN = "ADMIN"
MEMBER = "MEMBER"
VIEWER = "VIEWER"
GUEST = "GUEST"

# OWNER and ADMIN hold every permission; what sets OWNER apart (deleting the organization,
# being irremovable) is a role rule, not a permission string.
SYSTEM_ROLES: dict[str, tuple[str, ...]] = {
    OWNER: ALL_PERMISSIONS,
    ADMIN: ALL_PERMISSIONS,
    MEMBER: (
        *_READ,
        "scenarios:write",
        "scenarios:run",
        "knowledge:write",
        "triggers:write",
        "agents:write",
    ),
    VIEWER: _READ,
    GUEST: (),
}

# Roles that pass a role rule, by the level it asks for.
ROLE_LEVELS: dict[str, tuple[str, ...]] = {
    ADMIN: (OWNER, ADMIN),
    OWNER: (OWNER,),
}


def ordered(permissions: set[str] | frozenset[str] | list[str]) -> list[str]:
    """Permissions in catalogue order, without duplicates: one canonical form to store and show."""
    chosen = set(permissions)
    return [p for p in ALL_PERMISSIONS if p in chosen]
