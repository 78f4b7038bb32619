"""Shared fixtures: one migrated PostgreSQL database per session, truncated between tests.

``SPAR_DATABASE_URL`` names the test database (default: the local PostgreSQL, a
database ``spar_test_<pid>`` of this run's own, so parallel runs never meet); the
session drops and recreates it, then runs the real Alembic migrations, so every run
starts from the schema the migrations build.

Under pytest-xdist (``pytest`` runs ``-n 4`` by default) each worker is a session of its
own: its database is the named one with the worker's id appended (``<name>_gw0``,
created and dropped by the worker), its Redis database the named number plus the
worker's index, modulo 16 (``SPAR_REDIS_URL=…/9``: gw0 on 9, gw1 on 10, …); its
login-throttle keys and temp dirs are its own, and ports are asked of the kernel
(``free_port``).  Modules whose module-scoped fixtures start processes or a browser
stay on one worker (``xdist_group``; ``--dist loadgroup``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import httpx
import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import make_url

from api.app import create_app
from shared.db.direct import close_direct_pool
from shared.db.migrate import upgrade
from shared.db.models import Base
from shared.settings import Settings
from tests.support.live_server import LiveServer
from tests.support.processes import admin_sql, private_redis

DEFAULT_TEST_DATABASE_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/spar_test_{os.getpid()}"
DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"
# This process's xdist worker ("gw0", "gw1", …), or None when pytest runs without -n.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
# Cheap argon2 in the suite's settings and in every spar process a test starts (they
# inherit the environment); tests/unit/test_security.py keeps the production parameters.
PASSWORD_HASH_PROFILE = "CHEAPEST"
os.environ.setdefault("SPAR_PASSWORD_HASH_PROFILE", PASSWORD_HASH_PROFILE)


def worker_database_url(url: str) -> str:
    """The worker's own database: the named one's name with the worker id appended."""
    parsed = make_url(url)
    return parsed.set(database=f"{parsed.database}_{WORKER}").render_as_string(hide_password=False)


def worker_redis_url(url: str) -> str:
    """The worker's own Redis database: the named one's number plus the worker's index."""
    base, _, number = url.rpartition("/")
    index = int(WORKER.removeprefix("gw")) if WORKER else 0
    return f"{base}/{(int(number or 0) + index) % 16}"


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    given = os.environ.get("SPAR_DATABASE_URL")
    url = given or DEFAULT_TEST_DATABASE_URL
    if WORKER:
        url = worker_database_url(url)
    admin_sql(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', 'CREATE DATABASE "{name}"')
    upgrade(url)
    yield url
    if url != given:
        admin_sql(url, 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_url() -> str:
    return worker_redis_url(os.environ.get("SPAR_REDIS_URL") or DEFAULT_TEST_REDIS_URL)


@pytest.fixture
def own_redis_url(redis_url: str) -> Iterator[str]:
    """A ``redis-server`` of the test's own, for a test that pauses it: ``CLIENT PAUSE``
    holds every database of a server, the other test workers' too."""
    with private_redis(redis_url) as url:
        if url == redis_url:
            pytest.skip("no redis-server to start one of the test's own")
        yield url


@pytest.fixture(scope="session")
def settings(database_url: str, redis_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        secret_key="test-secret-key-do-not-use-in-production",
        public_base_url="http://testserver.local",
        egress_allow_private=True,
        # This run's own login-throttle keys: runs sharing a Redis never count each other's.
        login_key_prefix=f"spar-test-{os.getpid()}:login:",
        password_hash_profile=PASSWORD_HASH_PROFILE,
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
    """Empty every table after each test that touched the database.

    ``DELETE``, children first, rather than ``TRUNCATE``: a test leaves a few rows, which
    ``DELETE`` removes in about 3 ms, where ``TRUNCATE`` makes new files for every table
    and index (about 50 ms on an idle machine, once per test).  No table has a sequence to
    restart."""
    yield
    if "client" not in request.fixturenames and "db" not in request.fixturenames:
        return
    app: Litestar = request.getfixturevalue("app")
    async with app.state.database.engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            await conn.execute(table.delete())


@pytest.fixture
async def db(app: Litestar, client: AsyncTestClient):  # type: ignore[no-untyped-def]
    """A session on the test database, for setting up states the API cannot reach (expiry)."""
    async with app.state.database.transaction() as session:
        yield session
