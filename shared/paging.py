"""Offset paging with a total, in the stable order every listing uses (created_at, id)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_OFFSET = 2**63 - 1  # PostgreSQL's OFFSET is a bigint


@dataclass(frozen=True, slots=True)
class Paging:
    limit: int = DEFAULT_LIMIT
    offset: int = 0


async def paginate(
    session: AsyncSession, query: Select[Any], paging: Paging, *order_by: Any
) -> tuple[list[Any], int]:
    """Run ``query`` for one page (rows as ORM objects or tuples) and count the whole result."""
    total = await session.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
    page = query.order_by(*order_by).limit(paging.limit).offset(paging.offset)
    result = await session.execute(page)
    single = len(page.column_descriptions) == 1  # one entity or column: return it bare
    rows = list(result.scalars() if single else result.all())
    return rows, int(total or 0)
