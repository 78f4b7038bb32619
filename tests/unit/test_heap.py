"""shared.heap: a long-lived process's collector settings after startup."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from shared.heap import YOUNG_THRESHOLD, settle_startup_heap


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was, after the test."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settling_freezes_what_is_alive_and_collects_the_garbage_first(collector: None) -> None:
    gc.unfreeze()
    alive = Cycle()
    garbage = Cycle()
    gone = weakref.ref(garbage)
    del garbage
    settle_startup_heap()
    assert gone() is None  # collected, not frozen with the rest
    assert gc.is_tracked(alive)
    # Frozen: tracked, yet in no generation a collection walks.
    assert not any(o is alive for g in range(3) for o in gc.get_objects(generation=g))
    assert gc.get_freeze_count() > 0


def test_settling_collects_the_young_generation_less_often_and_keeps_the_older_thresholds(
    collector: None,
) -> None:
    gc.set_threshold(700, 11, 12)
    settle_startup_heap()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
    assert YOUNG_THRESHOLD > 700
