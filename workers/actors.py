"""Every actor, for ``spar worker`` (``dramatiq workers.actors``)."""

from workers.calibration import calibrate, judge_trust
from workers.documents import process_document
from workers.notifications import announce_event, deliver_webhook
from workers.runs import dispatch_batch, run_scenario
from workers.triggers import run_trigger_execution

__all__ = [
    "announce_event",
    "calibrate",
    "deliver_webhook",
    "dispatch_batch",
    "judge_trust",
    "process_document",
    "run_scenario",
    "run_trigger_execution",
]
