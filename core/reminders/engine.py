"""Reminders: due occurrences claimed in PostgreSQL, built (plain or by an agent turn), sent with retries."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol

from core.constants import (
    REMINDER_AGENT_RUNS,
    REMINDER_BATCH,
    REMINDER_ERROR_CHARS,
    REMINDER_LATE_AFTER,
    REMINDER_LEASE,
    REMINDER_RETRY_FIRST,
    REMINDER_RETRY_MAX,
    REMINDER_SENDS,
)
from core.metrics import Metrics
from core.quoting import quoted
from core.reminders import recurrence
from core.reminders.buttons import BUTTONS
from core.storage.db import Pool, retry_dropped
from core.timeutil import Clock, fmt_local, zone
from core.types import JOB_MESSAGE_PREFIX, Incoming, Quoted

log = logging.getLogger(__name__)

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
    RETURNING task_id, scheduled_at, late, attempts, sent_parts, sent_text
)
SELECT c.task_id, c.scheduled_at, c.late, c.attempts, t.title, t.details, t.kind, t.agent_prompt, t.own_words,
       t.recurrence,
       t.timezone AS task_tz, u.platform_user_id, u.display_name, u.timezone AS user_tz,
       ch.platform, ch.platform_chat_id, ch.thread_id, ch.kind AS chat_kind,
       c.sent_parts, c.sent_text
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

# Occurrences still waiting for a retry when their grace window has passed (no live process holds them).
_EXPIRED_SQL = """
SELECT o.task_id, o.scheduled_at, o.error, t.recurrence, t.timezone AS task_tz, u.timezone AS user_tz,
       t.due_at IS DISTINCT FROM o.scheduled_at OR t.status NOT IN ('pending', 'in_progress') AS superseded
FROM occurrences o JOIN tasks t ON t.id = o.task_id JOIN users u ON u.id = t.user_id
WHERE o.status = 'claimed' AND o.lease_until <= $1 AND o.scheduled_at < $1::timestamptz - $2::interval
LIMIT $3
"""

_DELIVERED_SQL = """
WITH d AS (
    SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::text[],
                         $6::timestamptz[]) AS d(task_id, scheduled_at, ran_at, delivered_at, message_id, next_due)
), o AS (
    UPDATE occurrences o SET status = 'delivered', ran_at = d.ran_at, delivered_at = d.delivered_at,
        platform_message_id = d.message_id, error = NULL, sent_text = NULL
    FROM d WHERE o.task_id = d.task_id AND o.scheduled_at = d.scheduled_at AND o.status = 'claimed'
)
UPDATE tasks t SET due_at = d.next_due, updated_at = now()
FROM d WHERE t.id = d.task_id AND t.due_at = d.scheduled_at AND d.next_due IS NOT NULL
"""
Delivered = tuple[int, datetime, datetime, datetime, str | None, datetime | None]

_ENDED_SQL = """
WITH o AS (
    UPDATE occurrences SET status = $3, error = $4, sent_text = NULL
    WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed'
)
UPDATE tasks SET due_at = $5, updated_at = now() WHERE id = $1 AND due_at = $2 AND $5::timestamptz IS NOT NULL
"""

_RETRY_SQL = """
UPDATE occurrences SET lease_until = $3, error = $4
WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed' AND claimed_by = $5
"""

# The platform accepted the first $3 parts of this text (whoever holds the claim now: it is a fact either way).
_PART_SENT_SQL = """
UPDATE occurrences SET sent_parts = greatest(sent_parts, $3), sent_text = coalesce(sent_text, $4)
WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed'
"""

_RENEW_SQL = """
UPDATE occurrences o SET lease_until = $4
FROM unnest($1::bigint[], $2::timestamptz[]) AS k(task_id, scheduled_at)
WHERE o.task_id = k.task_id AND o.scheduled_at = k.scheduled_at AND o.claimed_by = $3 AND o.status = 'claimed'
"""

# Open cron tasks whose next time was computed in another zone than their owner's current one.
_MOVED_ZONE_SQL = """
SELECT t.id, t.due_at, t.recurrence, coalesce(u.timezone, $2, t.timezone) AS tz
FROM tasks t JOIN users u ON u.id = t.user_id
WHERE t.status IN ('pending', 'in_progress') AND t.due_at > $1 AND t.recurrence->>'kind' = 'cron'
  AND t.timezone IS DISTINCT FROM coalesce(u.timezone, $2, t.timezone) AND ($3::bigint IS NULL OR t.user_id = $3)
LIMIT $4
"""

SUPERSEDED = "the task changed before this reminder could be delivered"
Key = tuple[int, datetime]
PartsSent = Callable[[int], Awaitable[None]]


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
    sent_parts: int = 0  # a retry: the platform already has this many of its parts; send only the rest
    on_sent: PartsSent | None = field(default=None, repr=False, compare=False)

    async def mark_sent(self, parts: int) -> None:
        """Adapters call this right after the platform accepted the first `parts` parts (best effort, never raises:
        a failure only risks sending a part twice)."""
        if self.on_sent is not None:
            await self.on_sent(parts)


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


def zone_name(row: Any, default_tz: str | None) -> str:
    """The owner's current zone: theirs, else the bot's default, else the zone the task was set in."""
    return str(row["user_tz"] or default_tz or row["task_tz"] or "UTC")


def next_due(row: Any, after: datetime, start: datetime, default_tz: str | None = None) -> datetime | None:
    """A recurring task's next occurrence strictly after `after` (None for a one-shot task)."""
    rec = recurrence.from_json(row["recurrence"])
    if rec is None:
        return None
    times = recurrence.next_times(rec, zone(zone_name(row, default_tz)), after, start, count=1)
    return times[0] if times else None


def latest_missed(row: Any, now: datetime, default_tz: str | None = None) -> datetime:
    """For a recurring task behind schedule, its latest occurrence not after `now` (bounded work)."""
    rec = recurrence.from_json(row["recurrence"])
    scheduled: datetime = row["scheduled_at"]
    if rec is None:
        return scheduled
    latest = recurrence.latest_time(rec, zone(zone_name(row, default_tz)), scheduled, now)
    return latest if latest is not None and latest > scheduled else scheduled


def span_text(span: timedelta) -> str:
    """A grace window as `24 h`, `1.5 h`, `90 min` or `30 s`."""
    s = span.total_seconds()
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    return f"{s / 60:.3g} min" if s >= 60 else f"{s:.3g} s"


@dataclass
class ReminderEngine:
    """Finds due occurrences, claims them (exactly once across processes), builds and sends them.

    A transient send failure keeps the occurrence claimed with its lease moved to the next attempt (growing
    backoff, recorded in PostgreSQL) until it is delivered or its grace window ends; only DeliveryRefused ends
    it at once as failed. Claims held by this process have their leases renewed while they are being sent."""

    pool: Pool
    outboxes: Mapping[str, Outbox]
    clock: Clock
    agent: AgentRunner | None = None
    lease: timedelta = REMINDER_LEASE
    grace: timedelta = timedelta(hours=24)
    late_after: timedelta = REMINDER_LATE_AFTER
    batch: int = REMINDER_BATCH
    retry_first: timedelta = REMINDER_RETRY_FIRST
    retry_max: timedelta = REMINDER_RETRY_MAX
    sleep: Sleep = asyncio.sleep  # waits between lease renewals
    concurrency: int = REMINDER_SENDS
    agent_concurrency: int = REMINDER_AGENT_RUNS
    default_tz: str | None = None  # DEFAULT_TIMEZONE; None: the zone the task was set in
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}")
    failed_deliveries: int = 0
    retries: int = 0  # transient failures recorded for a later attempt
    on_failure: Callable[[], None] | None = None
    metrics: Metrics = field(default_factory=Metrics)  # the process's (bot/ passes the Core's)
    _held: dict[Key, int] = field(default_factory=dict, init=False, repr=False)
    _keeper: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _jobs: set[asyncio.Task[bool]] = field(default_factory=set, init=False, repr=False)
    _gates: dict[str, asyncio.Semaphore] = field(default_factory=dict, init=False, repr=False)
    _recorded: list[tuple[Delivered, asyncio.Future[None]]] = field(default_factory=list, init=False, repr=False)
    _recorder: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def tick(self, *, include_stale: bool = True) -> int:
        """Send everything due now (claiming until nothing is left); returns how many plain reminders went out.

        Agent jobs are started as their own tasks and not waited for (see `drain`)."""
        delivered = 0
        if include_stale:
            await self.skip_stale()
        while True:
            now = self.clock()
            claim = partial(
                self.pool.fetch, _CLAIM_SQL, self.instance, now, self.batch, self.late_after, self.lease, self.grace
            )
            rows = await retry_dropped(claim, "reminder claim", pool=self.pool)
            if not rows:
                return delivered
            self._hold([(r["task_id"], r["scheduled_at"]) for r in rows])
            plain = []
            for r in rows:
                if r["kind"] == "agent" and self.agent is not None and r["sent_text"] is None:
                    job = asyncio.get_running_loop().create_task(self._job(r))
                    self._jobs.add(job)
                    job.add_done_callback(self._jobs.discard)
                else:
                    plain.append(r)
            delivered += sum(await asyncio.gather(*(self._plain(r) for r in plain)))
            if len(rows) < self.batch:
                return delivered

    async def drain(self) -> int:
        """Wait for the agent jobs started so far; returns how many of them were delivered."""
        done, seen = 0, set[asyncio.Task[bool]]()
        while pending := self._jobs - seen:
            seen |= pending
            done += sum(await asyncio.gather(*pending))
        return done

    async def close(self) -> None:
        """Stop running agent jobs and lease renewal; their claims are left for a retry after the lease."""
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*list(self._jobs), return_exceptions=True)
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        self._held.clear()

    async def skip_stale(self) -> None:
        """End what the grace window has passed: never-tried ones as skipped, ones still retrying as failed."""
        now = self.clock()
        rows = await self.pool.fetch(_STALE_SQL, now, self.grace, self.batch)
        for r in rows:
            nxt = next_due(r, now, r["due_at"], self.default_tz)
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
        for r in await self.pool.fetch(_EXPIRED_SQL, now, self.grace, self.batch):
            if r["superseded"]:
                await self._end(r, "skipped", SUPERSEDED, count=False)
            else:
                await self._end(r, "failed", f"not delivered within {span_text(self.grace)} (last error: {r['error']})")
        await self.follow_zones()

    async def follow_zones(self, user_id: int | None = None) -> int:
        """Recompute the next time of cron tasks whose owner changed zone (a daily 09:00 follows them)."""
        now = self.clock()
        return await replan_zones(self.pool, now, self.default_tz, user_id, self.batch)

    def _gate(self, name: str, size: int) -> asyncio.Semaphore:
        """A semaphore created on the running loop (sends, agent jobs)."""
        if name not in self._gates:
            self._gates[name] = asyncio.Semaphore(size)
        return self._gates[name]

    def _hold(self, keys: Sequence[Key]) -> None:
        """These claims are ours until their outcome is recorded: keep renewing their leases."""
        for k in keys:
            self._held[k] = self._held.get(k, 0) + 1
        if self._held and self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def _release(self, key: Key) -> None:
        """The outcome of this claim is recorded; stop renewal when nothing is held."""
        left = self._held.get(key, 1) - 1
        if left > 0:
            self._held[key] = left
        else:
            self._held.pop(key, None)
        if not self._held and self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None

    async def _keep(self) -> None:
        """Every third of a lease, push the leases of all held claims one lease ahead."""
        while self._held:
            await self.sleep(self.lease.total_seconds() / 3)
            keys = list(self._held)
            if not keys:
                return
            try:
                renew = partial(self.pool.execute, _RENEW_SQL, [k[0] for k in keys], [k[1] for k in keys],
                                self.instance, self.clock() + self.lease)  # fmt: skip
                await retry_dropped(renew, "reminder lease renewal", pool=self.pool)
            except Exception as e:
                log.warning("renewing %d reminder leases failed: %s", len(keys), e)

    async def _plain(self, row: Any) -> bool:
        """Build and send a plain reminder (fixed text, no LLM); a retry of one partly sent keeps its text."""
        now = self.clock()
        return await self._send(row, row["sent_text"] or self._text(row, now), now)

    async def _job(self, row: Any) -> bool:
        """An agent job: run its turn (bounded concurrency), keep its answer for a retry, then send it."""
        key: Key = (row["task_id"], row["scheduled_at"])
        try:
            async with self._gate("agent", self.agent_concurrency):
                now = self.clock()
                text = await self._agent_text(row, latest_missed(row, now, self.default_tz), self._text(row, now))
            # a retry sends this answer (its turn is stored and would not run twice), not the plain fallback
            await self._parts_sent(key, text, 0)
        except asyncio.CancelledError:
            self._release(key)
            raise
        return await self._send(row, text, self.clock())

    def _text(self, row: Any, now: datetime) -> str:
        """The fixed reminder text, in the owner's current zone."""
        shown = latest_missed(row, now, self.default_tz)
        late = bool(row["late"]) or now - shown > self.late_after
        tz_name = zone_name(row, self.default_tz)
        return plain_text(row["title"], row["details"] or "", shown, tz_name, late, now)

    async def _send(self, row: Any, text: str, ran_at: datetime) -> bool:
        """Send one claimed occurrence and record its outcome at once; True when delivered."""
        key: Key = (row["task_id"], row["scheduled_at"])
        msg = ReminderMessage(
            task_id=row["task_id"], scheduled_at=row["scheduled_at"], platform=row["platform"],
            chat_id=row["platform_chat_id"], thread_id=row["thread_id"], chat_kind=row["chat_kind"],
            owner_id=row["platform_user_id"], owner_name=row["display_name"], text=text,
            sent_parts=row["sent_parts"], on_sent=partial(self._parts_sent, key, text),
        )  # fmt: skip
        try:
            outbox = self.outboxes.get(row["platform"])
            try:
                if outbox is None:
                    raise LookupError(f"no {row['platform']} adapter is running")
                async with self._gate("send", self.concurrency):
                    mid = await outbox.send_reminder(msg)
            except DeliveryRefused as e:
                await self._end(row, "failed", str(e) or type(e).__name__)
                return False
            except Exception as e:
                await self._retry(row, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
                return False
            at = self.clock()
            await self._delivered((row["task_id"], row["scheduled_at"], ran_at, at, mid, self._next(row)))
            lateness = at - row["scheduled_at"]
            self.metrics.reminder_delivered(lateness.total_seconds(), bool(row["late"]) or lateness > self.late_after)
            return True
        finally:
            self._release(key)

    async def _parts_sent(self, key: Key, text: str, parts: int) -> None:
        """Record that the platform has the first `parts` parts of this text (best effort: never raises)."""
        try:
            sent = partial(self.pool.execute, _PART_SENT_SQL, key[0], key[1], parts, text)
            await retry_dropped(sent, "recording a sent reminder part", pool=self.pool)
        except Exception as e:
            log.warning("could not record part %d of the reminder for task %s as sent (%s)", parts, key[0],
                        type(e).__name__)  # fmt: skip

    async def _delivered(self, record: Delivered) -> None:
        """Record one delivery as soon as it is sent: deliveries finishing while a write runs share the next one."""
        done = asyncio.get_running_loop().create_future()
        self._recorded.append((record, done))
        if self._recorder is None:
            self._recorder = asyncio.get_running_loop().create_task(self._record_deliveries())
        await done

    async def _record_deliveries(self) -> None:
        """Write queued deliveries in one statement each round until none are left (group commit)."""
        batch: list[tuple[Delivered, asyncio.Future[None]]] = []
        try:
            while self._recorded:
                batch, self._recorded = self._recorded, []
                cols = list(zip(*(r for r, _ in batch), strict=True))
                await self._write("recording delivered reminders", _DELIVERED_SQL, *map(list, cols))
                _resolve(batch)
        finally:
            self._recorder = None
            _resolve(batch)  # cancelled mid-write: nobody waits for ever

    def _next(self, row: Any) -> datetime | None:
        """The series' next occurrence once this one has ended."""
        return next_due(row, max(self.clock(), row["scheduled_at"]), row["scheduled_at"], self.default_tz)

    async def _retry(self, row: Any, error: str) -> None:
        """A transient failure: the next attempt after a growing backoff, unless the grace window is over."""
        now = self.clock()
        deadline = row["scheduled_at"] + self.grace
        if now >= deadline:
            await self._end(row, "failed", f"not delivered within {span_text(self.grace)} (last error: {error})")
            return
        wait = min(self.retry_max, self.retry_first * 2 ** max(0, int(row["attempts"]) - 1))
        at = min(_ceil_second(now + wait), deadline)
        self.retries += 1
        self.metrics.reminders_retried.inc()
        # INFO: an outage retries every due reminder; /status shows how many are waiting
        log.info("reminder for task %s not sent (attempt %d), retrying at %s: %s",
                    row["task_id"], row["attempts"], at.isoformat(timespec="seconds"), error)  # fmt: skip
        await self._write("recording a reminder retry", _RETRY_SQL, row["task_id"], row["scheduled_at"], at,
                          error[:REMINDER_ERROR_CHARS], self.instance)  # fmt: skip

    async def _end(self, row: Any, status: str, reason: str, *, count: bool = True) -> None:
        """End an occurrence as failed or skipped with its reason; a series moves on to its next time."""
        if count:
            self.failed_deliveries += 1
            self.metrics.reminders_failed.inc()
            if self.on_failure:
                self.on_failure()
            log.warning("reminder for task %s at %s failed: %s", row["task_id"], row["scheduled_at"], reason)
        await self._write("recording a failed reminder", _ENDED_SQL, row["task_id"], row["scheduled_at"], status,
                          reason[:REMINDER_ERROR_CHARS], self._next(row))  # fmt: skip

    async def _write(self, what: str, sql: str, *args: Any) -> None:
        """One idempotent outcome write (retried once on a dropped connection); logged, never raised."""
        try:
            await retry_dropped(partial(self.pool.execute, sql, *args), what, pool=self.pool)
        except Exception:
            log.exception("%s failed (the claim is retried after its lease)", what)

    async def _agent_text(self, row: Any, shown: datetime, fallback: str) -> str:
        """Run the agent job's turn; the plain text when the LLM fails, so nothing is lost."""
        assert self.agent is not None
        prompt = row["agent_prompt"] or row["title"]
        text = f"[scheduled job: {row['title']}] {prompt}"
        # a job written with others' text around runs as a quoted request: no admin or memory tools (core.Core._turn)
        quote = () if row["own_words"] else (Quoted("job", quoted(row["title"]), prompt),)
        inc = Incoming(
            platform=row["platform"], user_id=row["platform_user_id"], chat_id=row["platform_chat_id"],
            thread_id=row["thread_id"], chat_kind=row["chat_kind"], user_name=row["display_name"],
            text=text if row["own_words"] else "", quoted=quote,
            message_id=f"{JOB_MESSAGE_PREFIX}{row['task_id']}:{shown.isoformat()}",
        )  # fmt: skip
        try:
            answer = await self.agent(inc)
        except Exception:
            log.exception("agent job %s failed", row["task_id"])
            answer = None
        return f"⏰ {row['title']}\n\n{answer}" if answer else fallback

    async def upcoming_times(self, horizon: timedelta, limit: int = 20000) -> list[datetime]:
        """Distinct due times of open tasks and next attempts of retried ones within the horizon (date jobs)."""
        now = self.clock()
        rows = await self.pool.fetch(
            "SELECT due_at AS t FROM tasks WHERE status IN ('pending', 'in_progress') AND due_at > $1"
            " AND due_at <= $2 UNION SELECT lease_until FROM occurrences WHERE status = 'claimed'"
            " AND lease_until > $1 AND lease_until <= $2 ORDER BY 1 LIMIT $3",
            now, now + horizon, limit,
        )  # fmt: skip
        return [r["t"] for r in rows]


def _resolve(batch: Sequence[tuple[Delivered, asyncio.Future[None]]]) -> None:
    """Wake the sends waiting for these records."""
    for _, done in batch:
        if not done.done():
            done.set_result(None)


def _ceil_second(t: datetime) -> datetime:
    """Round up to a whole second (retries of many reminders then share date jobs)."""
    return t if t.microsecond == 0 else t.replace(microsecond=0) + timedelta(seconds=1)


async def replan_zones(
    pool: Pool, now: datetime, default_tz: str | None, user_id: int | None = None, limit: int = 500
) -> int:
    """Move open cron tasks set in another zone to their next time in their owner's current zone."""
    moved = 0
    for r in await pool.fetch(_MOVED_ZONE_SQL, now, default_tz, user_id, limit):
        rec = recurrence.from_json(r["recurrence"])
        if rec is None:
            continue
        times = recurrence.next_times(rec, zone(r["tz"]), now, None, count=1)
        if times:
            await pool.execute(
                "UPDATE tasks SET due_at = $2, timezone = $3, updated_at = now() WHERE id = $1 AND due_at = $4",
                r["id"], times[0], r["tz"], r["due_at"],
            )  # fmt: skip
            moved += 1
    return moved
