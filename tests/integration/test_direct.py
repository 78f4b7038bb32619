"""``shared.db.direct``: Core statements compiled once and executed on psycopg directly."""

from __future__ import annotations

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import Integer, bindparam, literal, select
from sqlalchemy.dialects.postgresql import JSONB

from shared.db.direct import Statement, direct_pool


async def test_constants_travel_with_the_statement_and_json_round_trips(
    app: Litestar, client: AsyncTestClient
) -> None:
    statement = Statement(
        select(
            literal("constant").label("constant"),
            (bindparam("n", type_=Integer()) + 1).label("next"),
            bindparam("doc", type_=JSONB()).label("doc"),
        )
    )
    pool = await direct_pool(app.state.database.engine)
    async with pool.connection() as connection:
        (row,) = await statement.rows(connection, n=41, doc={"a": [1, "é", None], "b": {"c": True}})

    assert row.constant == "constant"
    assert row.next == 42
    assert row.doc == {"a": [1, "é", None], "b": {"c": True}}


async def test_a_missing_parameter_is_named_before_anything_is_sent(
    app: Litestar, client: AsyncTestClient
) -> None:
    statement = Statement(select(bindparam("wanted", type_=Integer()).label("x")))
    pool = await direct_pool(app.state.database.engine)
    async with pool.connection() as connection:
        with pytest.raises(TypeError, match="wanted"):
            await statement.rows(connection)


async def test_the_pool_commits_on_its_own_and_skips_the_wal_wait(
    app: Litestar, client: AsyncTestClient
) -> None:
    pool = await direct_pool(app.state.database.engine)
    async with pool.connection() as connection:
        assert connection.autocommit
        settings = await (
            await connection.execute(
                "SELECT current_setting('synchronous_commit'), current_setting('jit')"
            )
        ).fetchone()
    assert settings == ("off", "off")
