"""triggers and trigger_executions; a NOTIFY on spar_triggers for every trigger change

An execution is unique on (trigger_id, scheduled_for), so one slot fires once whoever
fires it, and on (trigger_id, webhook_id), so a retried delivery starts nothing new.
Every INSERT, UPDATE or DELETE of a trigger notifies the channel ``spar_triggers`` (with
the trigger's id) in the same transaction: the active scheduler listens and re-reads.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db.base

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


CHANNEL = "spar_triggers"
_NOTIFY = f"""
CREATE FUNCTION notify_trigger_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', COALESCE(NEW.id, OLD.id)::text);
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "triggers",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("trigger_type", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("cron_expression", sa.String(length=255), nullable=True),
        sa.Column("timezone", sa.String(length=64), nullable=True),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("scenario_ids", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("tags", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("max_concurrency", sa.Integer(), nullable=False),
        sa.Column("webhook_secret_encrypted", sa.Text(), nullable=False),
        sa.Column("schedule_from", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_triggers_agent_id_agents"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_triggers_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_triggers_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_triggers")),
    )
    op.create_index("ix_triggers_agent", "triggers", ["agent_id"], unique=False)
    op.create_index(
        "ix_triggers_org_created", "triggers", ["organization_id", "created_at"], unique=False
    )
    op.create_table(
        "trigger_executions",
        sa.Column("trigger_id", sa.Uuid(), nullable=False),
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("scheduled_for", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("webhook_id", sa.String(length=255), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
        sa.Column("batch_run_id", sa.Uuid(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("completed_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_run_id"],
            ["batch_runs.id"],
            name=op.f("fk_trigger_executions_batch_run_id_batch_runs"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_trigger_executions_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trigger_id"],
            ["triggers.id"],
            name=op.f("fk_trigger_executions_trigger_id_triggers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trigger_executions")),
        sa.UniqueConstraint(
            "trigger_id",
            "scheduled_for",
            name=op.f("uq_trigger_executions_trigger_id_scheduled_for"),
        ),
        sa.UniqueConstraint(
            "trigger_id", "webhook_id", name=op.f("uq_trigger_executions_trigger_id_webhook_id")
        ),
    )
    op.create_index(
        "ix_trigger_executions_status_updated",
        "trigger_executions",
        ["status", "updated_at"],
        unique=False,
    )
    op.create_index(
        "ix_trigger_executions_trigger_created",
        "trigger_executions",
        ["trigger_id", "created_at"],
        unique=False,
    )
    op.execute(_NOTIFY)
    op.execute(
        "CREATE TRIGGER triggers_notify AFTER INSERT OR UPDATE OR DELETE ON triggers"
        " FOR EACH ROW EXECUTE FUNCTION notify_trigger_change()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER triggers_notify ON triggers")
    op.execute("DROP FUNCTION notify_trigger_change()")
    op.drop_index("ix_trigger_executions_trigger_created", table_name="trigger_executions")
    op.drop_index("ix_trigger_executions_status_updated", table_name="trigger_executions")
    op.drop_table("trigger_executions")
    op.drop_index("ix_triggers_org_created", table_name="triggers")
    op.drop_index("ix_triggers_agent", table_name="triggers")
    op.drop_table("triggers")
