"""The client installs light: importing it, ``spar --help`` and ``spar batch run --help``
load none of the server's libraries; the server's commands are found with their processes,
and ``api/`` imports neither ``workers/`` nor ``scheduler/``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from client.demo import DEV_DATA_DIR
from shared.db.embedded import DEFAULT_DATA_DIR

ROOT = Path(__file__).resolve().parents[2]
# What the server brings and the client must never load.
SERVER_LIBRARIES = (
    "sqlalchemy",
    "litestar",
    "dramatiq",
    "psycopg",
    "alembic",
    "apscheduler",
    "uvicorn",
    "aiohttp",
    "opentelemetry",
)
# The modules the client decodes and validates with, shared with the server.
SHARED_WITH_THE_CLIENT = (
    "shared",
    "shared.errors",
    "shared.schemas",
    "shared.settings",
    "shared.validation",
    "shared.scenarios.rules",
    "shared.scenarios.schemas",
    "shared.batches.schemas",
    "shared.calibration.schemas",
    "shared.identity.schemas",
    "shared.outbound.schemas",
)


def loaded(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has imported once ``code`` is done (also
    when it exits: ``spar`` does)."""
    report = "print('loaded:', *sorted({m.partition('.')[0] for m in sys.modules}))"
    probe = f"import atexit, sys\natexit.register(lambda: {report})\n{code}"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.rpartition("loaded:")[2].split())


def imported_by_spar(*args: str) -> set[str]:
    """The top-level packages ``spar *args`` imports (its entry point, ``client.cli:main``,
    in a fresh interpreter: a sys.modules check sees ``importlib.import_module`` too, which
    ``python -X importtime`` does not report)."""
    imported = loaded(f"from client.cli import main\nmain({list(args)!r})")
    assert "client" in imported and "click" in imported  # the probe reads what it should
    return imported


def test_importing_the_client_loads_none_of_the_server() -> None:
    assert not loaded("import client.cli") & set(SERVER_LIBRARIES)


@pytest.mark.parametrize("module", SHARED_WITH_THE_CLIENT)
def test_what_the_client_shares_with_the_server_loads_none_of_the_server(module: str) -> None:
    assert not loaded(f"import {module}") & set(SERVER_LIBRARIES)


@pytest.mark.parametrize("args", [("--help",), ("batch", "run", "--help")], ids=" ".join)
def test_spar_help_loads_none_of_the_server(args: tuple[str, ...]) -> None:
    imported = imported_by_spar(*args)
    assert not imported & set(SERVER_LIBRARIES)
    assert not imported & {"api", "workers", "scheduler"}  # the processes' commands neither


def test_a_server_command_imports_its_process_only_when_it_runs() -> None:
    assert {"api", "workers", "scheduler"} & imported_by_spar("serve", "--help") == {"api"}
    assert "workers" in imported_by_spar("worker", "--help")
    assert "scheduler" in imported_by_spar("scheduler", "--help")


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("serve", "--help"), "server"),
        (("serve",), "server"),
        (("worker",), "server"),
        (("dev",), "dev"),
        (("demo", "--exit", "--port", "1"), "dev"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else value,
)
def test_without_the_server_installed_a_server_command_says_what_to_install(
    args: tuple[str, ...], extra: str
) -> None:
    """What a client-only install does (tests/e2e/test_client_install.py installs one):
    here the server's libraries are hidden from a fresh interpreter."""
    hide = "; ".join(f"sys.modules[{name!r}] = None" for name in SERVER_LIBRARIES)
    code = f"import sys; {hide}; from client.cli import main; main({list(args)!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 3, done.stderr
    assert f"pip install 'spar[{extra}]'" in done.stderr


def test_spar_demo_and_spar_dev_share_their_data_directory() -> None:
    assert DEV_DATA_DIR == DEFAULT_DATA_DIR


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):  # every import, at the top or inside a function
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.partition(".")[0])
    return found


def test_the_api_imports_neither_the_workers_nor_the_scheduler() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & {"workers", "scheduler"})
        for path in (ROOT / "api").rglob("*.py")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_client_imports_none_of_the_processes() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & {"api", "workers", "scheduler"})
        for path in (ROOT / "client").rglob("*.py")
    }
    assert {path: names for path, names in offending.items() if names} == {}
