"""Cron semantics of scheduled triggers (shared/triggers/schedule.py), computed, never
waited for: standard day-of-week numbering, day-of-month OR day-of-week, and DST days
in Europe/Amsterdam and America/New_York, against every slot enumerated by brute force
around the changes of those zones, Australia/Lord_Howe (half an hour) and
Antarctica/Troll (two hours)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.triggers.schedule import Schedule, ScheduleError, ScheduleTrigger, check, parse_cron

AMSTERDAM = ZoneInfo("Europe/Amsterdam")
NEW_YORK = ZoneInfo("America/New_York")


def upcoming(expression: str, zone: str, after: datetime, count: int) -> list[datetime]:
    schedule = Schedule(expression, zone)
    found, at = [], after
    for _ in range(count):
        at = schedule.next_after(at)
        assert at is not None
        found.append(at)
    return found


def local(zone: ZoneInfo, *fields: int, fold: int = 0) -> datetime:
    return datetime(*fields, tzinfo=zone, fold=fold).astimezone(UTC)  # type: ignore[misc]


@pytest.mark.parametrize("sunday", ["0", "7", "sun", "SUN"])
def test_day_of_week_0_and_7_are_sunday(sunday: str) -> None:
    # Monday 2026-11-23: the next Sunday is the 29th.
    fired = upcoming(f"0 9 * * {sunday}", "UTC", datetime(2026, 11, 23, tzinfo=UTC), 2)
    assert fired == [datetime(2026, 11, 29, 9, tzinfo=UTC), datetime(2026, 12, 6, 9, tzinfo=UTC)]
    assert all(f.weekday() == 6 for f in fired)


@pytest.mark.parametrize(
    ("field", "weekdays"),
    [
        ("1", {0}),  # Monday, not Tuesday (APScheduler's own numbering would say Tuesday)
        ("1-5", {0, 1, 2, 3, 4}),
        ("5-7", {4, 5, 6}),  # Friday through Sunday
        ("0,6", {5, 6}),
        ("*/2", {6, 1, 3, 5}),  # Sunday, Tuesday, Thursday, Saturday
        ("1-5/2", {0, 2, 4}),
        ("mon-fri", {0, 1, 2, 3, 4}),
        ("*", set(range(7))),
    ],
)
def test_day_of_week_fields_read_as_standard_cron(field: str, weekdays: set[int]) -> None:
    fired = upcoming(f"0 12 * * {field}", "UTC", datetime(2026, 11, 22, tzinfo=UTC), 14)
    assert {f.weekday() for f in fired} == weekdays
    assert all((f.hour, f.minute) == (12, 0) for f in fired)


def test_day_of_month_and_day_of_week_both_restricted_fire_on_either() -> None:
    # The 1st of the month OR any Monday (Vixie cron), not the 1st when it is a Monday.
    fired = upcoming("0 8 1 * 1", "UTC", datetime(2026, 11, 24, tzinfo=UTC), 4)
    assert fired == [
        datetime(2026, 11, 30, 8, tzinfo=UTC),  # Monday
        datetime(2026, 12, 1, 8, tzinfo=UTC),  # the 1st (a Tuesday)
        datetime(2026, 12, 7, 8, tzinfo=UTC),
        datetime(2026, 12, 14, 8, tzinfo=UTC),
    ]
    # With a star-led day of week, only the day of month counts.
    fired = upcoming("0 8 1-3 * *", "UTC", datetime(2026, 11, 24, tzinfo=UTC), 3)
    assert [f.day for f in fired] == [1, 2, 3]


def test_a_spring_forward_slot_fires_once_after_the_change() -> None:
    # Amsterdam, 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
    fired = upcoming("30 2 * * *", "Europe/Amsterdam", datetime(2026, 3, 28, 12, tzinfo=UTC), 3)
    assert fired == [
        local(AMSTERDAM, 2026, 3, 29, 3, 30),  # once, as far past the change as it lay in
        local(AMSTERDAM, 2026, 3, 30, 2, 30),
        local(AMSTERDAM, 2026, 3, 31, 2, 30),
    ]
    assert fired[0] == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    # New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT.
    fired = upcoming("30 2 * * *", "America/New_York", datetime(2026, 3, 7, 12, tzinfo=UTC), 2)
    assert fired == [datetime(2026, 3, 8, 7, 30, tzinfo=UTC), local(NEW_YORK, 2026, 3, 9, 2, 30)]


def test_a_fall_back_slot_fires_once_at_its_first_occurrence() -> None:
    # New York, 2026-11-01: 01:30 happens twice (EDT, then EST).
    fired = upcoming("30 1 * * *", "America/New_York", datetime(2026, 10, 31, 12, tzinfo=UTC), 3)
    assert fired == [
        local(NEW_YORK, 2026, 11, 1, 1, 30, fold=0),  # 05:30 UTC, the EDT one
        local(NEW_YORK, 2026, 11, 2, 1, 30),
        local(NEW_YORK, 2026, 11, 3, 1, 30),
    ]
    assert fired[0] == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)
    # Amsterdam, 2026-10-25: 02:30 happens twice (CEST, then CET).
    fired = upcoming("30 2 * * *", "Europe/Amsterdam", datetime(2026, 10, 24, 12, tzinfo=UTC), 2)
    assert fired == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        local(AMSTERDAM, 2026, 10, 26, 2, 30),
    ]


def test_every_twenty_minutes_through_both_changes_never_repeats_a_slot() -> None:
    # Fall back in New York: the repeated hour's slots already fired the first time.
    start = datetime(2026, 11, 1, 4, 30, tzinfo=UTC)  # 00:30 EDT
    fired = upcoming("*/20 * * * *", "America/New_York", start, 7)
    walls = [f.astimezone(NEW_YORK).strftime("%H:%M%z") for f in fired]
    assert walls == [
        "00:40-0400",
        "01:00-0400",
        "01:20-0400",
        "01:40-0400",
        "02:00-0500",  # 01:00-01:40 EST are not fired a second time
        "02:20-0500",
        "02:40-0500",
    ]
    assert len(set(fired)) == len(fired) and fired == sorted(fired)
    # Spring forward in Amsterdam: every 20 minutes of real time, through the gap.
    start = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # 01:30 CET
    fired = upcoming("*/20 * * * *", "Europe/Amsterdam", start, 5)
    assert [f - start for f in fired] == [timedelta(minutes=m) for m in (10, 30, 50, 70, 90)]


def test_slots_lists_a_window_oldest_first() -> None:
    schedule = Schedule("*/15 * * * *", "UTC")
    after = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
    until = datetime(2026, 11, 24, 11, 0, tzinfo=UTC)
    assert list(schedule.slots(after, until)) == [
        after + timedelta(minutes=m) for m in (15, 30, 45, 60)
    ]


def test_the_apscheduler_trigger_wakes_at_each_slot() -> None:
    trigger = ScheduleTrigger(Schedule("0 * * * *", "Asia/Kolkata"))  # UTC+5:30
    now = datetime(2026, 11, 24, 10, 10, tzinfo=UTC)
    first = trigger.get_next_fire_time(None, now)
    assert first == datetime(2026, 11, 24, 10, 30, tzinfo=UTC)  # 16:00 in Kolkata
    assert trigger.get_next_fire_time(first, first) == first + timedelta(hours=1)
    # At exactly a slot, that slot is next (APScheduler asks with now = the slot).
    assert trigger.get_next_fire_time(None, first) == first


# Around each zone's changes of 2026 (Lord Howe moves its clocks by half an hour).
CHANGES = [
    ("Europe/Amsterdam", datetime(2026, 3, 29, 1, tzinfo=UTC)),
    ("Europe/Amsterdam", datetime(2026, 10, 25, 1, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 3, 8, 7, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 11, 1, 6, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2026, 4, 4, 15, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2026, 10, 3, 15, 30, tzinfo=UTC)),
    ("Antarctica/Troll", datetime(2026, 3, 29, 1, tzinfo=UTC)),  # two hours forward
    ("Antarctica/Troll", datetime(2026, 10, 25, 1, tzinfo=UTC)),
    ("UTC", datetime(2026, 11, 24, 10, tzinfo=UTC)),
]


def every_slot(expression: str, zone: str, first: datetime, last: datetime) -> list[datetime]:
    """Each slot from a day before ``first`` to past ``last``, by brute force: every wall
    time the cron names, placed as documented (a time the clocks skipped as far past the
    change as it lay in, a repeated one at its first occurrence), in the order of time."""
    cron, tz = parse_cron(expression), ZoneInfo(zone)
    wall = (first - timedelta(days=1)).astimezone(tz).replace(tzinfo=UTC)
    end = (last + timedelta(days=1)).astimezone(tz).replace(tzinfo=UTC)
    found = set()
    while True:
        wall = cron.get_next_fire_time(None, wall + timedelta(microseconds=1))
        placed = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
        found.add(placed)
        if wall > end and placed > last:
            return sorted(found)


@settings(max_examples=300, deadline=None)
@given(
    change=st.sampled_from(CHANGES),
    expression=st.sampled_from(
        [
            "30 2 * * *",
            "*/20 * * * *",
            "15 1 * * *",
            "0 3 * * 0",
            "45 */2 * * *",
            "0 0 1 * *",
            "25,45 * * * *",
            "30 2,3 * * *",
            "0 2-3 * * *",
        ]
    ),
    minutes=st.lists(st.integers(min_value=-36 * 60, max_value=36 * 60), min_size=1, max_size=12),
    seconds=st.integers(min_value=0, max_value=59),
)
def test_the_next_slot_is_the_first_after_the_instant_asked_in_any_order(
    change: tuple[str, datetime], expression: str, minutes: list[int], seconds: int
) -> None:
    """Around a change of the clocks, the next slot after any instant is the first of all
    the slots after it, including one moved past the change by a skipped hour; asked again
    (a schedule keeps its last answer), in time order and then in any order, the same."""
    zone, at = change
    instants = [at + timedelta(minutes=minute, seconds=seconds) for minute in minutes]
    slots = every_slot(expression, zone, min(instants), max(instants))
    kept = Schedule(expression, zone)
    for instant in [*sorted(instants), *instants]:
        expected = next(slot for slot in slots if slot > instant)
        assert Schedule(expression, zone).next_after(instant) == expected, instant
        assert kept.next_after(instant) == expected, instant


def test_a_slot_the_clocks_skipped_is_still_next_just_after_the_change() -> None:
    # Amsterdam, 2026-03-29: 02:30 did not exist; it fires at 03:30 CEST (01:30 UTC), so at
    # 03:10 CEST it is still to come (it was passed over for the next day's).
    after_the_change = datetime(2026, 3, 29, 1, 10, tzinfo=UTC)
    slot = Schedule("30 2 * * *", "Europe/Amsterdam").next_after(after_the_change)
    assert slot == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)


def test_a_slot_the_clock_shows_after_a_change_may_fire_before_a_skipped_one() -> None:
    # Troll, 2026-03-29 01:00 UTC: 01:00 +00 jumps to 03:00 +02.  03:30 +02 is 01:30 UTC,
    # before the skipped 02:30, which fires at 02:30 UTC; and the evening before, 03:00 +02
    # (01:00 UTC) comes before the skipped 02:00 (02:00 UTC).
    troll = "Antarctica/Troll"
    at = datetime(2026, 3, 29, 1, 10, tzinfo=UTC)
    assert Schedule("30 2,3 * * *", troll).next_after(at) == datetime(
        2026, 3, 29, 1, 30, tzinfo=UTC
    )
    evening = datetime(2026, 3, 28, 21, 13, tzinfo=UTC)
    assert Schedule("0 2-3 * * *", troll).next_after(evening) == datetime(
        2026, 3, 29, 1, tzinfo=UTC
    )
    # Lord Howe, 2026-10-04: 02:00 +10:30 jumps to 02:30 +11 (15:30 UTC).  The skipped
    # 02:20 fires at 15:50 UTC, after 02:40 +11 (15:40 UTC); every slot fires once.
    lord_howe = "Australia/Lord_Howe"
    at = datetime(2026, 10, 3, 15, 35, tzinfo=UTC)
    assert Schedule("*/20 * * * *", lord_howe).next_after(at) == datetime(
        2026, 10, 3, 15, 40, tzinfo=UTC
    )
    window = Schedule("25,45 * * * *", lord_howe).slots(
        datetime(2026, 10, 3, 15, 29, tzinfo=UTC), datetime(2026, 10, 3, 16, 30, tzinfo=UTC)
    )
    assert [slot.strftime("%H:%M") for slot in window] == ["15:45", "15:55", "16:25"]


def test_an_instant_is_an_instant_whatever_its_zone() -> None:
    # Amsterdam, 2026-10-25: 02:40 (first, 00:40 UTC) comes before 02:30 (second, 01:30
    # UTC), though its wall time is later: the slot kept for the one is not the other's.
    amsterdam = Schedule("*/15 * * * *", "Europe/Amsterdam")
    second = datetime(2026, 10, 25, 2, 30, tzinfo=AMSTERDAM, fold=1)
    first = datetime(2026, 10, 25, 2, 40, tzinfo=AMSTERDAM, fold=0)
    assert amsterdam.next_after(second) == datetime(2026, 10, 25, 2, tzinfo=UTC)
    assert amsterdam.next_after(first) == datetime(2026, 10, 25, 0, 45, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "zone", "message"),
    [
        ("* * * *", "UTC", "5 fields"),
        ("* * * * * *", "UTC", "5 fields"),
        ("60 * * * *", "UTC", "maximum"),
        ("* 24 * * *", "UTC", "maximum"),
        ("* * 0 * *", "UTC", "minimum"),
        ("* * * 13 *", "UTC", "maximum"),
        ("* * * * 8", "UTC", "out of range"),
        ("* * * * 5-1", "UTC", "backwards"),
        ("* * * * funday", "UTC", "unknown day"),
        ("* * * smarch *", "UTC", "unknown month"),
        ("0 0 L * *", "UTC", "invalid day"),
        ("@daily", "UTC", "5 fields"),
        ("0 0 30 2 *", "UTC", "never fires"),
        ("* * * * *", "Mars/Olympus", "time zone"),
        ("* * * * *", "localtime", "time zone"),
    ],
)
def test_what_is_not_a_standard_schedule_is_refused(
    expression: str, zone: str, message: str
) -> None:
    with pytest.raises(ScheduleError, match=message):
        check(expression, zone)
