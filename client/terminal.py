"""How the client commands print, and how they read a secret.

Rich wraps what it prints at the terminal's width, and at 80 columns where there is no
terminal (a CI log, a pipe): a link or a summary line cut in two there can be neither
clicked nor grepped.  :func:`say` prints a line that is never wrapped; tables and the
progress bar still fit the width.  ``--json`` (:data:`json_option`) prints what a
set-up command made as the API answered it, and nothing else, for scripts.

A secret (a password, an API key) is read by :func:`read_secret` from standard input,
an environment variable or a prompt that does not echo: never from a command-line
argument, which other users of the machine and shell histories see.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.text import Text

from client.api import UsageProblem

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print what was made as JSON (the API's answer) instead of text.",
)


def make_console(*, stderr: bool = False) -> Console:
    """Where a command prints: standard output, or standard error when standard output
    carries what the command writes (``spar batch run --summary -``)."""
    return Console(highlight=False, stderr=stderr)


def say(console: Console, *parts: str | Text) -> None:
    """One line, never wrapped, markup taken literally."""
    console.print(*parts, soft_wrap=True, markup=False)


def print_json(value: Any) -> None:
    """``value`` (an API type or plain data) as indented JSON on standard output."""
    click.echo(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def read_secret(
    what: str, *, from_stdin: bool = False, env: str | None = None, confirm: bool = False
) -> str:
    """The secret ``what``: standard input when ``from_stdin`` (its trailing newline
    dropped), else the environment variable ``env`` (which must be set), else asked
    without echo (twice with ``confirm``)."""
    if from_stdin:
        value = sys.stdin.read().rstrip("\r\n")
    elif env is not None:
        value = os.environ.get(env, "")
        if not value:
            raise UsageProblem(f"{env} is not set: it should hold the {what}")
    else:
        value = click.prompt(what.capitalize(), hide_input=True, confirmation_prompt=confirm)
    if not value:
        raise UsageProblem(f"the {what} is empty")
    return value
