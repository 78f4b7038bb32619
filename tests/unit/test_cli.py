"""``spar --help`` tells the truth: every command is listed with a line of help, and every
option of every command says what it is for."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli import build_parser

COMMANDS = ("dev", "migrate", "worker", "scheduler", "serve")


def spar(*args: str) -> str:
    """The installed ``spar`` entry point's output (the module's, without the script)."""
    script = Path(sys.executable).with_name("spar")
    argv = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "import api.cli as c; c.main()"]
    )
    done = subprocess.run(
        [*argv, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _entries(section: str) -> dict[str, str]:
    """The entries of a help section by their first word (an option or a command), each
    with its wrapped lines joined."""
    entries: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        words = line.split()
        if not words:
            continue
        if len(line) - len(line.lstrip()) <= 4 or current is None:  # deeper: wrapped help
            current = words[0].rstrip(",")
            entries[current] = " ".join(words)
        else:
            entries[current] += " " + " ".join(words)
    return entries


def _commands() -> argparse._SubParsersAction:  # type: ignore[type-arg]
    (group,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return group


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    return dict(_commands().choices)


def test_spar_help_lists_every_command_with_its_help() -> None:
    out = spar("--help")
    helps = {choice.dest: choice.help for choice in _commands()._choices_actions}
    assert tuple(_subcommands()) == tuple(helps) == COMMANDS
    listed = _entries(out.split("COMMAND\n", 1)[1].split("options:", 1)[0])
    assert tuple(listed) == COMMANDS, out
    for name in COMMANDS:
        assert helps[name], f"{name} has no help"
        # Listed under the commands with its help, and named in the description above.
        assert helps[name] in listed[name], (name, out)
        assert f"spar {name}" in out, f"the description does not mention spar {name}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_of_every_command_is_described(name: str) -> None:
    command = _subcommands()[name]
    assert command.description, f"spar {name} --help has no description"
    assert command.get_default("func") is not None, f"spar {name} runs nothing"
    out = spar(name, "--help")
    assert out.startswith(f"usage: spar {name}")
    options = [a for a in command._actions if a.option_strings and a.dest != "help"]
    entries = _entries(out.split("options:", 1)[1])
    for action in options:
        option = action.option_strings[0]
        assert action.help, f"spar {name} {option} has no help"
        described = action.help.split("(")[0].strip()
        assert described in entries.get(option, ""), (option, out)
    if name in ("dev", "serve", "worker"):
        assert options, f"spar {name} lost its options"
