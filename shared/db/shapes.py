"""A record's shape, written once: a msgspec Struct.  The SQL around it is derived from it.

The run engine sends records to PostgreSQL as JSON and reads them back as JSON or as
rows.  Instead of spelling each record's fields again in a column list, in the types of a
``jsonb_to_recordset``, in a ``jsonb_build_object`` and in the positions of a SELECT, each
of those is made from the Struct's fields (their names) and the table's columns (their
types), and rows are read back into the Struct by column name
(:meth:`shared.db.direct.Statement.structs`).  Adding a field to a record is adding it to
the Struct (and the column to the model and a migration).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from itertools import chain
from typing import Any

import msgspec
from sqlalchemy import ColumnElement, FromClause, Insert, Table, bindparam, column, func, insert
from sqlalchemy import select as select_
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql.elements import Label
from sqlalchemy.sql.functions import Function
from sqlalchemy.sql.selectable import TableValuedAlias

Shape = type[msgspec.Struct]


def fields(shape: Shape) -> tuple[str, ...]:
    return shape.__struct_fields__


def values(shape: Shape, source: Any, **given: Any) -> dict[str, ColumnElement[Any]]:
    """``{field: expression}`` for each field of ``shape``, in order: ``given[field]`` when
    given, else ``source``'s column of that name (a table, a CTE, a recordset)."""
    return {name: given[name] if name in given else source.c[name] for name in fields(shape)}


def columns_read(shape: Shape, table: Table, *, leaving: Collection[str] = ()) -> list[Any]:
    """``table``'s columns named after a field of ``shape``, in the fields' order, but those
    in ``leaving`` (each one of them: a name that is not is a mistake): what a body of that
    shape reads off a row (its other fields computed)."""
    unknown = set(leaving) - set(fields(shape))
    if unknown:
        raise ValueError(f"not fields of {shape.__name__}: {', '.join(sorted(unknown))}")
    return [table.c[name] for name in fields(shape) if name in table.c and name not in leaving]


def labeled(shape: Shape, source: Any, **given: Any) -> list[Label[Any]]:
    """The columns to select (or return) for ``shape``, each labeled with its field's name."""
    return [value.label(name) for name, value in values(shape, source, **given).items()]


def json_object(shape: Shape, source: Any, **given: Any) -> Function[Any]:
    """``jsonb_build_object`` of ``shape``'s fields (see :func:`values`): the JSON
    ``msgspec.convert(..., shape)`` decodes."""
    return func.jsonb_build_object(*chain.from_iterable(values(shape, source, **given).items()))


def recordset(parameter: str, shape: Shape, table: Table, *, one: bool = False) -> TableValuedAlias:
    """``jsonb_to_recordset(:parameter) AS parameter(field type, …)``: the records of
    ``shape`` given as one JSON array (a list of ``shape``), each field typed as ``table``'s
    column of its name; ``one``: ``jsonb_to_record``, for one record.  The statement is the
    same for any number of records."""
    unpack = func.jsonb_to_record if one else func.jsonb_to_recordset
    return (
        unpack(bindparam(parameter, type_=JSONB()))
        .table_valued(*(column(name, table.c[name].type) for name in fields(shape)))
        .render_derived(name=parameter, with_types=True)
    )


def insert_from(table: Table, row: Mapping[str, ColumnElement[Any]], source: FromClause) -> Insert:
    """``INSERT INTO table (names of row) SELECT (values of row) FROM source``: each
    column named with its value, none by position."""
    return insert(table).from_select(list(row), select_(*row.values()).select_from(source))
