"""notifications: webhook endpoints, the events that happened (an outbox) and their
deliveries; the permissions notifications:read and notifications:write in the system roles

Every existing organization's system roles gain the new permissions as a new organization's
have them: ``notifications:read`` for OWNER, ADMIN, MEMBER and VIEWER (every role that
holds every ``:read``), ``notifications:write`` for OWNER and ADMIN.  Custom roles and
platform tokens keep what they hold.  Downgrading takes both out of every role and token.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29 10:00:00
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import shared.db.base

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_READ = "notifications:read"
_WRITE = "notifications:write"
# Appended, as the catalogue lists them last: a role's permissions stay in catalogue order.
_GRANTS = {
    "OWNER": [_READ, _WRITE],
    "ADMIN": [_READ, _WRITE],
    "MEMBER": [_READ],
    "VIEWER": [_READ],
}


def upgrade() -> None:
    op.create_table(
        "notification_events",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("subject_id", sa.Uuid(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("completed_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'announcing', 'announced', 'failed')",
            name=op.f("ck_notification_events_status"),
        ),
        sa.CheckConstraint(
            "type IN ('batch.completed', 'batch.regressed', 'trigger.execution.failed', 'calibration.completed')",
            name=op.f("ck_notification_events_type"),
        ),
        sa.CheckConstraint(
            "attempts >= 0", name=op.f("ck_notification_events_attempts_not_negative")
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_notification_events_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notification_events")),
        sa.UniqueConstraint(
            "type", "subject_id", name=op.f("uq_notification_events_type_subject_id")
        ),
    )
    op.create_index(
        "ix_notification_events_status_updated",
        "notification_events",
        ["status", "updated_at"],
        unique=False,
    )
    op.create_table(
        "webhook_endpoints",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("secret_encrypted", sa.Text(), nullable=False),
        sa.Column("failing_since", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("disabled_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["created_by_user_id"],
            ["users.id"],
            name=op.f("fk_webhook_endpoints_created_by_user_id_users"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_webhook_endpoints_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_endpoints")),
    )
    op.create_index(
        "ix_webhook_endpoints_org_created",
        "webhook_endpoints",
        ["organization_id", "created_at"],
        unique=False,
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("organization_id", sa.Uuid(), nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("retry_until", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_attempt_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_response_code", sa.Integer(), nullable=True),
        sa.Column("last_response_body", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("heartbeat_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("completed_at", shared.db.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", shared.db.base.UTCDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "event_type IN ('batch.completed', 'batch.regressed', 'trigger.execution.failed', 'calibration.completed')",
            name=op.f("ck_webhook_deliveries_event_type"),
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'sending', 'succeeded', 'failed')",
            name=op.f("ck_webhook_deliveries_status"),
        ),
        sa.CheckConstraint(
            "attempts >= 0", name=op.f("ck_webhook_deliveries_attempts_not_negative")
        ),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name=op.f("fk_webhook_deliveries_endpoint_id_webhook_endpoints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["notification_events.id"],
            name=op.f("fk_webhook_deliveries_event_id_notification_events"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["organization_id"],
            ["organizations.id"],
            name=op.f("fk_webhook_deliveries_organization_id_organizations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint(
            "event_id", "endpoint_id", name=op.f("uq_webhook_deliveries_event_id_endpoint_id")
        ),
    )
    op.create_index(
        "ix_webhook_deliveries_endpoint_created",
        "webhook_deliveries",
        ["endpoint_id", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_webhook_deliveries_status_updated",
        "webhook_deliveries",
        ["status", "updated_at"],
        unique=False,
    )
    for role, granted in _GRANTS.items():
        op.execute(
            sa.text(
                "UPDATE roles SET permissions = permissions || COALESCE(("
                " SELECT jsonb_agg(p) FROM jsonb_array_elements_text(CAST(:granted AS jsonb)) p"
                " WHERE NOT roles.permissions ? p), '[]'::jsonb)"
                " WHERE is_system AND name = :role"
            ).bindparams(granted=json.dumps(granted), role=role)
        )


def downgrade() -> None:
    for statement in (
        "UPDATE roles SET permissions = permissions - :r - :w",
        "UPDATE platform_tokens SET permissions = permissions - :r - :w",
    ):
        op.execute(sa.text(statement).bindparams(r=_READ, w=_WRITE))
    op.drop_index("ix_webhook_deliveries_status_updated", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_endpoint_created", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhook_endpoints_org_created", table_name="webhook_endpoints")
    op.drop_table("webhook_endpoints")
    op.drop_index("ix_notification_events_status_updated", table_name="notification_events")
    op.drop_table("notification_events")
