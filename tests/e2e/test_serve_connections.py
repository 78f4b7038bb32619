"""A real ``spar serve`` under requests refused while their dependencies are resolved:
every connection taken for them goes back to its pool."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support.processes import owner_over_http, spar_serve

pytestmark = pytest.mark.slow


async def test_listings_refused_for_their_paging_leave_no_connection_behind(
    database_url: str, tmp_path: Path
) -> None:
    """A listing's guard keeps the connection it looked the token up on for the listing's
    read; when a dependency is refused after it (``offset=AAA``) the handler never runs,
    and the request gives the connection back as it ends.  (Litestar does not close a
    dependency's generator when another is refused: one that had taken a connection
    never gave it back, closed by the garbage collector while still waiting, "asynchronous
    generator is already running".)  A hundred and eighty refused at sixty at once, then
    twenty listings answer."""
    env = {"SPAR_DATABASE_URL": database_url, "SPAR_SECRET_KEY": "connections-secret-key"}
    with spar_serve(env, cwd=tmp_path, health="/health/ready") as (base, _):
        with httpx.Client(base_url=base, timeout=10) as http:
            headers, org = owner_over_http(http, "pool@example.com", "pool-password-1", "Pool")
        path = f"/v1/orgs/{org['id']}/allowed-domains/"
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as api:
            for _ in range(3):
                refused = await asyncio.gather(*(api.get(f"{path}?offset=AAA") for _ in range(60)))
                assert {r.status_code for r in refused} == {422}
            answered = await asyncio.gather(*(api.get(path) for _ in range(20)))
        assert {r.status_code for r in answered} == {200}
        log = await asyncio.to_thread(_logs, tmp_path)
    assert "asynchronous generator is already running" not in log, log[-3000:]


def _logs(directory: Path) -> str:
    return "\n".join(path.read_text() for path in directory.glob("spar-serve-*.log"))
