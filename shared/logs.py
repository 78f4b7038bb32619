"""One log format for every Spar process (the API, ``spar dev``, workers, the scheduler)."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (``SPAR_LOG_LEVEL``); a no-op once logging is configured."""
    logging.basicConfig(level=level, format=FORMAT, stream=sys.stderr)
