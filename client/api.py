"""The calls to Spar's REST API that every client command makes, and how they fail: each
failure to reach or use the API is a :class:`UsageProblem` (exit code 3).  Where Spar is
and the token: :mod:`client.profiles`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
import msgspec

EXIT_USAGE = 3
T = TypeVar("T")
PAGE = 100
UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")


class UsageProblem(click.ClickException):
    """A usage, configuration or connection problem: exit code 3."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Target:
    """The API to call and the token to call it with (``None``: no token yet, to sign in).
    ``profile``: the profile the token came from (``None`` when from the environment)."""

    url: str
    token: str | None
    org: str | None
    profile: str | None = None


def output_file(flag: str, dest: str, help: str) -> Callable[[T], T]:
    """An option naming a file the command writes (``--json FILE``, ``--junit FILE``)."""
    return click.option(
        flag, dest, type=click.Path(dir_okay=False, path_type=Path), metavar="FILE", help=help
    )


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(map(str, item.get('loc', [])))}: {item.get('msg')}" for item in detail
        )
    return str(detail)


class Api:
    """Calls to one Spar API in one organization."""

    def __init__(self, chosen: Target, *, timeout: float = 30.0) -> None:
        self.url = chosen.url
        self.http = httpx.Client(
            base_url=chosen.url,
            headers={"Authorization": f"Bearer {chosen.token}"} if chosen.token else {},
            timeout=timeout,
        )
        self._org = chosen.org

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer (``None`` for 204); a :class:`UsageProblem` on any failure."""
        response = self._send(method, path, **kwargs)
        return response.json() if response.content else None

    def read(self, path: str, into: type[T], *, method: str = "GET", **kwargs: Any) -> T:
        """The answer of ``method path`` (a GET unless told), decoded into the API's own
        response type ``into``."""
        response = self._send(method, path, **kwargs)
        try:
            return msgspec.json.decode(response.content, type=into)
        except msgspec.ValidationError as exc:
            raise UsageProblem(
                f"{method} {path}: an answer this client does not know: {exc}"
            ) from None

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise UsageProblem(f"cannot reach Spar at {self.url}: {exc}") from None
        if response.status_code >= 400:
            raise UsageProblem(
                f"{method} {path} answered {response.status_code}: {_detail(response)}"
            )
        return response

    def organizations(self) -> list[dict[str, Any]]:
        """Every organization the token reaches."""
        found: list[dict[str, Any]] = []
        while True:
            page = self.call(
                "GET", "/v1/organizations", params={"limit": PAGE, "offset": len(found)}
            )
            found += page["organizations"]
            if not page["organizations"] or len(found) >= page["total"]:
                return found

    @property
    def org(self) -> str:
        """The organization's id: the one given (by id, or by name), else the only one the
        token reaches."""
        if self._org is None or not UUID_TEXT.fullmatch(self._org):
            orgs = self.organizations()
            if self._org is not None:
                orgs = [o for o in orgs if o["name"] == self._org]
                if len(orgs) != 1:
                    raise UsageProblem(
                        f"the token reaches {len(orgs)} organizations named {self._org!r}: "
                        "give the organization's id"
                    )
            elif len(orgs) != 1:
                names = ", ".join(f"{o['name']} ({o['id']})" for o in orgs) or "none"
                raise UsageProblem(
                    f"the token reaches {len(orgs)} organizations ({names}): give --org "
                    "or set SPAR_ORG" + ("" if orgs else "; spar orgs create NAME makes one")
                )
            self._org = orgs[0]["id"]
        return self._org

    def path(self, rest: str) -> str:
        return f"/v1/orgs/{self.org}/{rest.lstrip('/')}"

    def pages(self, rest: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a paged listing."""
        offset = 0
        while True:
            page = self.call(
                "GET", self.path(rest), params={**params, "limit": PAGE, "offset": offset}
            )
            yield from page[key]
            offset += len(page[key])
            if not page[key] or offset >= page["total"]:
                return

    def resolve_agent(self, name_or_id: str) -> dict[str, Any]:
        """The agent of that id, else the one of that name."""
        agents = list(self.pages("agents", "agents"))
        for agent in agents:
            if name_or_id in (agent["id"], agent["name"]):
                return agent
        known = ", ".join(sorted(a["name"] for a in agents)) or "none"
        raise UsageProblem(f"no agent {name_or_id!r} (agents: {known})")
