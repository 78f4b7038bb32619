"""Offset paging: a page of a listing (its rows in the stable order every listing uses,
created_at then id, with their total: :class:`shared.db.queries.CountedPage`)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_OFFSET = 2**63 - 1  # PostgreSQL's OFFSET is a bigint


@dataclass(frozen=True, slots=True)
class Paging:
    limit: int = DEFAULT_LIMIT
    offset: int = 0
