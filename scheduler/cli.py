"""``spar scheduler``: cron triggers and the stuck-work sweeper (one replica active).

``client.cli`` imports this module only when the command runs (its short help lives there).
"""

from __future__ import annotations

import click

from shared.settings import SettingsError, get_settings


@click.command("scheduler")
@click.option(
    "--metrics-port",
    type=click.IntRange(min=1),
    default=None,
    help="Serve the scheduler's Prometheus metrics on this port at /metrics (default: none).",
)
def scheduler(metrics_port: int | None) -> None:
    """Fire scheduled triggers at their cron times, exactly once per slot, and re-enqueue
    work stuck past its deadline.  Run several for availability: a PostgreSQL advisory
    lock keeps one active, and a standby takes over within SPAR_LEADER_RETRY_S.  Needs
    SPAR_REDIS_URL."""
    # Imported here: prometheus_client (through scheduler.main) only once the command runs.
    from scheduler.main import main as scheduler_main

    settings = get_settings()
    settings.require_database_url()
    if not settings.redis_url:
        raise SettingsError("SPAR_REDIS_URL must be set: the scheduler sends work to Redis")
    scheduler_main(metrics_port)
