"""``spar login``: an email and a password exchanged for a user token, kept in a profile.

The profile (``--profile``, else ``SPAR_PROFILE``, else ``default``; see
:mod:`client.profiles`) then gives every other command its URL and token when the
environment gives none.  ``--register`` makes the account first, so a newcomer needs no
curl.  The password is read from standard input, ``SPAR_PASSWORD`` or a prompt without
echo, and is never printed nor stored; the token is stored, never printed.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import click
from rich.console import Console

from client.api import Api, Target, UsageProblem
from client.profiles import load_profile, profile_name, save_profile
from client.terminal import json_option, make_console, print_json, read_secret, say
from shared.identity.schemas import AccessToken, Registered

DEFAULT_URL = "http://127.0.0.1:8000"  # where spar dev listens


@click.command("login", short_help="Sign in with email and password; keep the token in a profile.")
@click.option(
    "--url",
    metavar="URL",
    help=f"Spar's address (default: SPAR_URL, else the profile's, else {DEFAULT_URL}, "
    "where spar dev listens).",
)
@click.option("--email", metavar="EMAIL", help="The account's email (asked when not given).")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from standard input (else SPAR_PASSWORD, else asked without echo).",
)
@click.option(
    "--register",
    is_flag=True,
    help="Create the account first (POST /v1/auth/register), then keep its token.",
)
@click.option("--first-name", metavar="NAME", help="With --register: your first name.")
@click.option("--last-name", metavar="NAME", help="With --register: your last name.")
@click.option(
    "--profile",
    metavar="NAME",
    help="The profile to write in ~/.config/spar/config.toml (default: SPAR_PROFILE, else "
    "default).",
)
@click.option(
    "--org",
    metavar="NAME|ID",
    help="Keep this organization in the profile (needed only when the account reaches several).",
)
@json_option
def login(
    url: str | None,
    email: str | None,
    password_stdin: bool,
    register: bool,
    first_name: str | None,
    last_name: str | None,
    profile: str | None,
    org: str | None,
    as_json: bool,
) -> None:
    """Sign in to Spar with your email and password and keep the token (a user token,
    ust_…) in a profile of ~/.config/spar/config.toml (mode 0600): the other commands use
    its URL and token when SPAR_URL and SPAR_TOKEN are not set.  With --register, make
    the account first.  The password is read from standard input (--password-stdin), from
    SPAR_PASSWORD, or asked without echo; it is never printed or stored."""
    name = profile_name(profile)
    stored = load_profile(name, required=False)
    base = (url or os.environ.get("SPAR_URL") or stored.get("url") or DEFAULT_URL).rstrip("/")
    email = email or click.prompt("Email")
    if register:
        first_name = first_name or click.prompt("First name")
        last_name = last_name or click.prompt("Last name")
    password = read_secret(
        "password",
        from_stdin=password_stdin,
        env="SPAR_PASSWORD" if os.environ.get("SPAR_PASSWORD") else None,
        confirm=register,
    )
    token, expires_at = _sign_in(base, email, password, register, first_name, last_name)
    api = Api(Target(url=base, token=token, org=org))
    try:
        reached = api.organizations()
        kept = stored.get("org") if stored.get("url", "").rstrip("/") == base else None
        chosen = api.org if org else next((o["id"] for o in reached if o["id"] == kept), None)
    finally:
        api.close()
    path = save_profile(name, url=base, token=token, org=chosen)
    if as_json:
        print_json(
            {
                "profile": name,
                "config": str(path),
                "url": base,
                "email": email,
                "expires_at": expires_at,
                "org": chosen,
                "organizations": [{"id": o["id"], "name": o["name"]} for o in reached],
            }
        )
        return
    console = make_console()
    made = "registered and signed in" if register else "signed in"
    say(console, f"{made} to {base} as {email}; profile {name!r} saved in {path} (mode 0600)")
    say(console, f"the token expires {expires_at:%Y-%m-%d %H:%M} UTC: spar login again then")
    _say_organizations(console, reached, chosen)
    if os.environ.get("SPAR_TOKEN"):
        say(console, "note: SPAR_TOKEN is set here, and wins over the profile; unset it")


def _sign_in(
    base: str,
    email: str,
    password: str,
    register: bool,
    first_name: str | None,
    last_name: str | None,
) -> tuple[str, datetime]:
    """The user token and its expiry, from a new account with ``register``."""
    api = Api(Target(url=base, token=None, org=None))
    try:
        if register:
            body = {
                "email": email,
                "password": password,
                "first_name": first_name,
                "last_name": last_name,
            }
            made = api.read("/v1/auth/register", Registered, method="POST", json=body)
            return made.access_token, made.expires_at
        credentials = {"email": email, "password": password}
        signed = api.read("/v1/auth/login", AccessToken, method="POST", json=credentials)
        return signed.access_token, signed.expires_at
    except UsageProblem as exc:
        if register and " 409:" in exc.message:
            raise UsageProblem(f"{exc.message} (sign in without --register)") from None
        raise
    finally:
        api.close()


def _say_organizations(console: Console, reached: list[dict[str, Any]], chosen: str | None) -> None:
    if not reached:
        say(console, "no organization yet: spar orgs create NAME makes one")
        return
    for o in reached:
        mark = " (kept in the profile)" if o["id"] == chosen else ""
        say(console, f"organization {o['name']} ({o['id']}){mark}")
    if len(reached) > 1 and chosen is None:
        say(console, "it reaches several: give the commands --org, or spar login --org NAME")
