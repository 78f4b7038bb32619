"""invariants in the schema: CHECK constraints where the code relies on an invariant (a
batch's counters and window, counts never negative, enum-valued columns from their enum)

Existing rows are validated: a row that breaks a constraint stops the migration, which
names the constraint, its rule and the first rows that break it; correct them and migrate
again.  Plain ``ADD CONSTRAINT`` (validating at once), one ``ALTER TABLE`` per table so
each table is read once: the migration runs in one transaction, so ``NOT VALID`` followed
by ``VALIDATE CONSTRAINT`` would hold the same lock to the commit and gain nothing.

The values are spelled out here (a migration is history); the models build the same
constraints from the enums (shared.db.checks).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 20:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHECKS: dict[str, tuple[tuple[str, str], ...]] = {
    "users": (("ck_users_status", "status IN ('active', 'invited')"),),
    "organizations": (("ck_organizations_outbound_version_not_negative", "outbound_version >= 0"),),
    "batch_runs": (
        ("ck_batch_runs_status", "status IN ('queued', 'running', 'completed', 'error')"),
        (
            "ck_batch_runs_counts_not_negative",
            "total_scenarios >= 0 AND completed_scenarios >= 0 AND passed_scenarios >= 0"
            " AND failed_scenarios >= 0 AND error_scenarios >= 0 AND dispatched_scenarios >= 0",
        ),
        ("ck_batch_runs_max_concurrency_positive", "max_concurrency >= 1"),
        (
            "ck_batch_runs_completed_is_sum",
            "completed_scenarios = passed_scenarios + failed_scenarios + error_scenarios",
        ),
        ("ck_batch_runs_completed_within_total", "completed_scenarios <= total_scenarios"),
        ("ck_batch_runs_dispatched_within_total", "dispatched_scenarios <= total_scenarios"),
        (
            "ck_batch_runs_window",
            "NOT (status IN ('queued', 'running')) OR (completed_scenarios <= dispatched_scenarios"
            " AND dispatched_scenarios - completed_scenarios <= max_concurrency)",
        ),
    ),
    "llm_providers": (
        ("ck_llm_providers_provider", "provider IN ('openai', 'anthropic', 'openai_compatible')"),
        (
            "ck_llm_providers_costs_not_negative",
            "input_cost_per_mtok >= 0 AND output_cost_per_mtok >= 0",
        ),
    ),
    "agents": (
        ("ck_agents_kind", "kind IN ('http', 'llm')"),
        ("ck_agents_protocol", "protocol IN ('spar', 'openai_chat')"),
    ),
    "knowledge_documents": (
        (
            "ck_knowledge_documents_processing_status",
            "processing_status IN ('queued', 'processing', 'ready', 'failed')",
        ),
        (
            "ck_knowledge_documents_bookmark_mode",
            "bookmark_mode IN ('none', 'always', 'on_demand')",
        ),
        ("ck_knowledge_documents_mime_type", "mime_type IN ('text/markdown', 'text/plain')"),
        (
            "ck_knowledge_documents_processing_progress",
            "processing_progress >= 0 AND processing_progress <= 100",
        ),
        (
            "ck_knowledge_documents_counts_not_negative",
            "bytes_ingested >= 0 AND processing_attempts >= 0",
        ),
    ),
    "knowledge_chunks": (("ck_knowledge_chunks_position_not_negative", "position >= 0"),),
    "scenario_turns": (("ck_scenario_turns_order_index_not_negative", "order_index >= 0"),),
    "criteria": (
        ("ck_criteria_order_index_not_negative", "order_index >= 0"),
        (
            "ck_criteria_criteria_type",
            "criteria_type IN ('llm_evaluated', 'contains', 'not_contains', 'regex')",
        ),
    ),
    "scenario_runs": (
        (
            "ck_scenario_runs_status",
            "status IN ('pending', 'running', 'passed', 'failed', 'error')",
        ),
        ("ck_scenario_runs_attempts_not_negative", "attempts >= 0"),
    ),
    "turn_results": (("ck_turn_results_turn_index_not_negative", "turn_index >= 0"),),
    "criterion_results": (
        ("ck_criterion_results_verdict", "verdict IN ('PASS', 'FAIL')"),
        (
            "ck_criterion_results_counts_not_negative",
            "order_index >= 0 AND input_tokens >= 0 AND output_tokens >= 0",
        ),
    ),
    "calibrations": (
        ("ck_calibrations_status", "status IN ('queued', 'running', 'completed', 'failed')"),
        ("ck_calibrations_counts_not_negative", "example_count >= 0 AND attempts >= 0"),
    ),
    "triggers": (
        ("ck_triggers_trigger_type", "trigger_type IN ('scheduled', 'webhook')"),
        ("ck_triggers_status", "status IN ('active', 'inactive')"),
        ("ck_triggers_action", "action IN ('message', 'batch_run')"),
        ("ck_triggers_max_concurrency_positive", "max_concurrency >= 1"),
    ),
    "trigger_executions": (
        ("ck_trigger_executions_source", "source IN ('schedule', 'webhook', 'manual')"),
        (
            "ck_trigger_executions_status",
            "status IN ('queued', 'running', 'succeeded', 'failed', 'missed')",
        ),
        ("ck_trigger_executions_attempts_not_negative", "attempts >= 0"),
    ),
}
SHOWN = 5  # rows named per broken constraint


class InvariantBroken(RuntimeError):
    """Existing rows break a constraint this migration adds."""


def _broken(connection: sa.Connection, table: str) -> list[str]:
    """Each constraint of ``table`` that existing rows break, with the first of them."""
    found = []
    for name, rule in CHECKS[table]:
        row_id = sa.column("id")
        ids = connection.execute(
            sa.select(row_id)
            .select_from(sa.table(table))
            .where(sa.text(f"NOT ({rule})"))
            .order_by(row_id)
            .limit(SHOWN)
        ).scalars()
        shown = ", ".join(str(row_id) for row_id in ids)
        if shown:
            found.append(f"{name} ({rule}) is broken by {table} rows {shown}")
    return found


def upgrade() -> None:
    connection = op.get_bind()
    for table, checks in CHECKS.items():
        adds = ", ".join(f"ADD CONSTRAINT {name} CHECK ({rule})" for name, rule in checks)
        try:
            with connection.begin_nested():
                connection.execute(sa.text(f"ALTER TABLE {table} {adds}"))
        except sa.exc.IntegrityError:
            broken = _broken(connection, table) or [f"a constraint of {table} is broken"]
            raise InvariantBroken(
                "; ".join(broken) + " (first rows shown): correct them, then migrate again"
            ) from None


def downgrade() -> None:
    for table, checks in reversed(CHECKS.items()):
        drops = ", ".join(f"DROP CONSTRAINT {name}" for name, _ in checks)
        op.execute(f"ALTER TABLE {table} {drops}")
