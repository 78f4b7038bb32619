"""The ``spar`` command: the processes of a deployment and the client a team uses.

Server: ``spar dev`` (everything in one process on an embedded PostgreSQL),
``spar migrate``, ``spar serve``, ``spar worker``, ``spar scheduler``.
Client (``SPAR_URL`` + ``SPAR_TOKEN``, or a profile): ``spar scenarios push``,
``spar batch run``, ``spar calibrate``; and ``spar demo``, the whole path on the embedded
default with nothing configured.

Exit codes of the client commands: 0 success, 1 a scenario failed, 2 an error in the
batch, 3 a usage, configuration or connection problem.
"""

from __future__ import annotations

import logging
import sys

import click

from api.cli.batch import batch
from api.cli.calibrate import calibrate
from api.cli.client import EXIT_USAGE
from api.cli.demo import demo
from api.cli.scenarios import scenarios
from api.cli.server import COMMANDS as SERVER_COMMANDS
from shared.logs import configure_logging
from shared.settings import SettingsError, get_settings


@click.group(
    "spar",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
def cli() -> None:
    """Spar: test conversational AI agents — scenarios, batch runs, an LLM judge,
    calibration, knowledge and triggers.

    \b
    Run Spar:   spar dev | spar migrate | spar serve | spar worker | spar scheduler
    Use Spar:   spar scenarios push | spar batch run | spar calibrate
    Try it:     spar demo
    """


for command in (*SERVER_COMMANDS, scenarios, batch, calibrate, demo):
    cli.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """The entry point: click's usage errors exit 3 (click's own default is 2, which the
    client commands give to a batch in error)."""
    try:
        configure_logging(get_settings().log_level, get_settings().log_format)
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
