"""organizations.outbound_version moved by a trigger on the outbound tables

Workers cache an organization's agents, LLM providers, credentials and allowed domains
under its ``outbound_version`` (0006).  The version used to be bumped by a call every
write service had to remember; now every INSERT, UPDATE or DELETE of a row of those
tables bumps it in the same transaction, whoever writes it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 09:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OUTBOUND_TABLES = ("allowed_domains", "credentials", "llm_providers", "agents")
FUNCTION = "bump_outbound_version"

# A row that moves between organizations (none does today) changes both.
_BUMP = """
CREATE FUNCTION bump_outbound_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE organizations SET outbound_version = outbound_version + 1
        WHERE id = OLD.organization_id;
    END IF;
    IF TG_OP = 'INSERT'
        OR (TG_OP = 'UPDATE' AND NEW.organization_id IS DISTINCT FROM OLD.organization_id) THEN
        UPDATE organizations SET outbound_version = outbound_version + 1
        WHERE id = NEW.organization_id;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(_BUMP)
    for table in OUTBOUND_TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_outbound_version"
            f" AFTER INSERT OR UPDATE OR DELETE ON {table}"
            f" FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )


def downgrade() -> None:
    for table in OUTBOUND_TABLES:
        op.execute(f"DROP TRIGGER {table}_outbound_version ON {table}")
    op.execute(f"DROP FUNCTION {FUNCTION}()")
