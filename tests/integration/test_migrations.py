"""Alembic migrations are the schema's only source: they must match the models exactly."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from shared.db.migrate import sync_url
from shared.db.models import Base


def test_migrated_schema_matches_the_models(database_url):
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_migrations_run_on_sqlite_too(tmp_path):
    from sqlalchemy import inspect

    from shared.db.migrate import upgrade

    url = f"sqlite+aiosqlite:///{tmp_path / 'spar.db'}"
    upgrade(url)
    engine = create_engine(sync_url(url))
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {t.name for t in Base.metadata.sorted_tables} <= tables
