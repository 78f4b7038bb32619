"""``--help`` tells the truth: every command and subcommand of ``spar`` is listed with a
line of help and a description, and every option says what it is for."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

from client.cli import cli

COMMANDS = (
    "agents",
    "batch",
    "calibrate",
    "credentials",
    "demo",
    "dev",
    "hosts",
    "login",
    "migrate",
    "orgs",
    "providers",
    "scenarios",
    "scheduler",
    "serve",
    "tokens",
    "worker",
)


def spar(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``spar`` entry point of this checkout (``python -m client``: an installed script
    may belong to another checkout; tests/e2e/test_client_install.py runs the script)."""
    return subprocess.run(
        [sys.executable, "-m", "client", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )


def subcommands(group: click.Group) -> dict[str, click.Command]:
    """The group's commands, the lazily imported server commands among them."""
    context = click.Context(group)
    found = {name: group.get_command(context, name) for name in group.list_commands(context)}
    return {name: command for name, command in found.items() if command is not None}


def leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in sorted(subcommands(group).items()):
        if isinstance(command, click.Group):
            found += leaves(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


LEAVES = leaves(cli)


def command_at(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = subcommands(command)[name]
    return command


def test_spar_help_lists_every_command_with_its_help() -> None:
    done = spar("--help")
    assert done.returncode == 0, done.stderr
    assert tuple(sorted(subcommands(cli))) == COMMANDS
    listed = done.stdout.split("Commands:", 1)[1]
    for name, command in subcommands(cli).items():
        short = command.get_short_help_str(limit=200)
        assert short, f"spar {name} has no help"
        assert f"  {name}  " in listed and short.split(".")[0] in listed, (name, done.stdout)
        assert f"spar {name}" in done.stdout.split("Commands:", 1)[0]  # in the overview too
    assert ("batch", "run") in LEAVES and ("scenarios", "push") in LEAVES


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_option_of_every_command_is_described(path: tuple[str, ...]) -> None:
    command = command_at(path)
    assert command.help, f"spar {' '.join(path)} has no description"
    done = spar(*path, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: spar {' '.join(path)}")
    for parameter in command.params:
        if isinstance(parameter, click.Option):
            assert parameter.help, f"spar {' '.join(path)} {parameter.opts[0]} has no help"
            assert parameter.opts[0] in done.stdout
            assert parameter.help.split("(")[0].split(".")[0].strip() in " ".join(
                done.stdout.split()
            ), (parameter.opts, done.stdout)


def test_a_usage_error_exits_3_and_says_what_is_wrong() -> None:
    done = spar("batch", "run", "--concurrency", "0", "--agent", "a", "--tag", "t")
    assert done.returncode == 3
    assert "--concurrency" in done.stderr
    unknown = spar("no-such-command")
    assert unknown.returncode == 3 and "No such command" in unknown.stderr


def test_the_command_line_imports_no_metrics_before_the_server_chooses_their_directory() -> None:
    """``spar serve`` and ``spar worker`` set prometheus_client's multiprocess directory
    before it is imported: the CLI's own modules (the client's and the processes' commands)
    must not import it."""
    probe = (
        "import sys, client.cli, api.cli, workers.cli, scheduler.cli; "
        "print('prometheus_client' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


def test_spar_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    done = spar("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"spar {version('spar')}"


def test_bare_spar_prints_the_help_and_exits_0() -> None:
    done = spar()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: spar [OPTIONS] COMMAND [ARGS]...")
    assert "Commands:" in done.stdout and done.stderr == ""


def test_batch_run_help_says_the_cli_takes_names_where_the_rest_api_takes_ids() -> None:
    done = spar("batch", "run", "--help")
    text = " ".join(done.stdout.split())
    assert "REST API" in text and "agent_id" in text, done.stdout


def test_worker_help_says_redis_is_what_a_separate_worker_needs_not_spar_dev() -> None:
    """``spar worker`` takes its work from Redis; ``spar dev`` runs the workers in its own
    process on an in-memory broker: no command's help says Redis is needed there."""
    overview = " ".join(spar("--help").stdout.split())
    assert "one process: embedded PostgreSQL, no Redis" in overview, overview
    worker = " ".join(spar("worker", "--help").stdout.split())
    assert "SPAR_REDIS_URL" in worker and "spar dev needs no Redis" in worker, worker
    dev = " ".join(spar("dev", "--help").stdout.split())
    assert "no Redis" in dev, dev


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("127.0.0.1", 18100, "http://127.0.0.1:18100"),
        ("0.0.0.0", 8000, "http://localhost:8000"),  # noqa: S104 - a listening address
        ("::", 9000, "http://localhost:9000"),
        ("", 9000, "http://localhost:9000"),
        ("::1", 8080, "http://[::1]:8080"),
        ("spar.internal", 80, "http://spar.internal:80"),
    ],
)
def test_the_default_public_url_is_the_address_served(host: str, port: int, url: str) -> None:
    from api.cli import listening_url

    assert listening_url(host, port) == url


def test_a_profile_is_written_private_and_whole_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spar login``'s writer: mode 0600, other profiles and values kept, any text a token
    or a name may hold spelled as TOML reads it back."""
    from client.profiles import config_path, save_profile, target

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for variable in ("SPAR_URL", "SPAR_TOKEN", "SPAR_ORG", "SPAR_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(
        'timeout = 3\n[profiles.ci]\nurl = "http://ci"\ntoken = "pat_x"\nretry = true\n'
    )
    odd = 'ust_"quoted"\\back\tslash\x7f é'
    save_profile("my team", url="http://127.0.0.1:8000", token=odd, org="Acme")
    document = tomllib.loads(path.read_text())
    assert document["timeout"] == 3
    assert document["profiles"]["ci"] == {"url": "http://ci", "token": "pat_x", "retry": True}
    assert document["profiles"]["my team"]["token"] == odd
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    save_profile("my team", org=None)
    assert "org" not in tomllib.loads(path.read_text())["profiles"]["my team"]

    save_profile("ci", org="11111111-2222-3333-4444-555555555555")
    chosen = target("ci")
    assert (chosen.url, chosen.token, chosen.org, chosen.profile) == (
        "http://ci",
        "pat_x",
        "11111111-2222-3333-4444-555555555555",
        "ci",
    )
    assert target("ci", "Other").org == "Other"  # --org wins
    # A token from the environment never takes the profile's organization.
    monkeypatch.setenv("SPAR_TOKEN", "pat_env")
    from_env = target("ci")
    assert (from_env.url, from_env.token, from_env.org, from_env.profile) == (
        "http://ci",
        "pat_env",
        None,
        None,
    )
