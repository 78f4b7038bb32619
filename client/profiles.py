"""Where Spar is and who calls it: the environment, else a profile.

Configuration, first found wins: the environment (``SPAR_URL``, ``SPAR_TOKEN``,
``SPAR_ORG``), then a named profile (``--profile``, else ``SPAR_PROFILE``, else
``default``) in ``$XDG_CONFIG_HOME/spar/config.toml`` (``~/.config/spar/config.toml``)::

    [profiles.default]
    url = "https://spar.example.com"
    token = "pat_..."
    org = "6f1c..."        # only needed when the token reaches several organizations

``spar login`` writes a profile (:func:`save_profile`): the file is replaced whole, mode
0600 (in a directory of mode 0700 when it makes one), since it holds tokens.  A
profile's ``org`` goes with its token: a token from the environment never takes the
organization of a profile.
"""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import click
import tomli_w

from client.api import Target, UsageProblem

DEFAULT_PROFILE = "default"

profile_option = click.option(
    "--profile",
    metavar="NAME",
    help="Where Spar is and the token, from this profile of ~/.config/spar/config.toml "
    "(SPAR_URL, SPAR_TOKEN and SPAR_ORG, when set, win).",
)
org_option = click.option(
    "--org",
    metavar="NAME|ID",
    help="The organization, by name or id (default: SPAR_ORG, else the profile's, else the "
    "only one the token reaches).",
)


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "spar" / "config.toml"


def profile_name(given: str | None) -> str:
    return given or os.environ.get("SPAR_PROFILE") or DEFAULT_PROFILE


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageProblem(f"{path}: {exc}") from None


def load_profile(name: str, *, required: bool) -> dict[str, Any]:
    """The profile ``name`` (empty when there is none); a :class:`UsageProblem` when it is
    ``required`` (named with ``--profile``) and missing."""
    path = config_path()
    stored = _read(path).get("profiles", {}).get(name, {})
    if required and not stored:
        if path.exists():
            raise UsageProblem(f"no profile {name!r} in {path}")
        raise UsageProblem(f"no profile {name!r}: {path} does not exist")
    return stored


def target(profile: str | None, org: str | None = None) -> Target:
    """The API and the token to use (see the module's docstring); ``org`` (``--org``) wins
    over ``SPAR_ORG`` and the profile's."""
    name = profile_name(profile)
    stored = load_profile(name, required=profile is not None)
    url = os.environ.get("SPAR_URL") or stored.get("url")
    from_env = os.environ.get("SPAR_TOKEN")
    token = from_env or stored.get("token")
    if not url or not token:
        raise UsageProblem(
            f"where is Spar? set SPAR_URL and SPAR_TOKEN, or sign in with spar login "
            f"(a profile in {config_path()})"
        )
    return Target(
        url=url.rstrip("/"),
        token=token,
        org=org or os.environ.get("SPAR_ORG") or (None if from_env else stored.get("org")),
        profile=None if from_env else name,
    )


def save_profile(name: str, **fields: str | None) -> Path:
    """Set ``fields`` of the profile ``name`` (``None`` removes one), keeping the rest of
    the file; the file's path.  Written whole to a new file of mode 0600, then renamed
    over the old one: never a moment with the tokens readable or half written."""
    path = config_path()
    document = _read(path)
    profiles = document.setdefault("profiles", {})
    profile = profiles.setdefault(name, {})
    for key, value in fields.items():
        if value is None:
            profile.pop(key, None)
        else:
            profile[key] = value
    text = tomli_w.dumps(document)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".toml")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:  # mkstemp: mode 0600
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
