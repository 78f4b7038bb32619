"""Shared fixtures: one migrated PostgreSQL database per session, truncated between tests.

``SPAR_DATABASE_URL`` names the test database (default: the local PostgreSQL, a
database ``spar_test_<pid>`` of this run's own, so parallel runs never meet); the
session drops and recreates it, then runs the real Alembic migrations, so every run
starts from the schema the migrations build.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import make_url, text

from api.app import create_app
from shared.db.direct import close_direct_pool
from shared.db.migrate import upgrade
from shared.db.models import Base
from shared.settings import Settings

DEFAULT_TEST_DATABASE_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/spar_test_{os.getpid()}"
DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


def _admin(url: str, *statements: str) -> None:
    parsed = make_url(url)
    if not parsed.drivername.startswith("postgresql"):
        raise RuntimeError("the test suite runs on PostgreSQL; set SPAR_DATABASE_URL to one")
    admin = parsed.set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.format(name=parsed.database))


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    given = os.environ.get("SPAR_DATABASE_URL")
    url = given or DEFAULT_TEST_DATABASE_URL
    _admin(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', 'CREATE DATABASE "{name}"')
    upgrade(url)
    yield url
    if not given:
        _admin(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=os.environ.get("SPAR_REDIS_URL") or DEFAULT_TEST_REDIS_URL,
        secret_key="test-secret-key-do-not-use-in-production",
        public_base_url="http://testserver.local",
        egress_allow_private=True,
        # This run's own login-throttle keys: runs sharing a Redis never count each other's.
        login_key_prefix=f"spar-test-{os.getpid()}:login:",
    )


@pytest.fixture(scope="session")
def app(settings: Settings) -> Litestar:
    return create_app(settings)


@pytest.fixture(scope="session")
async def client(app: Litestar) -> AsyncIterator[AsyncTestClient]:
    async with AsyncTestClient(app=app, base_url="http://testserver.local") as test_client:
        yield test_client
        # Tests run the workers' code in this loop: the direct pool it opened is this loop's.
        await close_direct_pool(app.state.engine)


@pytest.fixture(autouse=True)
async def _clean_login_throttle(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Forget failed logins after each test that used the app: no test inherits a lock-out."""
    yield
    if "client" in request.fixturenames:
        await request.getfixturevalue("app").state.login_throttle.clear()


@pytest.fixture(autouse=True)
async def _clean_database(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Empty every table after each test that touched the database."""
    yield
    if "client" not in request.fixturenames and "db" not in request.fixturenames:
        return
    app: Litestar = request.getfixturevalue("app")
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    async with app.state.engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
async def db(app: Litestar, client: AsyncTestClient):  # type: ignore[no-untyped-def]
    """A session on the test database, for setting up states the API cannot reach (expiry)."""
    async with app.state.session_factory() as session:
        yield session
        await session.commit()
