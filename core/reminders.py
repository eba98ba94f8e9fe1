"""Reminders: due occurrences claimed in PostgreSQL, built (plain or by an agent turn), sent with retries."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from core import recurrence as rec_mod
from core.db import Pool
from core.timeutil import Clock, fmt_local, zone
from core.types import Incoming

log = logging.getLogger(__name__)

BUTTONS = ("done", "snooze10", "snooze60")
SNOOZE = {"snooze10": timedelta(minutes=10), "snooze60": timedelta(hours=1)}
OPEN = ("pending", "in_progress")

_CLAIM_SQL = """
WITH claimed AS (
    INSERT INTO occurrences (task_id, scheduled_at, claimed_by, lease_until, late)
    SELECT t.id, t.due_at, $1, $2::timestamptz + $5::interval, $2::timestamptz - t.due_at > $4::interval
    FROM tasks t
    WHERE t.status IN ('pending', 'in_progress') AND t.due_at <= $2 AND t.due_at >= $2::timestamptz - $6::interval
      AND t.chat_id IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM occurrences o WHERE o.task_id = t.id AND o.scheduled_at = t.due_at
          AND (o.status <> 'claimed' OR o.lease_until > $2))
    ORDER BY t.due_at
    LIMIT $3
    ON CONFLICT (task_id, scheduled_at) DO UPDATE
        SET claimed_by = EXCLUDED.claimed_by, lease_until = EXCLUDED.lease_until,
            attempts = occurrences.attempts + 1, late = EXCLUDED.late
        WHERE occurrences.status = 'claimed' AND occurrences.lease_until <= $2
    RETURNING task_id, scheduled_at, late
)
SELECT c.task_id, c.scheduled_at, c.late, t.title, t.details, t.kind, t.agent_prompt, t.recurrence,
       t.timezone AS task_tz, u.platform_user_id, u.display_name, u.timezone AS user_tz,
       ch.platform, ch.platform_chat_id, ch.thread_id, ch.kind AS chat_kind
FROM claimed c
JOIN tasks t ON t.id = c.task_id
JOIN users u ON u.id = t.user_id
JOIN chats ch ON ch.id = t.chat_id
"""

_STALE_SQL = """
SELECT t.id, t.due_at, t.recurrence, t.timezone AS task_tz, u.timezone AS user_tz
FROM tasks t JOIN users u ON u.id = t.user_id
WHERE t.status IN ('pending', 'in_progress') AND t.due_at < $1::timestamptz - $2::interval
  AND NOT EXISTS (SELECT 1 FROM occurrences o WHERE o.task_id = t.id AND o.scheduled_at = t.due_at)
LIMIT $3
"""

_DELIVERED_SQL = """
WITH d AS (
    SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::text[],
                         $6::timestamptz[]) AS d(task_id, scheduled_at, ran_at, delivered_at, message_id, next_due)
), o AS (
    UPDATE occurrences o SET status = 'delivered', ran_at = d.ran_at, delivered_at = d.delivered_at,
        platform_message_id = d.message_id, error = NULL
    FROM d WHERE o.task_id = d.task_id AND o.scheduled_at = d.scheduled_at
)
UPDATE tasks t SET due_at = d.next_due, updated_at = now()
FROM d WHERE t.id = d.task_id AND t.due_at = d.scheduled_at AND d.next_due IS NOT NULL
"""


@dataclass(frozen=True)
class ReminderMessage:
    """A reminder ready for an adapter: where, whose, what (Markdown), and its buttons."""

    task_id: int
    scheduled_at: datetime
    platform: str
    chat_id: str
    thread_id: str
    chat_kind: str
    owner_id: str
    owner_name: str
    text: str
    buttons: tuple[str, ...] = BUTTONS


class DeliveryRefused(Exception):
    """A permanent refusal (bot blocked, chat gone, no access): the occurrence ends as failed with this reason.

    Adapters raise it from `send_reminder`; any other exception counts as transient and is retried."""


class Outbox(Protocol):
    """What the engine needs from an adapter: send a reminder, return the platform message id."""

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Deliver one reminder: raise DeliveryRefused for a permanent refusal, anything else when transient."""
        ...


AgentRunner = Callable[[Incoming], Awaitable[str | None]]
Sleep = Callable[[float], Awaitable[None]]


def plain_text(title: str, details: str, scheduled: datetime, tz_name: str, late: bool, now: datetime) -> str:
    """`⏰ Buy milk — due 09:00` (or `was due Sat 22 Nov 09:00` when late): fixed text, no LLM."""
    tz = zone(tz_name)
    local = scheduled.astimezone(tz)
    same_day = local.date() == now.astimezone(tz).date()
    when = local.strftime("%H:%M") if same_day else fmt_local(scheduled, tz, now)
    text = f"⏰ {title} — {'was due' if late else 'due'} {when}"
    return f"{text}\n{details}" if details else text


def next_due(row: Any, after: datetime, start: datetime) -> datetime | None:
    """A recurring task's next occurrence strictly after `after` (None for a one-shot task)."""
    rec = rec_mod.from_json(row["recurrence"])
    if rec is None:
        return None
    tz = zone(row["task_tz"] or row["user_tz"])
    times = rec_mod.next_times(rec, tz, after, start, count=1)
    return times[0] if times else None


def latest_missed(row: Any, now: datetime) -> datetime:
    """For a recurring task behind schedule, its latest occurrence not after `now`."""
    rec = rec_mod.from_json(row["recurrence"])
    scheduled: datetime = row["scheduled_at"]
    if rec is None:
        return scheduled
    tz = zone(row["task_tz"] or row["user_tz"])
    latest = scheduled
    for t in rec_mod.next_times(rec, tz, scheduled, scheduled, count=500):
        if t > now:
            break
        latest = t
    return latest


@dataclass
class ReminderEngine:
    """Finds due occurrences, claims them (exactly once across processes), builds and sends them."""

    pool: Pool
    outboxes: Mapping[str, Outbox]
    clock: Clock
    agent: AgentRunner | None = None
    lease: timedelta = timedelta(minutes=2)
    grace: timedelta = timedelta(hours=24)
    late_after: timedelta = timedelta(seconds=60)
    batch: int = 500
    send_attempts: int = 4
    backoff_s: float = 1.0
    sleep: Sleep = asyncio.sleep
    concurrency: int = 64
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}")
    failed_deliveries: int = 0
    on_failure: Callable[[], None] | None = None

    async def tick(self, *, include_stale: bool = True) -> int:
        """Deliver everything due now (repeating until nothing is left to claim); returns how many."""
        delivered = 0
        if include_stale:
            await self.skip_stale()
        while True:
            now = self.clock()
            rows = await self.pool.fetch(
                _CLAIM_SQL, self.instance, now, self.batch, self.late_after, self.lease, self.grace
            )
            if not rows:
                return delivered
            delivered += await self._deliver_batch(rows)
            if len(rows) < self.batch:
                return delivered

    async def skip_stale(self) -> None:
        """Occurrences older than the grace window are not sent: recorded as skipped, series moved on."""
        now = self.clock()
        rows = await self.pool.fetch(_STALE_SQL, now, self.grace, self.batch)
        for r in rows:
            nxt = next_due(r, now, r["due_at"])
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO occurrences (task_id, scheduled_at, status, error) VALUES ($1, $2, 'skipped',"
                    " 'older than the grace window') ON CONFLICT DO NOTHING",
                    r["id"], r["due_at"],
                )  # fmt: skip
                if nxt is not None:
                    await conn.execute(
                        "UPDATE tasks SET due_at = $2 WHERE id = $1 AND due_at = $3", r["id"], nxt, r["due_at"]
                    )

    async def _deliver_batch(self, rows: Sequence[Any]) -> int:
        """Send claimed occurrences concurrently, then record the outcomes in two statements."""
        gate = asyncio.Semaphore(self.concurrency)

        async def one(row: Any) -> tuple[Any, datetime, str | None, str | None]:
            async with gate:
                return await self._deliver(row)

        results = await asyncio.gather(*(one(r) for r in rows))
        ok = [(r, ran, mid) for r, ran, mid, error in results if error is None]
        failed = [(r, error) for r, _, _, error in results if error is not None]
        now = self.clock()
        if ok:
            await self.pool.execute(
                _DELIVERED_SQL,
                [r["task_id"] for r, _, _ in ok],
                [r["scheduled_at"] for r, _, _ in ok],
                [ran for _, ran, _ in ok],
                [now] * len(ok),
                [mid for _, _, mid in ok],
                [next_due(r, max(now, r["scheduled_at"]), r["scheduled_at"]) for r, _, _ in ok],
            )
        for r, error in failed:
            self.failed_deliveries += 1
            if self.on_failure:
                self.on_failure()
            log.error("reminder for task %s at %s could not be delivered: %s", r["task_id"], r["scheduled_at"], error)
            nxt = next_due(r, max(now, r["scheduled_at"]), r["scheduled_at"])
            await self.pool.execute(
                "WITH o AS (UPDATE occurrences SET status = 'failed', error = $3"
                " WHERE task_id = $1 AND scheduled_at = $2)"
                " UPDATE tasks SET due_at = $4 WHERE id = $1 AND due_at = $2 AND $4::timestamptz IS NOT NULL",
                r["task_id"], r["scheduled_at"], error[:500], nxt,
            )  # fmt: skip
        return len(ok)

    async def _deliver(self, row: Any) -> tuple[Any, datetime, str | None, str | None]:
        """Build and send one occurrence; returns (row, ran_at, message id, error or None)."""
        now = self.clock()
        shown = latest_missed(row, now)
        late = bool(row["late"]) or now - shown > self.late_after
        tz_name = row["user_tz"] or row["task_tz"] or "UTC"
        text = plain_text(row["title"], row["details"] or "", shown, tz_name, late, now)
        if row["kind"] == "agent" and self.agent is not None:
            text = await self._agent_text(row, shown, text)
        ran_at = self.clock()
        msg = ReminderMessage(
            task_id=row["task_id"], scheduled_at=row["scheduled_at"], platform=row["platform"],
            chat_id=row["platform_chat_id"], thread_id=row["thread_id"], chat_kind=row["chat_kind"],
            owner_id=row["platform_user_id"], owner_name=row["display_name"], text=text,
        )  # fmt: skip
        outbox = self.outboxes.get(row["platform"])
        if outbox is None:
            return row, ran_at, None, f"no {row['platform']} adapter is running"
        error = "not sent"
        for attempt in range(self.send_attempts):
            try:
                return row, ran_at, await outbox.send_reminder(msg), None
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                log.warning("sending reminder %s failed (attempt %d): %s", row["task_id"], attempt + 1, error)
                if attempt + 1 < self.send_attempts:
                    await self.sleep(self.backoff_s * 2**attempt)
        return row, ran_at, None, error

    async def _agent_text(self, row: Any, shown: datetime, fallback: str) -> str:
        """Run the agent job's turn; the plain text when the LLM fails, so nothing is lost."""
        assert self.agent is not None
        prompt = row["agent_prompt"] or row["title"]
        inc = Incoming(
            platform=row["platform"], user_id=row["platform_user_id"], chat_id=row["platform_chat_id"],
            thread_id=row["thread_id"], chat_kind=row["chat_kind"], user_name=row["display_name"],
            text=f"[scheduled job: {row['title']}] {prompt}",
            message_id=f"job:{row['task_id']}:{shown.isoformat()}",
        )  # fmt: skip
        try:
            answer = await self.agent(inc)
        except Exception:
            log.exception("agent job %s failed", row["task_id"])
            answer = None
        return f"⏰ {row['title']}\n\n{answer}" if answer else fallback

    async def upcoming_times(self, horizon: timedelta, limit: int = 20000) -> list[datetime]:
        """Distinct due times of open tasks within the horizon (for precise date jobs)."""
        now = self.clock()
        rows = await self.pool.fetch(
            "SELECT DISTINCT due_at FROM tasks WHERE status IN ('pending', 'in_progress') AND due_at > $1"
            " AND due_at <= $2 ORDER BY due_at LIMIT $3",
            now, now + horizon, limit,
        )  # fmt: skip
        return [r["due_at"] for r in rows]


async def press(
    pool: Pool, clock: Clock, *, platform: str, presser_id: str, task_id: int, action: str, default_tz: str = "UTC"
) -> tuple[bool, str]:
    """A reminder button: only the task's owner may press; Done ends a series, Snooze moves it."""
    row = await pool.fetchrow(
        "SELECT t.id, t.title, t.status, t.recurrence, u.timezone FROM tasks t JOIN users u ON u.id = t.user_id"
        " WHERE t.id = $1 AND u.platform = $2 AND u.platform_user_id = $3",
        task_id, platform, presser_id,
    )  # fmt: skip
    if row is None:
        return False, "Only the person this reminder is for can use these buttons."
    if action == "done":
        await pool.execute("UPDATE tasks SET status = 'done', updated_at = now() WHERE id = $1", task_id)
        return True, f"✅ Done: {row['title']}"
    if action in SNOOZE:
        until = clock() + SNOOZE[action]
        await pool.execute(
            "UPDATE tasks SET due_at = $2, status = 'pending', updated_at = now() WHERE id = $1", task_id, until
        )
        tz = zone(row["timezone"], default_tz)
        return True, f"😴 Snoozed: {row['title']} — until {until.astimezone(tz):%H:%M}"
    return False, "Unknown button."


class ReminderScheduler:
    """APScheduler wiring: a date job per upcoming due time (about a second precise) and an interval sweep.

    Date jobs only wake the engine: a job that fires while a tick runs asks for one more tick instead of
    queueing, so thousands of due times in a minute cost a handful of claim queries, not thousands."""

    def __init__(
        self, engine: ReminderEngine, *, sweep_s: float = 30.0, horizon: timedelta | None = None,
        max_planned: int = 20000,
    ) -> None:  # fmt: skip
        """Wrap an engine; nothing runs until start()."""
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        self.engine = engine
        self.sweep_s = sweep_s
        self.horizon = horizon or timedelta(seconds=sweep_s * 2)
        self.max_planned = max_planned
        self.scheduler = AsyncIOScheduler(timezone="UTC")
        self._planned: set[datetime] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self._again = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._stopped = False

    async def start(self) -> None:
        """Catch up on anything missed (downtime), then run the sweep and plan date jobs."""
        self.scheduler.start()
        self.scheduler.add_job(self.sweep, "interval", seconds=self.sweep_s, id="sweep", max_instances=1,
                               coalesce=True)  # fmt: skip
        await self.sweep()

    async def stop(self) -> None:
        """Stop firing jobs and wait for a running tick to finish (none starts afterwards)."""
        self._stopped = True
        self.scheduler.shutdown(wait=False)
        for task in list(self._tasks):
            task.cancel()
        await self._idle.wait()

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
                try:
                    await self.engine.tick(include_stale=False)
                except Exception:
                    log.exception("reminder tick failed")
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
            self.scheduler.add_job(self.wake, DateTrigger(run_date=when), id=f"due:{when.isoformat()}",
                                   replace_existing=True, misfire_grace_time=None)  # fmt: skip

    def tasks_changed(self) -> None:
        """A task was created or moved: plan its date job now, not at the next sweep."""
        if self._stopped:
            return
        task = asyncio.get_running_loop().create_task(self.plan())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
