"""What the database's errors mean: to a caller (:func:`database_unavailable`: come back
later) and to a log (:func:`describe_database_error`).

A database error's text can quote what a request sent: the statement's parameters (the
engines hide them, :mod:`shared.db.engine`) and PostgreSQL's DETAIL, which for a NOT NULL
or CHECK violation is the whole refused row ("Failing row contains (...)").  A log says
which error, where, on which statement; never its text.
"""

from __future__ import annotations

import psycopg
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from shared.errors import causes

# SQLSTATE classes that say the database cannot serve now, not that the statement is
# wrong: connection exception, transaction rollback (deadlock, serialization: PostgreSQL
# asks for the transaction to be retried), insufficient resources (too many connections),
# operator intervention (shutting down, statement timeout), system error.
_UNAVAILABLE_CLASSES = frozenset({"08", "40", "53", "57", "58"})


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the database cannot serve now: out of
    reach, out of connections (the server's or the pool's), going down, overloaded.
    Sending the same request later may succeed."""
    for cause in causes(exc):
        if isinstance(cause, PoolTimeout):
            return True
        if isinstance(cause, DBAPIError) and cause.connection_invalidated:
            return True
        if isinstance(cause, psycopg.InterfaceError):  # a connection that was closed under it
            return True
        if isinstance(cause, psycopg.OperationalError):
            # No SQLSTATE: failed on the client side (refused, lost, a pool's timeout).
            state = cause.sqlstate
            return state is None or state[:2] in _UNAVAILABLE_CLASSES
    return False


def describe_database_error(exc: BaseException) -> str | None:
    """What a log may say of the database error behind ``exc`` (``None`` if there is
    none): its class, SQLSTATE, constraint, table and column, and the statement without
    its parameters; never its message or DETAIL, which can quote the values it refused."""
    error = next((c for c in causes(exc) if isinstance(c, psycopg.Error)), None)
    statement = next((c.statement for c in causes(exc) if isinstance(c, StatementError)), None)
    if error is None:
        return None
    diag = error.diag
    parts = [
        f"{type(error).__module__}.{type(error).__qualname__}",
        f"sqlstate={error.sqlstate}",
        *(
            f"{name}={value}"
            for name, value in (
                ("constraint", diag.constraint_name),
                ("table", diag.table_name),
                ("column", diag.column_name),
            )
            if value
        ),
    ]
    if statement:
        parts.append(f"statement: {statement}")
    return " ".join(parts)
