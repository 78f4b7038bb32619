"""Alembic environment: synchronous, URL from the config ``spar migrate`` builds."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from shared.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations()
