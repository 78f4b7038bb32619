"""The cyclic garbage collector's settings for a long-lived process (``spar serve``, a
worker), applied once its startup is done: :func:`settle_startup_heap`."""

from __future__ import annotations

import gc

# Allocations between two collections of the youngest generation (CPython's default is
# 700).  A conversation's objects live for its turn (half a second of I/O), so at 700 a
# worker collected every few tens of milliseconds and walked the same in-flight objects
# again and again, then promoted them and walked them in the older generations: 4-5 % of a
# worker's CPU (bench/batch.py, 2 workers at K=50: 0.17-0.20 s of collections in 4.2 s of
# CPU at 700, 0.04 s at 10,000).  Garbage in cycles is still collected, a little later.
YOUNG_THRESHOLD = 10_000


def settle_startup_heap() -> None:
    """Keep the objects alive after startup (modules, the app or the actors, pools and
    sessions: 150,000-200,000) out of the collector's reach, and collect the young
    generation less often (:data:`YOUNG_THRESHOLD`).  Each full collection walked the
    startup objects and held the event loop for 50-230 ms on this 2-core VM, every few
    seconds under load: the API's p99.  Collected first, so no garbage is frozen; the
    second collection finds the oldest generation empty, so later full collections walk
    only what outlived startup."""
    gc.collect()
    gc.freeze()
    gc.collect()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
