"""Two real ``spar scheduler`` processes on one database through at least nine slots of a
``* * * * *`` trigger (on a schedule of seconds: ``SPAR_TRIGGER_SECOND=*/6``), the active
one killed with SIGKILL part way: every slot fires exactly once, and the standby fires
the slots after the kill on time.

The drill itself (the processes, the trigger, the kill) is ``tests/support/failover.py``.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from tests.support.failover import (
    KILL_AFTER_SLOTS,
    RUN_SLOTS,
    SLOT,
    SLOTS_AFTER_KILL,
    FailoverDrill,
    summary,
)

pytestmark = pytest.mark.slow


def test_two_schedulers_fire_every_slot_exactly_once_through_a_kill(
    database_url: str, redis_url: str
) -> None:
    result = FailoverDrill(database_url, redis_url).run()
    if result.error is not None:
        raise AssertionError(summary(result)) from result.error
    context = summary(result)
    executions = result.executions
    slots = [e["scheduled_for"] for e in executions]

    # At least RUN_SLOTS consecutive slots from the first after the trigger was made, none
    # skipped, none twice, all run, nothing missed.
    assert len(slots) >= RUN_SLOTS, context
    assert slots[0] - result.trigger_created_at < SLOT, context
    assert all(b - a == SLOT for a, b in itertools.pairwise(slots)), context
    assert [e["source"] for e in executions] == ["schedule"] * len(slots), context
    assert {e["status"] for e in executions} == {"succeeded"}, context
    assert all(e["response"] == "tock tick every minute" for e in executions), context

    # The agent heard each slot once.
    heard = Counter(c["metadata"]["trigger_execution_id"] for c in result.agent_calls)
    assert set(heard) == {e["id"] for e in executions}, context
    assert set(heard.values()) == {1}, context

    # The leader died between slots with slots behind it; the standby took the lead and
    # fired the slots after the kill, each recorded before the next one was due.
    assert result.standby_led, context
    before = [e for e in executions if e["scheduled_for"] < result.killed_at]
    after = [e for e in executions if e["scheduled_for"] > result.killed_at]
    assert len(before) >= KILL_AFTER_SLOTS, context
    assert len(after) >= SLOTS_AFTER_KILL, context
    assert all(e["created_at"] < e["scheduled_for"] + SLOT for e in executions), context
