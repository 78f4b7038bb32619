"""Every actor, for ``spar worker`` (``dramatiq workers.actors``)."""

from workers.runs import run_scenario

__all__ = ["run_scenario"]
