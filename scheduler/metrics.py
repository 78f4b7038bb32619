"""What only the scheduler exports (``spar scheduler --metrics-port``): whether it leads,
the trigger slots it recorded, and the work its sweeper sent again.  Its counters exist,
at 0, for every label value from the start (all known in advance): an alert on the first
missed slot needs the series to be there before it moves."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from shared import work

SCHEDULER_LEADING = Gauge(
    "spar_scheduler_leading",
    "1 while this scheduler holds the lock and runs the trigger jobs and the sweeper.",
    multiprocess_mode="livemax",
)
SLOT_OUTCOMES = ("queued", "missed")
TRIGGER_SLOTS = Counter(
    "spar_trigger_slots_total",
    "Scheduled trigger slots recorded by the scheduler: queued (fired), or missed (older "
    "than SPAR_TRIGGER_GRACE_S when recorded).",
    ["outcome"],
)
DISPATCHED = "batch_runs"  # the sweeper's label for the runs it handed out to batches
SWEEPER_RESENT = Counter(
    "spar_sweeper_resent_total",
    "Work the sweeper sent again or handed out: stalled runs, batch runs dispatched, "
    "trigger executions, knowledge documents, calibrations, notification events, webhook "
    "deliveries due.",
    ["kind"],
)

FAMILIES = (SCHEDULER_LEADING, TRIGGER_SLOTS, SWEEPER_RESENT)

for outcome in SLOT_OUTCOMES:
    TRIGGER_SLOTS.labels(outcome)
for kind in (*(unit.label for unit in work.KINDS), DISPATCHED):
    SWEEPER_RESENT.labels(kind)
