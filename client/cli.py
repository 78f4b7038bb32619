"""The ``spar`` command: the client a team uses, and the processes of a deployment.

Client (``SPAR_URL`` + ``SPAR_TOKEN``, or a profile that ``spar login`` writes): the
set-up a CI job needs (``spar orgs create``, ``spar hosts allow``, ``spar credentials
set``, ``spar providers add``, ``spar agents add``, ``spar tokens create``),
``spar scenarios push``, ``spar batch run``, ``spar calibrate``; and ``spar demo``, the
whole path on the embedded default with nothing configured.  They need only the base
install (``pip install spar``).

Server: ``spar dev`` (everything in one process on an embedded PostgreSQL; ``spar[dev]``),
``spar migrate``, ``spar serve``, ``spar worker``, ``spar scheduler`` (``spar[server]``).
Each lives with its process (``api/cli.py``, ``workers/cli.py``, ``scheduler/cli.py``,
``workers/dev.py``) and is imported only when it runs or its ``--help`` is asked, so the
client never loads Litestar, SQLAlchemy, Dramatiq or psycopg; where the server is not
installed, such a command says what to install.

Exit codes of the client commands: 0 success, 1 a scenario failed, 2 an error in the
batch, 3 a usage, configuration or connection problem.
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import click

from client.api import EXIT_USAGE
from client.batch import batch
from client.calibrate import calibrate
from client.demo import demo
from client.extras import require
from client.login import login
from client.scenarios import scenarios
from client.setup import agents, credentials, hosts, orgs, providers, tokens
from shared.logs import configure_logging
from shared.settings import SettingsError, get_settings


@dataclass(frozen=True)
class ServerCommand:
    """A process's command, known by name and short help before its module is imported."""

    module: str
    short_help: str
    extra: str  # the install that brings what it needs: spar[extra]


SERVER_COMMANDS = {
    "dev": ServerCommand(
        "workers.dev",
        "Run the API, workers and scheduler in one process: embedded PostgreSQL, no Redis.",
        "dev",
    ),
    "migrate": ServerCommand(
        "api.cli", "Apply the database migrations (alembic upgrade head).", "server"
    ),
    "serve": ServerCommand("api.cli", "Run the HTTP API (needs SPAR_SECRET_KEY).", "server"),
    "worker": ServerCommand(
        "workers.cli", "Run worker processes taking work from Redis (SPAR_REDIS_URL).", "server"
    ),
    "scheduler": ServerCommand(
        "scheduler.cli", "Run the cron triggers and the sweeper (one replica active).", "server"
    ),
}


class Spar(click.Group):
    """The client's commands, plus the server's, each imported when it is resolved."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*self.commands, *SERVER_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in SERVER_COMMANDS:
            return None
        return server_command(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing of ``spar --help``, from the table: no server module is imported."""
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = [
            (
                name,
                SERVER_COMMANDS[name].short_help
                if name in SERVER_COMMANDS
                else self.commands[name].get_short_help_str(limit),
            )
            for name in self.list_commands(ctx)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def server_command(name: str) -> click.Command:
    """The command ``name`` from its process's module; a :class:`UsageProblem` naming the
    extra to install when what it needs is not installed."""
    entry = SERVER_COMMANDS[name]
    require(entry.extra, f"spar {name}")
    command: click.Command = getattr(importlib.import_module(entry.module), name)
    command.short_help = entry.short_help
    return command


def installed_version() -> str:
    try:
        return version("spar")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _print_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"spar {installed_version()}")
        ctx.exit()


@click.group(
    "spar",
    cls=Spar,
    invoke_without_command=True,
    subcommand_metavar="COMMAND [ARGS]...",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print Spar's version and exit.",
)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Spar: test conversational AI agents — scenarios, batch runs, an LLM judge,
    calibration, knowledge and triggers.

    \b
    Try it:     spar demo
    Set up:     spar login | spar orgs create | spar hosts allow | spar credentials set
                spar providers add | spar agents add | spar tokens create
    Use Spar:   spar scenarios push | spar batch run | spar calibrate
    Run Spar:   spar dev | spar migrate | spar serve | spar worker | spar scheduler
    """
    if ctx.invoked_subcommand is None:  # bare ``spar``: the help, and no error
        click.echo(ctx.get_help())
        ctx.exit()
    if ctx.invoked_subcommand in SERVER_COMMANDS:
        # The server's processes log in Spar's own format (the client's commands log
        # nothing of their own).
        settings = get_settings()
        configure_logging(settings.log_level, settings.log_format)


for command in (
    login,
    orgs,
    hosts,
    credentials,
    providers,
    agents,
    tokens,
    scenarios,
    batch,
    calibrate,
    demo,
):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """The entry point: click's usage errors exit 3 (click's own default is 2, which the
    client commands give to a batch in error)."""
    try:
        get_settings()  # a configuration error is reported before any command runs
        logging.getLogger("httpx").setLevel(logging.WARNING)  # the client's calls: not news
        cli.main(args=argv, prog_name="spar", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code if not isinstance(exc, click.UsageError) else EXIT_USAGE)
    except SettingsError as exc:
        sys.exit(f"spar: configuration error: {exc}")
