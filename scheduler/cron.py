"""The active scheduler's cron: APScheduler's asyncio scheduler, one job per active
scheduled trigger, mirrored from the database (DESIGN §5.7).

Each job wakes at its trigger's slots (:class:`~shared.triggers.schedule.ScheduleTrigger`)
and records what is due (:func:`shared.triggers.firing.fire_due`): jobs only enqueue.
:meth:`TriggerCron.sync` re-reads the triggers — when leadership is taken, on every
change the database notifies, and every ``SPAR_TRIGGER_POLL_S`` — adding, replacing and
removing jobs, and catching up any trigger with a slot due that no job recorded (missed
while no scheduler ran, or a job woken a moment early).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any
from uuid import UUID

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from scheduler.metrics import TRIGGER_SLOTS
from shared.db.base import utcnow
from shared.db.engine import Database
from shared.settings import Settings
from shared.triggers.firing import ScheduledTrigger, fire_due, scheduled_trigger, scheduled_triggers
from shared.triggers.schedule import ScheduleTrigger

log = logging.getLogger("spar.scheduler")
# A job woken this close before its slot waits for it rather than finding nothing due.
EARLY_WAKE = timedelta(seconds=2)


class TriggerCron:
    def __init__(self, database: Database, broker: Any, settings: Settings) -> None:
        self._database = database
        self._broker = broker
        self._grace = timedelta(seconds=settings.trigger_grace_s)
        self._second = settings.trigger_second
        self._scheduler: AsyncIOScheduler | None = None
        self._keys: dict[str, tuple[Any, ...]] = {}

    @property
    def running(self) -> bool:
        return self._scheduler is not None

    def jobs(self) -> dict[str, Any]:
        """Trigger id -> the next time its job wakes (what the scheduler mirrors now)."""
        if self._scheduler is None:
            return {}
        return {job.id: job.next_run_time for job in self._scheduler.get_jobs()}

    async def start(self) -> None:
        """Start the jobs (on taking leadership) and catch up what is due."""
        if self._scheduler is None:
            self._scheduler = AsyncIOScheduler(timezone="UTC")
            self._scheduler.start()
        await self.sync()

    def stop(self) -> None:
        """Stop every job (on losing leadership, or shutting down)."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
            self._keys.clear()

    async def sync(self) -> None:
        """Mirror the active scheduled triggers as jobs; fire what is due and unrecorded."""
        if self._scheduler is None:
            return
        async with self._database.transaction() as session:
            triggers = await scheduled_triggers(session, second=self._second)
        now = utcnow()
        wanted = {str(t.id): t for t in triggers}
        for job_id in set(self._keys) - set(wanted):
            with contextlib.suppress(JobLookupError):  # a job with no slot left ends itself
                self._scheduler.remove_job(job_id)
            del self._keys[job_id]
        for job_id, trigger in wanted.items():
            if self._keys.get(job_id) != trigger.key or self._scheduler.get_job(job_id) is None:
                self._scheduler.add_job(
                    self._fire,
                    ScheduleTrigger(trigger.schedule),
                    args=[trigger.id],
                    id=job_id,
                    name=f"trigger {job_id}",
                    replace_existing=True,
                    coalesce=True,  # a job late by several slots runs once; it fires them all
                    misfire_grace_time=None,  # a late job still runs: it reads what is due
                    max_instances=1,
                )
                self._keys[job_id] = trigger.key
            next_due = trigger.next_due()
            if next_due is not None and next_due <= now:
                await self._record(trigger)

    async def _fire(self, trigger_id: UUID) -> None:
        """The job: record the trigger's due slots, as the database sees them now."""
        try:
            async with self._database.transaction() as session:
                trigger = await scheduled_trigger(
                    session, trigger_id=trigger_id, second=self._second
                )
            if trigger is None:
                return  # paused or deleted since: the next sync drops the job
            next_due = trigger.next_due()
            if next_due is None:
                return
            early = (next_due - utcnow()).total_seconds()
            if 0 < early <= EARLY_WAKE.total_seconds():
                await asyncio.sleep(early)
            await self._record(trigger)
        except Exception:  # a failed firing must not end the job; the next sync retries
            log.exception("firing trigger %s failed", trigger_id)

    async def _record(self, trigger: ScheduledTrigger) -> None:
        async with self._database.transaction() as session:
            fired = await fire_due(
                session, trigger=trigger, now=utcnow(), grace=self._grace, broker=self._broker
            )
        TRIGGER_SLOTS.labels("queued").inc(len(fired.queued))
        TRIGGER_SLOTS.labels("missed").inc(fired.missed)
        if fired.queued or fired.missed:
            log.info(
                "trigger %s: %d slot(s) queued, %d missed",
                trigger.id,
                len(fired.queued),
                fired.missed,
            )
