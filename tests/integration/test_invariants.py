"""Invariants in the schema: a write that breaks one is refused by PostgreSQL itself, whoever
makes it (a batch's counters and window, counts never negative, statuses and other
enum-valued columns from their enum).  The writes here are raw SQL, as a bug or a hand at a
psql prompt would make them; that the migrations add exactly these constraints is
``test_migrations``'s."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg.errors
import pytest
from sqlalchemy import CheckConstraint, Connection, Engine, Table, create_engine, insert, update
from sqlalchemy.exc import IntegrityError

from shared.db.models import Base

# One write breaking exactly one constraint, per constraint: (table, values, constraint).
BREAKS: list[tuple[str, dict[str, Any], str]] = [
    ("users", {"status": "banned"}, "ck_users_status"),
    ("organizations", {"outbound_version": -1}, "ck_organizations_outbound_version_not_negative"),
    ("batch_runs", {"status": "paused"}, "ck_batch_runs_status"),
    (
        "batch_runs",
        {"status": "completed", "dispatched_scenarios": -1},
        "ck_batch_runs_counts_not_negative",
    ),
    ("batch_runs", {"max_concurrency": 0}, "ck_batch_runs_max_concurrency_positive"),
    ("batch_runs", {"repetitions": 0}, "ck_batch_runs_repetitions_in_range"),
    ("batch_runs", {"repetitions": 21}, "ck_batch_runs_repetitions_in_range"),
    ("batch_runs", {"judge_repetitions": 0}, "ck_batch_runs_judge_repetitions_in_range"),
    ("batch_runs", {"judge_repetitions": 6}, "ck_batch_runs_judge_repetitions_in_range"),
    (
        "batch_runs",
        {"status": "error", "completed_scenarios": 1},
        "ck_batch_runs_completed_is_sum",
    ),
    (
        "batch_runs",
        {"status": "completed", "completed_scenarios": 5, "passed_scenarios": 5},
        "ck_batch_runs_completed_within_total",
    ),
    (
        "batch_runs",
        {"status": "completed", "dispatched_scenarios": 5},
        "ck_batch_runs_dispatched_within_total",
    ),
    # An active batch never counts a run it did not hand out ...
    (
        "batch_runs",
        {"status": "running", "completed_scenarios": 1, "passed_scenarios": 1},
        "ck_batch_runs_window",
    ),
    # ... nor has more runs in flight than its window.
    ("batch_runs", {"status": "running", "dispatched_scenarios": 3}, "ck_batch_runs_window"),
    ("llm_providers", {"provider": "gemini"}, "ck_llm_providers_provider"),
    ("llm_providers", {"output_cost_per_mtok": -0.5}, "ck_llm_providers_costs_not_negative"),
    # request_options is an object; anthropic_version belongs to anthropic providers.
    ("llm_providers", {"request_options": ["x"]}, "ck_llm_providers_request_options_object"),
    (
        "llm_providers",
        {"anthropic_version": "2023-06-01"},
        "ck_llm_providers_anthropic_version_kind",
    ),
    ("agents", {"kind": "grpc"}, "ck_agents_kind"),
    ("agents", {"protocol": "soap"}, "ck_agents_protocol"),
    (
        "knowledge_documents",
        {"processing_status": "lost"},
        "ck_knowledge_documents_processing_status",
    ),
    ("knowledge_documents", {"bookmark_mode": "often"}, "ck_knowledge_documents_bookmark_mode"),
    ("knowledge_documents", {"mime_type": "text/html"}, "ck_knowledge_documents_mime_type"),
    (
        "knowledge_documents",
        {"processing_progress": 101},
        "ck_knowledge_documents_processing_progress",
    ),
    (
        "knowledge_documents",
        {"processing_progress": -1},
        "ck_knowledge_documents_processing_progress",
    ),
    (
        "knowledge_documents",
        {"processing_attempts": -1},
        "ck_knowledge_documents_counts_not_negative",
    ),
    ("knowledge_chunks", {"position": -1}, "ck_knowledge_chunks_position_not_negative"),
    ("scenario_turns", {"order_index": -1}, "ck_scenario_turns_order_index_not_negative"),
    ("criteria", {"order_index": -1}, "ck_criteria_order_index_not_negative"),
    ("criteria", {"criteria_type": "vibes"}, "ck_criteria_criteria_type"),
    # A criterion is a turn's or a conversation criterion of its scenario: never both, never
    # neither; so is a criterion result a turn result's or its run's.
    ("criteria", {"scenario_id": uuid.UUID(int=2)}, "ck_criteria_one_place"),
    ("criteria", {"turn_id": None}, "ck_criteria_one_place"),
    # Expected arguments: an object, on a tool_called criterion only.
    (
        "criteria",
        {"expected_arguments": {"order_id": "AB-1"}},
        "ck_criteria_expected_arguments_of_tool_called",
    ),
    (
        "criteria",
        {"criteria_type": "tool_called", "expected_arguments": ["order_id"]},
        "ck_criteria_expected_arguments_of_tool_called",
    ),
    ("scenario_runs", {"status": "paused"}, "ck_scenario_runs_status"),
    ("scenario_runs", {"attempts": -1}, "ck_scenario_runs_attempts_not_negative"),
    ("scenario_runs", {"simulation_outcome": "bored"}, "ck_scenario_runs_simulation_outcome"),
    # Only a run in error has the turn it ended on.
    (
        "scenario_runs",
        {"status": "passed", "error_turn": {"turn_index": 0}},
        "ck_scenario_runs_error_turn_of_error",
    ),
    # A trace id is 32 lower-case hex digits (W3C trace context), or null.
    ("scenario_runs", {"trace_id": "not-a-trace-id"}, "ck_scenario_runs_trace_id_hex"),
    ("scenario_runs", {"judge_repetitions": 6}, "ck_scenario_runs_judge_repetitions_in_range"),
    ("turn_results", {"turn_index": -1}, "ck_turn_results_turn_index_not_negative"),
    ("turn_results", {"source": "dreamt"}, "ck_turn_results_source"),
    ("turn_results", {"tool_calls": {"name": "x"}}, "ck_turn_results_tool_calls_array"),
    ("criterion_results", {"verdict": "MAYBE"}, "ck_criterion_results_verdict"),
    ("criterion_results", {"input_tokens": -1}, "ck_criterion_results_counts_not_negative"),
    ("criterion_results", {"run_id": uuid.UUID(int=1)}, "ck_criterion_results_one_place"),
    ("criterion_results", {"turn_result_id": None}, "ck_criterion_results_one_place"),
    ("calibrations", {"status": "paused"}, "ck_calibrations_status"),
    ("calibrations", {"example_count": -1}, "ck_calibrations_counts_not_negative"),
    ("triggers", {"trigger_type": "email"}, "ck_triggers_trigger_type"),
    ("triggers", {"status": "paused"}, "ck_triggers_status"),
    ("triggers", {"action": "reboot"}, "ck_triggers_action"),
    ("triggers", {"max_concurrency": 0}, "ck_triggers_max_concurrency_positive"),
    ("triggers", {"repetitions": 21}, "ck_triggers_repetitions_in_range"),
    ("trigger_executions", {"source": "pigeon"}, "ck_trigger_executions_source"),
    ("trigger_executions", {"status": "paused"}, "ck_trigger_executions_status"),
    ("trigger_executions", {"attempts": -1}, "ck_trigger_executions_attempts_not_negative"),
    ("notification_events", {"type": "batch.exploded"}, "ck_notification_events_type"),
    ("notification_events", {"status": "lost"}, "ck_notification_events_status"),
    ("notification_events", {"attempts": -1}, "ck_notification_events_attempts_not_negative"),
    ("webhook_deliveries", {"event_type": "batch.exploded"}, "ck_webhook_deliveries_event_type"),
    ("webhook_deliveries", {"status": "lost"}, "ck_webhook_deliveries_status"),
    ("webhook_deliveries", {"attempts": -1}, "ck_webhook_deliveries_attempts_not_negative"),
]

# What a valid row needs beyond its columns' defaults: a batch of four runs, a window of two.
VALID: dict[str, dict[str, Any]] = {
    "batch_runs": {"total_scenarios": 4, "max_concurrency": 2},
    "llm_providers": {"provider": "openai"},
    "agents": {"kind": "http", "protocol": "spar"},
    "knowledge_documents": {"mime_type": "text/plain"},
    "knowledge_chunks": {"search_config": "english"},
    "criteria": {"criteria_type": "contains", "turn_id": uuid.uuid4()},
    "criterion_results": {"verdict": "PASS", "turn_result_id": uuid.uuid4()},
    "triggers": {"trigger_type": "webhook"},
    "trigger_executions": {"source": "manual"},
    "notification_events": {"type": "batch.completed", "status": "pending"},
    "webhook_deliveries": {"event_type": "batch.completed", "status": "pending"},
}


def _filler(table: Table) -> dict[str, Any]:
    """A valid row of ``table``: a value of its type for every required column that has no
    default (Core's insert fills in the defaults)."""
    by_type: dict[type, Any] = {
        int: 0,
        float: 0.0,
        bool: False,
        str: "x",
        object: {},  # JSONB
        datetime: datetime.now(UTC),
    }
    row = {"id": uuid.uuid4()}  # read back by the test
    for column in table.columns:
        if column.nullable or column.default is not None or column.server_default is not None:
            continue
        if column.computed is not None or column.name in VALID.get(table.name, {}):
            continue
        kind = getattr(column.type, "impl", column.type).python_type  # UTCDateTime's impl
        row[column.name] = uuid.uuid4() if kind is uuid.UUID else by_type[kind]
    return {**row, **VALID.get(table.name, {})}


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def conn(engine: Engine) -> Iterator[Connection]:
    """A connection whose writes are rolled back, foreign keys off (no parents needed):
    CHECK constraints are not triggers, ``replica`` leaves them on."""
    with engine.connect() as connection:
        transaction = connection.begin()
        connection.exec_driver_sql("SET LOCAL session_replication_role = replica")
        try:
            yield connection
        finally:
            transaction.rollback()


def _refused(conn: Connection, statement: Any) -> str:
    """The constraint PostgreSQL named in refusing ``statement``."""
    with pytest.raises(IntegrityError) as refused, conn.begin_nested():
        conn.execute(statement)
    assert isinstance(refused.value.orig, psycopg.errors.CheckViolation), refused.value
    name = refused.value.orig.diag.constraint_name
    assert name is not None
    return name


def _table(name: str) -> Table:
    return Base.metadata.tables[name]


@pytest.mark.parametrize(
    ("table", "values", "constraint"), BREAKS, ids=[f"{c}:{v}" for _, v, c in BREAKS]
)
def test_a_write_that_breaks_an_invariant_is_refused(
    conn: Connection, table: str, values: dict[str, Any], constraint: str
) -> None:
    rows = _table(table)
    row = _filler(rows)
    conn.execute(insert(rows).values(row))  # the valid row is accepted
    refused_update = update(rows).where(rows.c.id == row["id"]).values(values)
    assert _refused(conn, refused_update) == constraint
    # Written straight away, it is refused just the same.
    refused_insert = insert(rows).values({**row, "id": uuid.uuid4(), **values})
    assert _refused(conn, refused_insert) == constraint


def test_every_constraint_the_models_declare_is_tried() -> None:
    declared = {
        constraint.name
        for table in Base.metadata.tables.values()
        for constraint in table.constraints
        if isinstance(constraint, CheckConstraint)
    }
    assert declared == {constraint for _, _, constraint in BREAKS}


def test_a_cancelled_batch_counts_runs_it_never_handed_out(conn: Connection) -> None:
    """The window's one exception (shared.batches.window): a cancel counts the runs not handed
    out as completed (``error``) and closes the batch, so an ended batch may have completed
    more runs than it dispatched; an active one never."""
    batches = _table("batch_runs")
    row = _filler(batches)
    conn.execute(insert(batches).values(row))
    cancelled = {
        "status": "error",
        "error_message": "cancelled",
        "dispatched_scenarios": 1,
        "completed_scenarios": 3,
        "error_scenarios": 3,
    }
    conn.execute(update(batches).where(batches.c.id == row["id"]).values(cancelled))
    # The run in flight ends: counted, nothing handed out in its place.
    conn.execute(
        update(batches)
        .where(batches.c.id == row["id"])
        .values(completed_scenarios=4, passed_scenarios=1)
    )
    reopened = update(batches).where(batches.c.id == row["id"]).values(status="running")
    assert _refused(conn, reopened) == "ck_batch_runs_window"


def test_an_unset_optional_value_passes(conn: Connection) -> None:
    """An llm agent has no protocol, a provider may have no prices: NULL is the column's own
    rule, not the constraint's."""
    for name, values in (
        ("agents", {"kind": "llm", "protocol": None}),
        ("llm_providers", {"input_cost_per_mtok": None, "output_cost_per_mtok": None}),
    ):
        rows = _table(name)
        conn.execute(insert(rows).values({**_filler(rows), **values}))
