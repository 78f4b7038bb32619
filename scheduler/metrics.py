"""What only the scheduler exports (``spar scheduler --metrics-port``): whether it leads,
the trigger slots it recorded, and the work its sweeper sent again."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SCHEDULER_LEADING = Gauge(
    "spar_scheduler_leading",
    "1 while this scheduler holds the lock and runs the trigger jobs and the sweeper.",
    multiprocess_mode="livemax",
)
TRIGGER_SLOTS = Counter(
    "spar_trigger_slots_total",
    "Scheduled trigger slots recorded by the scheduler: queued (fired), or missed (older "
    "than SPAR_TRIGGER_GRACE_S when recorded).",
    ["outcome"],
)
SWEEPER_RESENT = Counter(
    "spar_sweeper_resent_total",
    "Work the sweeper sent again or handed out: stalled runs, batch runs dispatched, "
    "trigger executions, knowledge documents, calibrations.",
    ["kind"],
)
