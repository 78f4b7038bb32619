"""Shared fixtures: one migrated PostgreSQL database per session, truncated between tests.

``SPAR_DATABASE_URL`` names the test database (default: the local PostgreSQL, a
database ``spar_test_<pid>`` of this run's own, so parallel runs never meet); the
session drops and recreates it, then runs the real Alembic migrations, so every run
starts from the schema the migrations build.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import httpx
import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from api.app import create_app
from shared.db.direct import close_direct_pool
from shared.db.migrate import upgrade
from shared.db.models import Base
from shared.settings import Settings
from tests.support.live_server import LiveServer
from tests.support.processes import admin_sql

DEFAULT_TEST_DATABASE_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/spar_test_{os.getpid()}"
DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


# --- the scheduler failover drill: minutes of wall clock, run beside the suite -------------------

FAILOVER_TEST = "test_two_schedulers_fire_every_slot_exactly_once_through_a_kill"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the failover drill's test last: it waits for the drill."""
    drill_tests = [item for item in items if item.name == FAILOVER_TEST]
    items[:] = [item for item in items if item.name != FAILOVER_TEST] + drill_tests


def pytest_runtestloop(session: pytest.Session) -> None:
    """Start the failover drill before the first test, if its test is to run."""
    if session.config.option.collectonly or not any(
        item.name == FAILOVER_TEST for item in session.items
    ):
        return
    from tests.e2e.test_scheduler_failover import DRILL_KEY
    from tests.support.failover import FailoverDrill

    drill = FailoverDrill(
        os.environ.get("SPAR_DATABASE_URL") or DEFAULT_TEST_DATABASE_URL,
        os.environ.get("SPAR_REDIS_URL") or DEFAULT_TEST_REDIS_URL,
    )
    session.config.stash[DRILL_KEY] = drill
    drill.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    from tests.e2e.test_scheduler_failover import DRILL_KEY

    drill = config.stash.get(DRILL_KEY, None)
    if drill is not None:
        drill.close()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    given = os.environ.get("SPAR_DATABASE_URL")
    url = given or DEFAULT_TEST_DATABASE_URL
    admin_sql(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', 'CREATE DATABASE "{name}"')
    upgrade(url)
    yield url
    if not given:
        admin_sql(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
        await close_direct_pool(app.state.database.engine)


@pytest.fixture
async def live_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app served by uvicorn on a loopback port, for requests that must
    meet: the test client hands the app one request at a time, so ten requests gathered
    through it never overlap.  Same database and keys as ``client``."""
    with LiveServer(create_app(settings)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            yield http


@pytest.fixture
async def impatient(settings: Settings, app: Litestar) -> AsyncIterator[AsyncTestClient]:
    """A client of an app that waits only 0.2 s for a calibration (it answers 202 at
    once where no worker runs) and otherwise like ``client``."""
    quick = create_app(msgspec.structs.replace(settings, calibration_wait_s=0.2))
    async with AsyncTestClient(app=quick, base_url="http://testserver.local") as client:
        yield client
        await close_direct_pool(quick.state.database.engine)


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
    async with app.state.database.engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
async def db(app: Litestar, client: AsyncTestClient):  # type: ignore[no-untyped-def]
    """A session on the test database, for setting up states the API cannot reach (expiry)."""
    async with app.state.database.transaction() as session:
        yield session
