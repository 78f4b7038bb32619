"""simulated users and conversation criteria: scenarios.simulation, conversation criteria
and their results, turn_results.source, scenario_runs.simulation_outcome,
llm_providers.is_default_simulator

A scenario may carry a simulated user (``simulation``, JSON; null for every existing
scenario) and criteria judged once on the whole conversation: a criterion belongs to a
turn (``turn_id``) or to its scenario (``scenario_id``), never both, and a criterion
result to a turn result (``turn_result_id``) or to its run (``run_id``).  A turn result
says where its message came from (``source``: ``scripted`` for every existing one) and
which deterministic conversation criteria its reply matched (``conversation_matches``);
a run how its simulated conversation ended (``simulation_outcome``).  A provider may be
its organization's default simulator (at most one, like the default judge).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "llm_providers",
        sa.Column("is_default_simulator", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index(
        "uq_llm_providers_default_simulator",
        "llm_providers",
        ["organization_id"],
        unique=True,
        postgresql_where=sa.text("is_default_simulator"),
    )
    op.add_column("scenarios", sa.Column("simulation", postgresql.JSONB(), nullable=True))

    op.alter_column("criteria", "turn_id", existing_type=sa.Uuid(), nullable=True)
    op.add_column("criteria", sa.Column("scenario_id", sa.Uuid(), nullable=True))
    op.create_foreign_key(
        "fk_criteria_scenario_id_scenarios",
        "criteria",
        "scenarios",
        ["scenario_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_unique_constraint(
        "uq_criteria_scenario_id_order_index", "criteria", ["scenario_id", "order_index"]
    )

    op.alter_column("criterion_results", "turn_result_id", existing_type=sa.Uuid(), nullable=True)
    op.add_column("criterion_results", sa.Column("run_id", sa.Uuid(), nullable=True))
    op.create_foreign_key(
        "fk_criterion_results_run_id_scenario_runs",
        "criterion_results",
        "scenario_runs",
        ["run_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_unique_constraint(
        "uq_criterion_results_run_id_criteria_id", "criterion_results", ["run_id", "criteria_id"]
    )

    op.add_column(
        "turn_results",
        sa.Column("source", sa.String(16), nullable=False, server_default=sa.text("'scripted'")),
    )
    op.add_column(
        "turn_results", sa.Column("conversation_matches", postgresql.JSONB(), nullable=True)
    )
    op.add_column("scenario_runs", sa.Column("simulation_outcome", sa.String(16), nullable=True))
    # Spelled as 0015 spells its constraints: the name as it is, no naming convention.
    op.execute(
        "ALTER TABLE criteria ADD CONSTRAINT ck_criteria_one_place"
        " CHECK ((turn_id IS NULL) <> (scenario_id IS NULL))"
    )
    op.execute(
        "ALTER TABLE criterion_results ADD CONSTRAINT ck_criterion_results_one_place"
        " CHECK ((turn_result_id IS NULL) <> (run_id IS NULL))"
    )
    op.execute(
        "ALTER TABLE turn_results ADD CONSTRAINT ck_turn_results_source"
        " CHECK (source IN ('scripted', 'simulated'))"
    )
    op.execute(
        "ALTER TABLE scenario_runs ADD CONSTRAINT ck_scenario_runs_simulation_outcome"
        " CHECK (simulation_outcome IN ('goal_reached', 'gave_up', 'max_turns'))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE scenario_runs DROP CONSTRAINT ck_scenario_runs_simulation_outcome")
    op.execute("ALTER TABLE turn_results DROP CONSTRAINT ck_turn_results_source")
    op.execute("ALTER TABLE criterion_results DROP CONSTRAINT ck_criterion_results_one_place")
    op.execute("ALTER TABLE criteria DROP CONSTRAINT ck_criteria_one_place")
    op.drop_column("scenario_runs", "simulation_outcome")
    op.drop_column("turn_results", "conversation_matches")
    op.drop_column("turn_results", "source")
    # Conversation results and criteria have no turn: they go with the columns.
    op.execute("DELETE FROM criterion_results WHERE run_id IS NOT NULL")
    op.drop_constraint(
        "uq_criterion_results_run_id_criteria_id", "criterion_results", type_="unique"
    )
    op.drop_constraint(
        "fk_criterion_results_run_id_scenario_runs", "criterion_results", type_="foreignkey"
    )
    op.drop_column("criterion_results", "run_id")
    op.alter_column("criterion_results", "turn_result_id", existing_type=sa.Uuid(), nullable=False)
    op.execute("DELETE FROM criteria WHERE scenario_id IS NOT NULL")
    op.drop_constraint("uq_criteria_scenario_id_order_index", "criteria", type_="unique")
    op.drop_constraint("fk_criteria_scenario_id_scenarios", "criteria", type_="foreignkey")
    op.drop_column("criteria", "scenario_id")
    op.alter_column("criteria", "turn_id", existing_type=sa.Uuid(), nullable=False)
    op.drop_column("scenarios", "simulation")
    op.drop_index(
        "uq_llm_providers_default_simulator",
        table_name="llm_providers",
        postgresql_where=sa.text("is_default_simulator"),
    )
    op.drop_column("llm_providers", "is_default_simulator")
