"""Spar's configuration: one frozen object built from ``SPAR_*`` environment variables.

Settings are read one way: a process's entry point calls :func:`get_settings` once and
passes the :class:`Settings` down; nothing below an entry point calls it.  The entry
points are a command of the CLI, :func:`api.app.create_app` (which keeps them in
``app.state.settings``), ``workers/broker.py`` as a worker process starts, a Dramatiq
fork function (``workers.metrics.serve_worker_metrics``), and
:func:`shared.runtime.get_runtime` (``runtime.settings`` in workers and the scheduler).
Services, the broker (:func:`shared.queue.get_broker`) and the database take
``settings`` as a parameter; tests build their own with :func:`settings_from_env` or
``Settings(...)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache

import msgspec


class SettingsError(ValueError):
    """A ``SPAR_*`` variable holds a value Spar cannot use."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    # PostgreSQL, ``postgresql+psycopg://…``; ``spar dev`` sets it to its embedded server.
    database_url: str | None = None
    redis_url: str | None = None
    secret_key: str | None = None
    # The base of the URLs Spar hands out (webhook URLs).  Unset, ``spar serve`` and
    # ``spar dev`` make it the address they listen on (api.cli.run_uvicorn).
    public_base_url: str = "http://localhost:8000"
    egress_allow_private: bool = False
    allow_registration: bool = True
    user_token_ttl_s: int = 7 * 24 * 3600
    # Calibration: how long the endpoint waits for the verdicts before answering 202, the
    # most examples in one calibration, and how many the actor judges at once.
    calibration_wait_s: float = 30.0
    calibration_max_examples: int = 1000
    calibration_concurrency: int = 8
    egress_timeout_s: float = 60.0
    # Outbound limits (shared.outbound.limits): each destination's concurrency starts at
    # and never exceeds this; a call refused by rate limits this long ends in error.
    outbound_max_concurrency: int = 100
    rate_limit_wait_s: float = 600.0
    sweep_interval_s: float = 15.0
    # Work whose message made no progress for this long is sent again (a lost message)...
    run_stall_s: float = 300.0
    # ... and work in flight whose heartbeat is this old (a dead worker) too (shared.work).
    run_heartbeat_timeout_s: float = 30.0
    # Triggers: a slot missed while no scheduler ran still fires if at most this old; a
    # standby scheduler tries for leadership this often; trigger changes are re-read on
    # NOTIFY at once, and every trigger_poll_s whatever happens.
    trigger_grace_s: float = 300.0
    leader_retry_s: float = 2.0
    trigger_poll_s: float = 10.0
    # The second of the minute each cron slot fires at: "0", standard cron, except in the
    # scheduler failover drill, which runs a "* * * * *" trigger every six seconds ("*/6").
    trigger_second: str = "0"
    # Knowledge: the largest document content taken (UTF-8 bytes), and how long a run of
    # an llm agent waits for its bookmarked documents to be ready before it errors.
    knowledge_max_bytes: int = 5 * 1024 * 1024
    knowledge_wait_s: float = 60.0
    db_pool_size: int = 10
    work_poll_ms: int = 1000
    # A worker process plays at most this many scenario runs at once, on its event loop
    # (workers.conversations); asked to stop, it waits this long for them to end, then
    # hands the rest to other workers.
    runs_in_flight: int = 500
    worker_drain_s: float = 10.0
    log_level: str = "INFO"
    log_format: str = "json"  # or "text"; spar dev defaults to text
    # When set, GET /metrics requires "Authorization: Bearer <metrics_token>".
    metrics_token: str | None = None
    worker_metrics_port: int | None = None  # spar worker --metrics-port
    # Failed-login throttle (shared/identity/throttle.py): limits and windows per
    # (account, address) pair, per account, per address; known addresses skip the account's.
    login_pair_limit: int = 5
    login_pair_window_s: float = 900.0
    login_account_limit: int = 20
    login_account_window_s: float = 300.0
    login_address_limit: int = 50
    login_address_window_s: float = 900.0
    login_known_address_s: float = 30 * 24 * 3600.0
    login_key_prefix: str = "spar:login:"
    # argon2id parameters, by profile name in ``argon2.profiles`` (shared/security.py):
    # RFC_9106_LOW_MEMORY (t=3, 64 MiB, p=4) in production; the test suite's CHEAPEST.
    password_hash_profile: str = "RFC_9106_LOW_MEMORY"  # noqa: S105 (a profile's name)

    def require_database_url(self) -> str:
        """The database URL, or a configuration error naming the variable to set."""
        if not self.database_url:
            raise SettingsError(
                "SPAR_DATABASE_URL must be set (postgresql+psycopg://user:pass@host:5432/db); "
                "`spar dev` starts an embedded PostgreSQL without it"
            )
        return self.database_url


# Environment variable -> (field, parser).  The table is the single place that names them;
# the README's configuration table mirrors it.
def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise SettingsError(f"expected a boolean, got {raw!r}")


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise SettingsError(f"expected a positive integer, got {raw!r}")
    return value


def _log_format(raw: str) -> str:
    value = raw.strip().lower()
    if value not in {"json", "text"}:
        raise SettingsError(f"expected json or text, got {raw!r}")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise SettingsError(f"expected a positive number, got {raw!r}")
    return value


_VARIABLES = {
    "SPAR_DATABASE_URL": ("database_url", str),
    "SPAR_REDIS_URL": ("redis_url", str),
    "SPAR_SECRET_KEY": ("secret_key", str),
    "SPAR_PUBLIC_BASE_URL": ("public_base_url", lambda raw: raw.rstrip("/")),
    "SPAR_EGRESS_ALLOW_PRIVATE": ("egress_allow_private", _bool),
    "SPAR_ALLOW_REGISTRATION": ("allow_registration", _bool),
    "SPAR_USER_TOKEN_TTL_S": ("user_token_ttl_s", _positive_int),
    "SPAR_CALIBRATION_WAIT_S": ("calibration_wait_s", _positive_float),
    "SPAR_CALIBRATION_MAX_EXAMPLES": ("calibration_max_examples", _positive_int),
    "SPAR_CALIBRATION_CONCURRENCY": ("calibration_concurrency", _positive_int),
    "SPAR_EGRESS_TIMEOUT_S": ("egress_timeout_s", _positive_float),
    "SPAR_OUTBOUND_MAX_CONCURRENCY": ("outbound_max_concurrency", _positive_int),
    "SPAR_RATE_LIMIT_WAIT_S": ("rate_limit_wait_s", _positive_float),
    "SPAR_SWEEP_INTERVAL_S": ("sweep_interval_s", _positive_float),
    "SPAR_RUN_STALL_S": ("run_stall_s", _positive_float),
    "SPAR_RUN_HEARTBEAT_TIMEOUT_S": ("run_heartbeat_timeout_s", _positive_float),
    "SPAR_TRIGGER_GRACE_S": ("trigger_grace_s", _positive_float),
    "SPAR_LEADER_RETRY_S": ("leader_retry_s", _positive_float),
    "SPAR_TRIGGER_POLL_S": ("trigger_poll_s", _positive_float),
    "SPAR_KNOWLEDGE_MAX_BYTES": ("knowledge_max_bytes", _positive_int),
    "SPAR_KNOWLEDGE_WAIT_S": ("knowledge_wait_s", _positive_float),
    "SPAR_DB_POOL_SIZE": ("db_pool_size", _positive_int),
    "SPAR_WORK_POLL_MS": ("work_poll_ms", _positive_int),
    "SPAR_RUNS_IN_FLIGHT": ("runs_in_flight", _positive_int),
    "SPAR_WORKER_DRAIN_S": ("worker_drain_s", _positive_float),
    "SPAR_LOG_LEVEL": ("log_level", str.upper),
    "SPAR_LOG_FORMAT": ("log_format", _log_format),
    "SPAR_METRICS_TOKEN": ("metrics_token", str),
    "SPAR_WORKER_METRICS_PORT": ("worker_metrics_port", _positive_int),
    "SPAR_LOGIN_PAIR_LIMIT": ("login_pair_limit", _positive_int),
    "SPAR_LOGIN_PAIR_WINDOW_S": ("login_pair_window_s", _positive_float),
    "SPAR_LOGIN_ACCOUNT_LIMIT": ("login_account_limit", _positive_int),
    "SPAR_LOGIN_ACCOUNT_WINDOW_S": ("login_account_window_s", _positive_float),
    "SPAR_LOGIN_ADDRESS_LIMIT": ("login_address_limit", _positive_int),
    "SPAR_LOGIN_ADDRESS_WINDOW_S": ("login_address_window_s", _positive_float),
    "SPAR_LOGIN_KNOWN_ADDRESS_S": ("login_known_address_s", _positive_float),
    "SPAR_LOGIN_KEY_PREFIX": ("login_key_prefix", str),
    "SPAR_PASSWORD_HASH_PROFILE": ("password_hash_profile", str.upper),
    "SPAR_TRIGGER_SECOND": ("trigger_second", str),
}


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Build settings from ``environ`` (default: the process environment); empty means unset."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for variable, (field, parse) in _VARIABLES.items():
        raw = environ.get(variable, "")
        if raw == "":
            continue
        try:
            values[field] = parse(raw)
        except (ValueError, SettingsError) as exc:
            raise SettingsError(f"{variable}: {exc}") from None
    return Settings(**values)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return settings_from_env()
