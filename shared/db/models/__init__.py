"""Every ORM model, imported here so Alembic and the metadata see the whole schema."""

from shared.db.base import Base
from shared.db.models.identity import (
    Membership,
    Organization,
    PlatformToken,
    Role,
    User,
    UserToken,
)

__all__ = ["Base", "Membership", "Organization", "PlatformToken", "Role", "User", "UserToken"]
