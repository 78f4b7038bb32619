"""``pip install spar`` is the client: in a fresh virtualenv it brings at most 25
distributions, ``spar --help`` and ``spar batch run --help`` work there, and a server
command says to install ``spar[server]``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "api", "client", "workers", "scheduler", "shared")
MOST_DISTRIBUTIONS = 25
INSTALL_TIMEOUT_S = 900  # a wheel built from the working tree, the client's dependencies


def run(*argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_base_install_is_a_light_client(tmp_path: Path) -> None:
    # The working tree's files, as the Dockerfile copies them: pip builds where it is told,
    # and leaves build/ and *.egg-info there.
    source = tmp_path / "spar"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    python, spar = venv / "bin" / "python", venv / "bin" / "spar"

    installed = run(python, "-m", "pip", "install", source, timeout=INSTALL_TIMEOUT_S)
    assert installed.returncode == 0, installed.stderr[-3000:]

    listed = run(python, "-m", "pip", "list", "--format=json")
    assert listed.returncode == 0, listed.stderr
    names = sorted(d["name"] for d in json.loads(listed.stdout) if d["name"] != "pip")
    print(f"{len(names)} distributions besides pip: {', '.join(names)}")
    assert "spar" in names
    assert len(names) <= MOST_DISTRIBUTIONS, names
    assert not {"litestar", "SQLAlchemy", "sqlalchemy", "dramatiq", "psycopg"} & set(names)

    for args in (("--help",), ("batch", "run", "--help")):
        done = run(spar, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert done.stdout.startswith(f"Usage: spar {' '.join(args[:-1])}".rstrip())
    assert "batch run" in run(spar, "--help").stdout

    for args in (("serve", "--help"), ("serve",)):
        done = run(spar, *args)
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        assert "pip install 'spar[server]'" in done.stderr
