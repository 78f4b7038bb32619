"""Every actor, for ``spar worker`` (``dramatiq workers.actors``)."""

from workers.runs import dispatch_batch, run_scenario

__all__ = ["dispatch_batch", "run_scenario"]
