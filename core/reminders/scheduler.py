"""APScheduler wiring for the reminder engine: date jobs per due time, and a sweep."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from core.constants import REMINDER_MAX_PLANNED, REMINDER_SWEEP_S
from core.reminders.engine import ReminderEngine

log = logging.getLogger(__name__)


class ReminderScheduler:
    """APScheduler wiring: a date job per upcoming due time or retry (about a second precise) and a sweep.

    Date jobs only wake the engine: a job that fires while a tick runs asks for one more tick instead of
    queueing, so thousands of due times in a minute cost a handful of claim queries, not thousands."""

    def __init__(
        self,
        engine: ReminderEngine,
        *,
        sweep_s: float = REMINDER_SWEEP_S,
        horizon: timedelta | None = None,
        max_planned: int = REMINDER_MAX_PLANNED,
    ) -> None:
        """Wrap an engine (date jobs up to `horizon` ahead, twice the sweep by default); nothing runs until start()."""
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        self.engine = engine
        self.sweep_s = sweep_s
        self.horizon = horizon or timedelta(seconds=sweep_s * 2)
        self.max_planned = max_planned
        self.scheduler = AsyncIOScheduler(timezone="UTC")
        self._planned: set[datetime] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._firing: set[asyncio.Task[Any]] = set()  # APScheduler jobs running now
        self._running = False
        self._again = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False

    async def start(self) -> None:
        """Catch up on anything missed (downtime), then run the sweep and plan date jobs."""
        self.scheduler.start()
        self.scheduler.add_job(
            self._job, "interval", [self.sweep], seconds=self.sweep_s, id="sweep", max_instances=1, coalesce=True
        )
        await self.sweep()

    async def stop(self, grace: float | None = None) -> None:
        """Stop firing jobs and wait for a running tick to finish (none starts afterwards).

        A send still running after `grace` seconds is cut: its claim stays, so it is retried after the lease."""
        self._stopped = True
        self.scheduler.pause()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0)  # jobs fired just before the pause register themselves in _firing
        if self._firing:
            _, late = await asyncio.wait(set(self._firing), timeout=grace)
            for task in late:
                task.cancel()
            if late:
                log.warning("%d reminder round(s) cut at shutdown after %g s", len(late), grace)
                await asyncio.gather(*late, return_exceptions=True)
        await self._idle.wait()
        self.scheduler.shutdown(wait=False)  # would cancel the jobs still running: there are none
        await self.engine.close()

    async def _job(self, run: Callable[[], Awaitable[None]]) -> None:
        """An APScheduler job (sweep or wake), which stop() waits for instead of cancelling it mid-send."""
        task = asyncio.current_task()
        assert task is not None
        self._firing.add(task)
        try:
            await run()
        except asyncio.CancelledError:
            if not self._stopped:
                raise
            # cut by stop() (which said so once): not a failure for APScheduler to log with a traceback
        finally:
            self._firing.discard(task)

    async def sweep(self) -> None:
        """The interval job: skip stale occurrences, deliver what is due, plan the next date jobs."""
        if self._stopped:
            return
        try:
            await self.engine.skip_stale()
        except Exception:
            log.exception("skipping stale reminders failed")
        await self.wake()
        await self.plan()

    async def wake(self) -> None:
        """Deliver what is due now; if already delivering, make the running loop tick once more."""
        if self._running:
            self._again = True
            return
        self._running = True
        self._idle.clear()
        try:
            while not self._stopped:
                self._again = False
                retries = self.engine.retries
                try:
                    await self.engine.tick(include_stale=False)
                except Exception:
                    log.exception("reminder tick failed")
                if self.engine.retries != retries:
                    await self.plan()  # date jobs for the next attempts
                if not self._again:
                    break
        finally:
            self._running = False
            self._idle.set()

    async def plan(self) -> None:
        """A date job for each distinct due time within the horizon that has none yet."""
        from apscheduler.triggers.date import DateTrigger

        if self._stopped:
            return
        try:
            times = await self.engine.upcoming_times(self.horizon, self.max_planned)
        except Exception:
            log.exception("planning reminders failed")
            return
        now = self.engine.clock()
        self._planned = {t for t in self._planned if t > now}
        for when in times:
            if when in self._planned:
                continue
            self._planned.add(when)
            due = DateTrigger(run_date=when)
            job_id = f"due:{when.isoformat()}"
            self.scheduler.add_job(
                self._job, due, [self.wake], id=job_id, replace_existing=True, misfire_grace_time=None
            )

    def tasks_changed(self) -> None:
        """A task was created or moved: plan its date job now, not at the next sweep."""
        if self._stopped:
            return
        task = asyncio.get_running_loop().create_task(self.plan())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
