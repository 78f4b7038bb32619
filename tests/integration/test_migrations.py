"""Alembic migrations are the schema's only source: they must match the models exactly."""

from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, make_url

from shared.db.models import Base
from tests.support.processes import admin_sql


def test_migrated_schema_matches_the_models(database_url):
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


@pytest.fixture
def empty_database_url(database_url: str) -> Iterator[str]:
    """A database of its own, with no schema yet, beside the suite's."""
    url = make_url(database_url)
    fresh = url.set(database=f"{url.database}_migrations").render_as_string(hide_password=False)
    drop = 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    admin_sql(fresh, drop, 'CREATE DATABASE "{name}"')
    yield fresh
    admin_sql(fresh, drop)


def test_the_window_counter_is_backfilled_from_the_runs_handed_out(empty_database_url):
    """0005 adds ``batch_runs.dispatched_scenarios``: a batch in flight during the upgrade
    keeps its window (runs handed out and not yet ended)."""
    import uuid
    from datetime import UTC, datetime

    from sqlalchemy import text

    from shared.db.migrate import upgrade

    url = empty_database_url
    upgrade(url, "0004")
    engine = create_engine(url)
    org, batch = uuid.uuid4().hex, uuid.uuid4().hex
    now = datetime.now(UTC).isoformat()
    try:
        with engine.begin() as conn:
            # Foreign keys off for this session: no organization, agent or scenario needed.
            conn.execute(text("SET session_replication_role = replica"))
            conn.execute(
                text(
                    "INSERT INTO batch_runs (id, organization_id, agent_id, agent_name, status,"
                    " max_concurrency, total_scenarios, completed_scenarios, passed_scenarios,"
                    " failed_scenarios, error_scenarios, created_at, updated_at) VALUES (:id,"
                    " :org, :agent, 'a', 'running', 2, 4, 1, 1, 0, 0, :now, :now)"
                ),
                {"id": batch, "org": org, "agent": uuid.uuid4().hex, "now": now},
            )
            for status, dispatched in (("passed", now), ("running", now), ("pending", None)):
                conn.execute(
                    text(
                        "INSERT INTO scenario_runs (id, organization_id, scenario_id, agent_id,"
                        " status, cost_summary, snapshot, batch_run_id, dispatched_at,"
                        " created_at, updated_at) VALUES (:id, :org, :s, :a, :status, '{}',"
                        " '{}', :batch, :dispatched, :now, :now)"
                    ),
                    {
                        "id": uuid.uuid4().hex,
                        "org": org,
                        "s": uuid.uuid4().hex,
                        "a": uuid.uuid4().hex,
                        "status": status,
                        "batch": batch,
                        "dispatched": dispatched,
                        "now": now,
                    },
                )
        upgrade(url)
        with engine.connect() as conn:
            counted = conn.execute(text("SELECT dispatched_scenarios FROM batch_runs")).scalar()
    finally:
        engine.dispose()
    assert counted == 2
