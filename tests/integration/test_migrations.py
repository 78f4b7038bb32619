"""Alembic migrations are the schema's only source: they must match the models exactly."""

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, column, create_engine, insert, make_url, table, text

from shared.db.migrate import alembic_config, upgrade
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


@pytest.fixture(scope="module")
def migrations_database_url(database_url: str) -> Iterator[str]:
    """A database of this module's own beside the suite's, made and dropped once (a drop
    waits for a checkpoint: seconds on a loaded machine)."""
    url = make_url(database_url)
    fresh = url.set(database=f"{url.database}_migrations").render_as_string(hide_password=False)
    drop = 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    admin_sql(fresh, drop, 'CREATE DATABASE "{name}"')
    yield fresh
    admin_sql(fresh, drop)


@pytest.fixture
def empty_database_url(migrations_database_url: str) -> str:
    """That database with no schema yet: its ``public`` schema (every table, type and
    Alembic's version of an earlier test) made anew."""
    engine = create_engine(migrations_database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DROP SCHEMA public CASCADE"))
            connection.execute(text("CREATE SCHEMA public"))
    finally:
        engine.dispose()
    return migrations_database_url


def test_the_window_counter_is_backfilled_from_the_runs_handed_out(empty_database_url):
    """0005 adds ``batch_runs.dispatched_scenarios``: a batch in flight during the upgrade
    keeps its window (runs handed out and not yet ended)."""
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


# --- the CHECK constraints (0015) -----------------------------------------------------------------

_CHECKS = text(
    'SELECT conrelid::regclass::text AS "table", conname, pg_get_constraintdef(oid)'
    " FROM pg_constraint WHERE contype = 'c' AND connamespace = 'public'::regnamespace"
)


def _checks(url: str) -> set[tuple[str, str, str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {tuple(row) for row in connection.execute(_CHECKS)}  # type: ignore[misc]
    finally:
        engine.dispose()


def test_the_migrations_check_what_the_models_check(database_url, empty_database_url):
    """Alembic's comparison leaves CHECK constraints out: the models' (built from the enums)
    and the migrations' (spelled out) are compared as PostgreSQL reads them back."""
    engine = create_engine(empty_database_url)
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()
    from_models = _checks(empty_database_url)
    assert len(from_models) >= 30
    assert _checks(database_url) == from_models


def _insert_batch(engine: Engine, **counts: object) -> str:
    """A batch row as 0014 knows it, foreign keys off (no organization or agent needed)."""
    batch = uuid.uuid4().hex
    now = datetime.now(UTC)
    row = {
        "id": batch,
        "organization_id": uuid.uuid4().hex,
        "agent_id": uuid.uuid4().hex,
        "agent_name": "a",
        "created_at": now,
        "updated_at": now,
        "status": "running",
        "max_concurrency": 2,
        "total_scenarios": 4,
        "completed_scenarios": 0,
        "passed_scenarios": 0,
        "failed_scenarios": 0,
        "error_scenarios": 0,
        "dispatched_scenarios": 0,
        **counts,
    }
    batches = table("batch_runs", *(column(name) for name in row))
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(insert(batches).values(row))
    return batch


def _revision(engine: Engine) -> str:
    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()


def test_the_invariants_migration_refuses_rows_that_break_them_and_keeps_good_ones(
    empty_database_url,
):
    """0015 validates the rows already there: a batch whose counters disagree stops the
    upgrade, which names the constraint and the row and changes nothing; once the row is
    corrected it passes, and keeps the rows that were right all along (a cancelled batch
    counts runs it never handed out)."""
    url = empty_database_url
    upgrade(url, "0014")
    engine = create_engine(url)
    try:
        _insert_batch(engine, status="running", dispatched_scenarios=2)
        _insert_batch(
            engine,
            status="error",
            completed_scenarios=3,
            error_scenarios=3,
            dispatched_scenarios=1,
        )
        bad = _insert_batch(engine, status="running", completed_scenarios=1, dispatched_scenarios=1)
        with pytest.raises(Exception, match="ck_batch_runs_completed_is_sum") as refused:
            upgrade(url)
        assert type(refused.value).__name__ == "InvariantBroken"
        assert str(uuid.UUID(bad)) in str(refused.value)
        assert "ck_batch_runs_window" not in str(refused.value)
        assert _revision(engine) == "0014"
        assert not any(name.startswith("ck_") for _, name, _ in _checks(url))

        with engine.begin() as conn:
            conn.execute(
                text("UPDATE batch_runs SET passed_scenarios = 1 WHERE id = :id"), {"id": bad}
            )
        upgrade(url)
        assert _revision(engine) != "0014"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM batch_runs")).scalar_one() == 3
    finally:
        engine.dispose()
    assert ("batch_runs", "ck_batch_runs_completed_is_sum") in {
        (table, name) for table, name, _ in _checks(url)
    }


def test_existing_system_roles_gain_the_notification_permissions(empty_database_url):
    """0021 gives every organization's system roles what a new organization's hold:
    ``notifications:read`` to every role holding every ``:read``, ``notifications:write``
    to OWNER and ADMIN; custom roles and platform tokens keep what they hold.  Going back
    takes both away from every role and token."""
    url = empty_database_url
    upgrade(url, "0017")
    engine = create_engine(url)
    reads = ["org:read", "triggers:read"]
    held = {
        "OWNER": [*reads, "org:write", "triggers:write"],
        "ADMIN": [*reads, "org:write", "triggers:write"],
        "MEMBER": [*reads, "triggers:write"],
        "VIEWER": reads,
        "GUEST": [],
        "custom": reads,
    }
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            for name, permissions in held.items():
                conn.execute(
                    text(
                        "INSERT INTO roles (id, organization_id, name, is_system, permissions,"
                        " created_at, updated_at) VALUES (:id, :org, :name, :system,"
                        " CAST(:permissions AS jsonb), :now, :now)"
                    ),
                    {
                        "id": uuid.uuid4(),
                        "org": uuid.uuid4(),
                        "name": name,
                        "system": name != "custom",
                        "permissions": json.dumps(permissions),
                        "now": now,
                    },
                )

        def roles() -> dict[str, list[str]]:
            with engine.connect() as conn:
                rows = conn.execute(text("SELECT name, permissions FROM roles")).all()
            return {name: permissions for name, permissions in rows}

        upgrade(url, "0021")
        upgrade(url, "0021")  # already there: nothing twice
        assert roles() == {
            "OWNER": [*held["OWNER"], "notifications:read", "notifications:write"],
            "ADMIN": [*held["ADMIN"], "notifications:read", "notifications:write"],
            "MEMBER": [*held["MEMBER"], "notifications:read"],
            "VIEWER": [*reads, "notifications:read"],
            "GUEST": [],
            "custom": reads,
        }
        command.downgrade(alembic_config(url), "0017")
        assert roles() == held
    finally:
        engine.dispose()
