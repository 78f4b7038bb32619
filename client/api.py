"""Where the API is, who calls it, and the calls: what every client command talks through.

Configuration, first found wins: the environment (``SPAR_URL``, ``SPAR_TOKEN``,
``SPAR_ORG``), then a named profile (``--profile``, else ``SPAR_PROFILE``, else
``default``) in ``$XDG_CONFIG_HOME/spar/config.toml`` (``~/.config/spar/config.toml``)::

    [profiles.default]
    url = "https://spar.example.com"
    token = "pat_..."
    org = "6f1c..."        # only needed when the token reaches several organizations

Every failure to reach or use the API is a :class:`UsageProblem` (exit code 3).
"""

from __future__ import annotations

import os
import tomllib
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


class UsageProblem(click.ClickException):
    """A usage, configuration or connection problem: exit code 3."""

    exit_code = EXIT_USAGE


profile_option = click.option(
    "--profile",
    metavar="NAME",
    help="Where Spar is and the token, from this profile of ~/.config/spar/config.toml "
    "(SPAR_URL, SPAR_TOKEN and SPAR_ORG, when set, win).",
)


def output_file(flag: str, dest: str, help: str) -> Callable[[T], T]:
    """An option naming a file the command writes (``--json FILE``, ``--junit FILE``)."""
    return click.option(
        flag, dest, type=click.Path(dir_okay=False, path_type=Path), metavar="FILE", help=help
    )


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "spar" / "config.toml"


@dataclass(frozen=True)
class Target:
    url: str
    token: str
    org: str | None


def target(profile: str | None) -> Target:
    """The API and the token to use (see the module's docstring)."""
    name = profile or os.environ.get("SPAR_PROFILE") or "default"
    stored: dict[str, Any] = {}
    path = config_path()
    if path.exists():
        try:
            profiles = tomllib.loads(path.read_text()).get("profiles", {})
        except tomllib.TOMLDecodeError as exc:
            raise UsageProblem(f"{path}: {exc}") from None
        stored = profiles.get(name, {})
        if profile and not stored:
            raise UsageProblem(f"no profile {profile!r} in {path}")
    elif profile:
        raise UsageProblem(f"no profile {profile!r}: {path} does not exist")
    url = os.environ.get("SPAR_URL") or stored.get("url")
    token = os.environ.get("SPAR_TOKEN") or stored.get("token")
    if not url or not token:
        raise UsageProblem(
            "where is Spar? set SPAR_URL and SPAR_TOKEN, or a profile in " + str(path)
        )
    return Target(
        url=url.rstrip("/"), token=token, org=os.environ.get("SPAR_ORG") or stored.get("org")
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
            headers={"Authorization": f"Bearer {chosen.token}"},
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

    @property
    def org(self) -> str:
        """The organization: given, else the only one the token reaches."""
        if self._org is None:
            orgs = self.call("GET", "/v1/organizations")["organizations"]
            if len(orgs) != 1:
                names = ", ".join(f"{o['name']} ({o['id']})" for o in orgs) or "none"
                raise UsageProblem(
                    f"the token reaches {len(orgs)} organizations ({names}): set SPAR_ORG"
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
