"""The CHECK constraints the models declare: an invariant the code relies on, said by the
schema too, so a write that breaks it is refused by PostgreSQL, whoever makes it.

Each is named ``ck_<table>_<name>`` by the metadata's naming convention (:mod:`shared.db.base`);
the values of an enum-valued column come from its Python enum or ``Literal``, the one
source the API validates against too.  Migration 0015 spells the same SQL literally.
"""

from __future__ import annotations

import enum
import re
import typing
from typing import Any

from sqlalchemy import CheckConstraint

_PLAIN = re.compile(r"^[A-Za-z0-9_./-]+$")


def values_of(kind: Any) -> tuple[str, ...]:
    """The values of a ``StrEnum`` or a ``Literal``, in their declared order."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return tuple(str(member.value) for member in kind)
    return tuple(str(value) for value in typing.get_args(kind))


def in_list(column: str, values: tuple[str, ...]) -> str:
    """``column IN ('a', 'b')``: the values are plain words, so quoting them is enough."""
    if not values or not all(_PLAIN.match(value) for value in values):
        raise ValueError(f"{column}: not a list of plain values: {values!r}")
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


def one_of(column: str, kind: Any) -> CheckConstraint:
    """``ck_<table>_<column>``: the column holds a value of ``kind`` (a NULL passes, as
    every CHECK lets it: nullability is the column's own rule)."""
    return CheckConstraint(in_list(column, values_of(kind)), name=column)


def not_negative(*columns: str, name: str | None = None) -> CheckConstraint:
    """``ck_<table>_<column>_not_negative`` (or ``<name>``): counts never below zero."""
    return CheckConstraint(
        " AND ".join(f"{column} >= 0" for column in columns),
        name=name or f"{columns[0]}_not_negative",
    )
