"""When a scheduled trigger fires: standard 5-field cron in an IANA time zone, DST-correct.

APScheduler's :class:`~apscheduler.triggers.cron.CronTrigger` matches the fields; three
things it does differently from the cron every user knows are settled here:

* **Day of week.** Standard cron counts 0 (and 7) as Sunday, 1 as Monday; APScheduler
  counts 0 as Monday.  The day-of-week field is expanded here into day *names*, which
  both read alike (``1-5`` is ``mon,tue,wed,thu,fri``; ``*/2`` is ``sun,tue,thu,sat``).
* **Day of month OR day of week.** When both fields are restricted (neither starts with
  ``*``), standard cron fires on a day matching *either*; APScheduler would demand both.
  Such a schedule is the :class:`~apscheduler.triggers.combining.OrTrigger` of the two.
* **DST.** The fields are matched on the zone's wall clock (APScheduler runs on a naive
  clock, which has no DST), and each wall-clock slot is then placed in time once:
  a time the spring-forward gap skips fires at the same distance past the change (a
  02:30 slot on the day Amsterdam jumps from 02:00 to 03:00 fires at 03:30 CEST, once);
  a time the fall-back hour repeats fires at its first occurrence only.  A ``* * * * *``
  trigger therefore keeps firing every minute through the gap and pauses through the
  repeated hour, and no slot ever fires twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

from shared.schemas import iana_zones

FIELDS = ("minute", "hour", "day", "month", "day_of_week")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
# What each field may hold: numbers, names where cron has them, and * , - /.
_FIELD_SHAPE = {
    "minute": re.compile(r"^[\d*,/-]+$"),
    "hour": re.compile(r"^[\d*,/-]+$"),
    "day": re.compile(r"^[\d*,/-]+$"),
    "month": re.compile(r"^[\da-z*,/-]+$"),
    "day_of_week": re.compile(r"^[\da-z*,/-]+$"),
}
_DOW_ITEM = re.compile(r"^(?:(\*)|(\w+)(?:-(\w+))?)(?:/(\d+))?$")
# Slots looked at, at most, to find the next one that falls after a given instant (a
# fall-back hour repeats 60 minute slots; a schedule firing on 29 February rarely).
_SEARCH_LIMIT = 2000
# Longer than any change of a zone's clocks to come (two hours at most in the IANA database;
# in the past, Pacific/Kiritimati skipped a day in 1994).
_CHANGE = timedelta(hours=3)


class ScheduleError(ValueError):
    """A cron expression or time zone Spar cannot schedule; the message says why."""


def _day_number(token: str) -> int:
    if token.isdigit():
        value = int(token)
        if not 0 <= value <= 7:
            raise ScheduleError(f"day of week {token} is out of range 0-7 (0 and 7 are Sunday)")
        return value % 7
    if token[:3] in _DAY_NAMES and len(token) == 3:
        return _DAY_NAMES.index(token)
    raise ScheduleError(f"unknown day of week {token!r}")


def _days_of_week(field: str) -> str:
    """The standard day-of-week field as APScheduler day names, every day spelled out."""
    days: set[int] = set()
    for item in field.split(","):
        match = _DOW_ITEM.match(item)
        if match is None:
            raise ScheduleError(f"invalid day-of-week item {item!r}")
        star, first, last, step = match.groups()
        if star:
            low, high = 0, 6
        else:
            low = _day_number(first)
            # A range ending in 7 (Sunday) runs to the end of the week: 5-7 is fri,sat,sun.
            high = (7 if last == "7" else _day_number(last)) if last else low
            if last and high < low:
                raise ScheduleError(f"day-of-week range {item!r} runs backwards")
            if step and not last:
                high = 6
        stride = int(step) if step else 1
        if stride < 1:
            raise ScheduleError(f"step in {item!r} must be at least 1")
        days.update(day % 7 for day in range(low, high + 1, stride))
    # APScheduler's own order (mon first) keeps the expression readable in logs.
    return ",".join(_DAY_NAMES[d] for d in (1, 2, 3, 4, 5, 6, 0) if d in days)


def _month_field(field: str) -> str:
    for name in re.findall(r"[a-z]+", field):
        if name not in _MONTH_NAMES:
            raise ScheduleError(f"unknown month {name!r}")
    return field


def parse_cron(expression: str, *, second: str = "0") -> BaseTrigger:
    """The APScheduler trigger matching a standard 5-field cron ``expression`` on a naive
    (UTC, DST-free) wall clock; :class:`ScheduleError` if it is not one.  Slots fire at
    ``second`` of their minute: 0, as cron does, but for the failover drill's
    ``SPAR_TRIGGER_SECOND`` (``*/6`` makes ``* * * * *`` fire every six seconds)."""
    parts = expression.lower().split()
    if len(parts) != 5:
        raise ScheduleError(
            "cron_expression must have 5 fields: minute hour day-of-month month day-of-week"
        )
    values = dict(zip(FIELDS, parts, strict=True))
    for name, value in values.items():
        if not _FIELD_SHAPE[name].match(value):
            raise ScheduleError(f"invalid {name.replace('_', '-')} field {value!r}")
    values["day_of_week"] = _days_of_week(values["day_of_week"])
    values["month"] = _month_field(values["month"])
    values["second"] = second
    try:
        if not parts[2].startswith("*") and not parts[4].startswith("*"):
            by_day = CronTrigger(**{**values, "day_of_week": "*"}, timezone=UTC)
            by_weekday = CronTrigger(**{**values, "day": "*"}, timezone=UTC)
            return OrTrigger([by_day, by_weekday])
        return CronTrigger(**values, timezone=UTC)
    except ValueError as exc:
        raise ScheduleError(f"invalid cron_expression: {exc}") from None


def parse_zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Amsterdam``, ``UTC``)."""
    if name not in iana_zones():
        raise ScheduleError(f"unknown time zone {name!r}: use an IANA name like Europe/Amsterdam")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"unknown time zone {name!r}") from None


def _wall(instant: datetime, zone: tzinfo) -> datetime:
    """The zone's wall-clock reading at ``instant``, as a naive clock (labelled UTC)."""
    return instant.astimezone(zone).replace(tzinfo=UTC)


def _skipped(wall: datetime, placed: datetime, zone: tzinfo) -> bool:
    """Whether the zone's clock never reads ``wall`` (a time in an hour the clocks skip),
    given where it is ``placed`` (:func:`_placed`)."""
    return _wall(placed, zone) != wall


def _placed(wall: datetime, zone: tzinfo) -> datetime:
    """The instant a wall-clock slot fires: its first occurrence when the hour repeats;
    as far past the change as it lies into a gap when the hour is skipped (zoneinfo reads
    a skipped time with the offset from before the change)."""
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


class Schedule:
    """A cron expression in a time zone: its slots as UTC instants."""

    def __init__(self, expression: str, timezone: str, *, second: str = "0") -> None:
        self.expression = expression
        self.timezone = timezone
        self._cron = parse_cron(expression, second=second)
        self._zone = parse_zone(timezone)
        # The last answer, (instant, its slot): the same slot answers every instant from
        # that one until the slot itself, since none lies between (a trigger's body shows
        # its next slot, and a listing's page asks again on every read).
        self._last: tuple[datetime, datetime] | None = None

    def next_after(self, instant: datetime) -> datetime | None:
        """The first slot strictly after ``instant`` (aware), or ``None`` if none comes."""
        instant = instant.astimezone(UTC)  # compared as instants, whatever zone it came in
        last = self._last  # read once: another thread may replace it meanwhile
        if last is not None and last[0] <= instant < last[1]:
            return last[1]
        slot = self._first_after(_wall(instant, self._zone), instant)
        # Up to as long after the clocks went forward as they skipped, a slot of the
        # skipped time may still be to come (it fires as far past the change as it lay in
        # it, :func:`_placed`) while the clock already reads past it: the first slot after
        # the reading the clock would show had it not moved.
        before = _wall(instant - _CHANGE, self._zone) + _CHANGE
        if _skipped(before, _placed(before, self._zone), self._zone):
            wall = self._cron.get_next_fire_time(None, before + timedelta(microseconds=1))
            if wall is not None:
                placed = _placed(wall, self._zone)
                earlier = slot is None or placed < slot
                if _skipped(wall, placed, self._zone) and placed > instant and earlier:
                    slot = placed
        if slot is not None:
            self._last = (instant, slot)
        return slot

    def _first_after(self, wall: datetime, instant: datetime) -> datetime | None:
        """The first slot after ``instant`` among the wall times after ``wall``.  Slots fire
        in the order of their wall times, but for those the clocks skip (placed by the
        offset before the change): a slot at a later time the clock shows may fire before
        one of them, so the search goes on past them to the first such slot."""
        found = None
        for _ in range(_SEARCH_LIMIT):
            wall = self._cron.get_next_fire_time(None, wall + timedelta(microseconds=1))
            if wall is None:
                return found
            placed = _placed(wall, self._zone)
            if placed <= instant:  # a repeated hour's slots already fired the first time
                continue
            if found is None or placed < found:
                found = placed
            if not _skipped(wall, placed, self._zone):
                return found
        return found

    def slots(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Every slot in ``(after, until]``, oldest first."""
        slot = self.next_after(after)
        while slot is not None and slot <= until:
            yield slot
            slot = self.next_after(slot)


def check(expression: str, timezone: str, *, now: datetime | None = None) -> Schedule:
    """The schedule, checked to fire at least once in the future."""
    schedule = Schedule(expression, timezone)
    if schedule.next_after(now or datetime.now(UTC)) is None:
        raise ScheduleError(f"cron_expression {expression!r} never fires")
    return schedule


class ScheduleTrigger(BaseTrigger):
    """A :class:`Schedule` as an APScheduler trigger: the scheduler wakes the job at each
    slot (the job itself reads, from the database, which slots are due)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        after = now - timedelta(microseconds=1)
        if previous_fire_time is not None:
            after = max(after, previous_fire_time)
        return self.schedule.next_after(after)

    def __str__(self) -> str:
        return f"cron[{self.schedule.expression!r} in {self.schedule.timezone}]"
