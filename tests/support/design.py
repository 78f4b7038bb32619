"""DESIGN §4 written out once for the tests, so they never trust the code's own catalogue."""

from __future__ import annotations

PERMISSION_CATALOGUE: tuple[str, ...] = (
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
)
ALL_PERMISSIONS = frozenset(PERMISSION_CATALOGUE)
READS = frozenset(p for p in PERMISSION_CATALOGUE if p.endswith(":read"))
ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "OWNER": ALL_PERMISSIONS,
    "ADMIN": ALL_PERMISSIONS,
    "MEMBER": READS
    | {"scenarios:write", "scenarios:run", "knowledge:write", "triggers:write", "agents:write"},
    "VIEWER": READS,
    "GUEST": frozenset(),
}
USER_ROLES = ("OWNER", "ADMIN", "MEMBER", "VIEWER", "GUEST")
