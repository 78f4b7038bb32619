"""``shared.db.direct``: Core statements compiled once and executed on psycopg directly."""

from __future__ import annotations

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import Integer, bindparam, literal, null, select, update
from sqlalchemy.dialects.postgresql import JSONB

from shared.db.base import NOW
from shared.db.direct import Statement, StatementRefused
from shared.db.models import ScenarioRun


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
    async with app.state.database.connection() as connection:
        (row,) = await statement.rows(connection, n=41, doc={"a": [1, "é", None], "b": {"c": True}})

    assert row.constant == "constant"
    assert row.next == 42
    assert row.doc == {"a": [1, "é", None], "b": {"c": True}}


async def test_a_missing_parameter_is_named_before_anything_is_sent(
    app: Litestar, client: AsyncTestClient
) -> None:
    statement = Statement(select(bindparam("wanted", type_=Integer()).label("x")))
    async with app.state.database.connection() as connection:
        with pytest.raises(TypeError, match="wanted"):
            await statement.rows(connection)


async def test_the_pool_commits_on_its_own_and_skips_the_wal_wait(
    app: Litestar, client: AsyncTestClient
) -> None:
    async with app.state.database.connection() as connection:
        assert connection.autocommit
        settings = await (
            await connection.execute(
                "SELECT current_setting('synchronous_commit'), current_setting('jit')"
            )
        ).fetchone()
    assert settings == ("off", "off")


def test_a_parameter_named_after_a_column_is_refused_when_the_statement_is_built() -> None:
    runs = ScenarioRun.__table__
    with pytest.raises(StatementRefused, match=r":status is named after a column"):
        Statement(
            update(runs)
            .where(runs.c.id == bindparam("p_run"), runs.c.status == bindparam("status"))
            .values(error_message=bindparam("p_error"), updated_at=NOW)
        )
    Statement(  # the convention: p_ names
        update(runs)
        .where(runs.c.id == bindparam("p_run"), runs.c.status == bindparam("p_status"))
        .values(error_message=bindparam("p_error"), updated_at=NOW)
    )


def test_a_none_constant_is_refused_when_the_statement_is_built() -> None:
    runs = ScenarioRun.__table__
    with pytest.raises(StatementRefused, match=r"None constant .*:error_message"):
        Statement(
            update(runs)
            .where(runs.c.id == bindparam("p_run"))
            .values(error_message=None, updated_at=NOW)
        )
    with pytest.raises(StatementRefused, match="None constant"):
        Statement(select(literal(None).label("nothing")))
    Statement(
        update(runs)
        .where(runs.c.id == bindparam("p_run"))
        .values(error_message=null(), updated_at=NOW)
    )


def test_a_column_left_to_a_python_default_is_refused_when_the_statement_is_built() -> None:
    runs = ScenarioRun.__table__
    with pytest.raises(StatementRefused, match="updated_at has a Python-side default"):
        Statement(update(runs).where(runs.c.id == bindparam("p_run")).values(error_message=null()))
