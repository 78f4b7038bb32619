"""The directory prometheus-client's multiprocess mode shares between the processes of one
``spar serve --workers N`` or ``spar worker --processes N``.

prometheus-client decides once, when it is first imported, whether a process writes its
metrics to files in ``PROMETHEUS_MULTIPROC_DIR``; so the variable is set here, by the
command, before anything imports it (this module must not), and every process it starts
inherits it.  Each run starts from an empty directory: files left by an earlier run would
be summed into this one's counters.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir(role: str) -> Path:
    """Use ``$PROMETHEUS_MULTIPROC_DIR`` (emptied of an earlier run's files) or, when it is
    unset, a new private directory for this run; export it for the processes to come."""
    if "prometheus_client" in sys.modules and not os.environ.get(ENV):
        # Already imported in single-process mode: this process's metrics would never
        # reach the directory the scrape reads.
        raise RuntimeError("prometheus_client was imported before its directory was chosen")
    given = os.environ.get(ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
    else:
        path = Path(tempfile.mkdtemp(prefix=f"spar-{role}-metrics-"))
        os.environ[ENV] = str(path)
    return path
