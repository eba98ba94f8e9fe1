"""The reminder engine: claims due occurrences in PostgreSQL, builds them (plain or by an agent turn) and sends them
through the adapters' outboxes, retrying transient failures."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Protocol

from asyncpg import Record

from core.constants import (
    REMINDER_AGENT_RUNS,
    REMINDER_BATCH,
    REMINDER_FULL_SWEEP,
    REMINDER_LATE_AFTER,
    REMINDER_LEASE,
    REMINDER_RETRY_FIRST,
    REMINDER_RETRY_MAX,
    REMINDER_SENDS,
    REMINDER_STALE_OVERLAP,
    WATCH_CHECKS,
)
from core.metrics import Metrics
from core.reminders import queries
from core.reminders.messages import (
    SUPERSEDED,
    TOO_OLD,
    ReminderMessage,
    error_text,
    job_request,
    job_text,
    message_for,
    moved_message,
    moved_text,
    not_delivered,
    refusal_text,
    reminder_text,
)
from core.reminders.queries import Delivered, Key
from core.reminders.recurrence import latest_missed, next_due
from core.reminders.watching import (
    NO_READER,
    PageReader,
    Seen,
    Summarizer,
    judge,
    read,
    summed_up,
)
from core.storage.db import Pool, retry_dropped
from core.timeutil import Clock
from core.types import Incoming

log = logging.getLogger(__name__)

AgentRunner = Callable[[Incoming], Awaitable[str | None]]
Sleep = Callable[[float], Awaitable[None]]


class DeliveryRefused(Exception):
    """A permanent refusal (bot blocked, chat gone, no access): the occurrence ends as failed with this reason.

    Adapters raise it from `send_reminder`; any other exception counts as transient and is retried."""


class ClaimLost(Exception):
    """Another process took over an occurrence this one was sending (its lease ran out): leave it to that one."""


class Outbox(Protocol):
    """What the engine needs from an adapter: send a reminder, return the platform message id."""

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Deliver one reminder: raise DeliveryRefused for a permanent refusal, anything else when transient."""
        ...


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
    reader: PageReader | None = None  # reads a watched page (core/reminders/watching.py); None: watches are skipped
    summarize: Summarizer | None = None  # one model call that summarises a watched page's change (None: diff only)
    lease: timedelta = REMINDER_LEASE
    grace: timedelta = timedelta(hours=24)
    late_after: timedelta = REMINDER_LATE_AFTER
    batch: int = REMINDER_BATCH
    retry_first: timedelta = REMINDER_RETRY_FIRST
    retry_max: timedelta = REMINDER_RETRY_MAX
    sleep: Sleep = asyncio.sleep  # waits between lease renewals
    concurrency: int = REMINDER_SENDS
    agent_concurrency: int = REMINDER_AGENT_RUNS
    watch_concurrency: int = WATCH_CHECKS
    default_tz: str | None = None  # DEFAULT_TIMEZONE; None: the zone the task was set in
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}")
    failed_deliveries: int = 0
    retries: int = 0  # transient failures recorded for a later attempt
    on_failure: Callable[[], None] | None = None
    metrics: Metrics = field(default_factory=Metrics)  # the process's (bot/ passes the Core's)
    _held: dict[Key, int] = field(default_factory=dict, init=False, repr=False)
    _stale_from: datetime | None = field(default=None, init=False, repr=False)  # stale due times before: all seen
    _swept_all: datetime | None = field(default=None, init=False, repr=False)  # the last complete full pass
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
            rows = await self._claim()
            if not rows:
                return delivered
            self._hold([(r["task_id"], r["scheduled_at"]) for r in rows])
            plain = [r for r in rows if not self._start_job(r)]
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
        """End what the grace window has passed: never-tried ones as skipped, ones still retrying as failed. Open tasks
        due before the window are all looked at in a full pass (this engine's first, then every REMINDER_FULL_SWEEP,
        with the zones' check); in between only the ones whose due time left the window since the last complete
        pass, so a sweep does not read every reminder delivered but never marked done."""
        now = self.clock()
        full = self._swept_all is None or now - self._swept_all >= REMINDER_FULL_SWEEP
        rows = await queries.stale(self.pool, now, self.grace, self.batch, None if full else self._stale_from)
        for r in rows:
            nxt = next_due(r, now, r["due_at"], self.default_tz)
            await queries.skip(self.pool, r["id"], r["due_at"], TOO_OLD, nxt)
        if len(rows) < self.batch:  # every stale one up to now - grace was seen
            self._stale_from = now - self.grace - REMINDER_STALE_OVERLAP
            self._swept_all = now if full else self._swept_all
        for r in await queries.expired(self.pool, now, self.grace, self.batch):
            if r["superseded"]:
                await self._end(r, "skipped", SUPERSEDED, count=False)
            else:
                await self._end(r, "failed", not_delivered(self.grace, r["error"]))
        if full:  # a zone is replanned as it changes (/timezone, set_timezone, /link); this catches the rest
            await self.follow_zones()

    async def follow_zones(self, user_id: int | None = None) -> int:
        """Recompute the next time of cron tasks whose owner changed zone (a daily 09:00 follows them)."""
        return await queries.replan_zones(self.pool, self.clock(), self.default_tz, user_id, self.batch)

    async def upcoming_times(self, horizon: timedelta, limit: int = 20000) -> list[datetime]:
        """Distinct due times of open tasks and next attempts of retried ones within the horizon (date jobs)."""
        now = self.clock()
        return await queries.upcoming(self.pool, now, now + horizon, limit)

    async def _claim(self) -> list[Record]:
        """Claim the next batch of due occurrences (retried on a dropped connection)."""
        claim = partial(
            queries.claim,
            self.pool,
            self.instance,
            self.clock(),
            batch=self.batch,
            late_after=self.late_after,
            lease=self.lease,
            grace=self.grace,
        )
        return await retry_dropped(claim, "reminder claim", pool=self.pool)

    def _start_job(self, row: Record) -> bool:
        """Start an agent job's turn as its own task; False when the row is sent as plain text (no agent, or a
        retry of a job whose answer is already stored). A page watch's check runs the same way (a retry of one that has
        something to say sends its stored text)."""
        if row["kind"] == "watch" and row["sent_text"] is None:
            job = asyncio.get_running_loop().create_task(self._watch(row))
        elif row["kind"] != "agent" or self.agent is None or row["sent_text"] is not None:
            return False
        else:
            job = asyncio.get_running_loop().create_task(self._job(row))
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return True

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
                renew = partial(queries.renew, self.pool, keys, self.instance, self.clock() + self.lease)
                await retry_dropped(renew, "reminder lease renewal", pool=self.pool)
            except Exception as e:
                log.warning("renewing %d reminder leases failed: %s", len(keys), e)

    async def _plain(self, row: Record) -> bool:
        """Build and send a plain reminder (fixed text, no LLM); a retry of one partly sent keeps its text."""
        now = self.clock()
        return await self._send(row, row["sent_text"] or self._text(row, now), now)

    async def _job(self, row: Record) -> bool:
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

    async def _watch(self, row: Record) -> bool:
        """A page watch's check: read the page (bounded concurrency), compare, store the outcome; send what it has to
        say (a change, failures reported, a pause) like a reminder. True when a message was delivered."""
        key: Key = (row["task_id"], row["scheduled_at"])
        try:
            async with self._gate("watch", self.watch_concurrency):
                say = await self._check(row)
        except asyncio.CancelledError:
            self._release(key)
            raise
        except Exception:
            log.exception("checking the page of watch %s failed (retried after the lease)", key[0])
            say = None
        if say is None:
            self._release(key)
            return False
        return await self._send(row, say, self.clock())

    async def _check(self, row: Record) -> str | None:
        """Read a watched page and store what the check found; the text to send, or None (nothing to say, or the
        claim went to another process)."""
        key: Key = (row["task_id"], row["scheduled_at"])
        watch = await retry_dropped(partial(queries.watch_of, self.pool, key[0]), "reading a watch", pool=self.pool)
        if watch is None:
            return None  # deleted meanwhile: its occurrence went with it
        if self.reader is None:
            await self._end(row, "skipped", NO_READER, count=False)
            return None
        verdict = judge(Seen.of(watch), await read(self.reader, watch["url"]), self.clock())
        say = verdict.say
        if verdict.changed is not None and self.summarize is not None:  # a summary by one model call, budget allowing
            async with self._gate("agent", self.agent_concurrency):
                say = await summed_up(self.summarize, watch, verdict)
        new = verdict.seen
        state = (new.title, new.seen_hash, new.seen_text, new.failures, new.failing_since, new.reported, verdict.error)
        now, nxt = self.clock(), self._next(row)
        store = partial(queries.watch_checked, self.pool, key, self.instance, state, now, say, nxt, verdict.pause)
        held = await retry_dropped(store, "recording a page check", pool=self.pool)
        if held and verdict.pause:
            log.info("watch %s paused: its page could not be read for a day (%s)", key[0], verdict.error)
        return say if held else None

    def _text(self, row: Record, now: datetime) -> str:
        """The fixed reminder text, in the owner's current zone."""
        return reminder_text(row, now, self.late_after, self.default_tz)

    async def _agent_text(self, row: Record, shown: datetime, fallback: str) -> str:
        """Run the agent job's turn; the plain text when the LLM fails, so nothing is lost."""
        assert self.agent is not None
        request = job_request(row, shown)
        try:
            answer = await self.agent(request)
        except Exception:
            log.exception("agent job %s failed", row["task_id"])
            answer = None
        return job_text(row["title"], answer, fallback)

    async def _send(self, row: Record, text: str, ran_at: datetime) -> bool:
        """Send one claimed occurrence and record its outcome at once; True when delivered."""
        key: Key = (row["task_id"], row["scheduled_at"])
        msg = message_for(row, text, partial(self._parts_sent, key, text))
        if row["kind"] == "watch":
            msg = replace(msg, buttons=())  # a page watch's message has no Done / Snooze
        try:
            try:
                mid = await self._deliver(row, msg)
            except DeliveryRefused as e:
                await self._end(row, "failed", refusal_text(e))
                return False
            except ClaimLost:
                return False  # another process holds it now and records its outcome
            except Exception as e:
                await self._retry(row, error_text(e))
                return False
            await self._record_sent(row, ran_at, mid)
            return True
        finally:
            self._release(key)

    async def _deliver(self, row: Record, msg: ReminderMessage) -> str | None:
        """Send to the task's chat; when a chat refuses for good, to the owner's most recently used private chat not
        tried yet (the occurrence and its task move there before it is sent, so a retry after a crash goes there and
        never twice), with a note saying why. DeliveryRefused with every reason when no chat is left."""
        tried: list[int] = [row["chat_id"]]
        reasons: list[str] = []
        while True:
            try:
                return await self._hand_over(msg)
            except DeliveryRefused as e:
                reasons.append(refusal_text(e))
                find = partial(queries.fallback_chat, self.pool, row["task_id"], tried, list(self.outboxes))
                chat = await retry_dropped(find, "finding another chat for a reminder", pool=self.pool)
                if chat is None:
                    raise DeliveryRefused("; ".join(reasons)) from e
                msg = await self._move(row, msg, tried[-1], chat)
                tried.append(chat["id"])

    async def _move(self, row: Record, msg: ReminderMessage, old_chat: int, chat: Record) -> ReminderMessage:
        """Move a refused occurrence and its task to another private chat (ClaimLost when this process no longer
        holds it); the message for that chat, with the note."""
        key: Key = (row["task_id"], row["scheduled_at"])
        text = moved_text(msg.text, msg.platform, msg.chat_kind)
        move = partial(queries.move_chat, self.pool, key, self.instance, old_chat, chat["id"], text)
        if not await retry_dropped(move, "moving a reminder to another chat", pool=self.pool):
            raise ClaimLost
        log.info("reminder for task %s refused in its %s chat: to a %s one", key[0], msg.platform, chat["platform"])
        return moved_message(msg, chat, text, partial(self._parts_sent, key, text))

    async def _hand_over(self, msg: ReminderMessage) -> str | None:
        """Give a message to its platform's outbox (at most `concurrency` at a time); the platform message id."""
        outbox = self.outboxes.get(msg.platform)
        if outbox is None:
            raise LookupError(f"no {msg.platform} adapter is running")
        async with self._gate("send", self.concurrency):
            return await outbox.send_reminder(msg)

    async def _record_sent(self, row: Record, ran_at: datetime, message_id: str | None) -> None:
        """Record a delivery (its series moves on) and count how late it was."""
        at = self.clock()
        await self._delivered((row["task_id"], row["scheduled_at"], ran_at, at, message_id, self._next(row)))
        lateness = at - row["scheduled_at"]
        self.metrics.reminder_delivered(lateness.total_seconds(), bool(row["late"]) or lateness > self.late_after)

    async def _parts_sent(self, key: Key, text: str, parts: int) -> None:
        """Record that the platform has the first `parts` parts of this text (best effort: never raises)."""
        try:
            sent = partial(queries.part_sent, self.pool, key, parts, text)
            await retry_dropped(sent, "recording a sent reminder part", pool=self.pool)
        except Exception as e:
            name = type(e).__name__
            log.warning("could not record part %d of the reminder for task %s as sent (%s)", parts, key[0], name)

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
                records = [r for r, _ in batch]
                await self._write("recording delivered reminders", partial(queries.delivered, self.pool, records))
                _resolve(batch)
        finally:
            self._recorder = None
            _resolve(batch)  # cancelled mid-write: nobody waits for ever

    def _next(self, row: Record) -> datetime | None:
        """The series' next occurrence once this one has ended."""
        return next_due(row, max(self.clock(), row["scheduled_at"]), row["scheduled_at"], self.default_tz)

    async def _retry(self, row: Record, error: str) -> None:
        """A transient failure: the next attempt after a growing backoff, unless the grace window is over."""
        now = self.clock()
        deadline = row["scheduled_at"] + self.grace
        if now >= deadline:
            await self._end(row, "failed", not_delivered(self.grace, error))
            return
        at = min(_ceil_second(now + self._backoff(int(row["attempts"]))), deadline)
        self.retries += 1
        self.metrics.reminders_retried.inc()
        # INFO: an outage retries every due reminder; /status shows how many are waiting
        when = at.isoformat(timespec="seconds")
        log.info(
            "reminder for task %s not sent (attempt %d), retrying at %s: %s",
            row["task_id"],
            row["attempts"],
            when,
            error,
        )
        key: Key = (row["task_id"], row["scheduled_at"])
        await self._write(
            "recording a reminder retry", partial(queries.retry_at, self.pool, key, at, error, self.instance)
        )

    def _backoff(self, attempts: int) -> timedelta:
        """The wait before the next attempt: doubling from `retry_first` with each attempt, at most `retry_max` (the
        doubling stops there: after ~45 attempts it would pass the largest timedelta)."""
        wait = self.retry_first
        for _ in range(max(0, attempts - 1)):
            if wait >= self.retry_max:
                break
            wait *= 2
        return min(self.retry_max, wait)

    async def _end(self, row: Record, status: str, reason: str, *, count: bool = True) -> None:
        """End an occurrence as failed or skipped with its reason; a series moves on to its next time."""
        if count:
            self.failed_deliveries += 1
            self.metrics.reminders_failed.inc()
            if self.on_failure:
                self.on_failure()
            log.warning("reminder for task %s at %s failed: %s", row["task_id"], row["scheduled_at"], reason)
        key: Key = (row["task_id"], row["scheduled_at"])
        await self._write(
            "recording a failed reminder", partial(queries.end, self.pool, key, status, reason, self._next(row))
        )

    async def _write(self, what: str, write: Callable[[], Awaitable[None]]) -> None:
        """One idempotent outcome write (retried on a dropped connection); logged, never raised."""
        try:
            await retry_dropped(write, what, pool=self.pool)
        except Exception:
            log.exception("%s failed (the claim is retried after its lease)", what)


def _resolve(batch: Sequence[tuple[Delivered, asyncio.Future[None]]]) -> None:
    """Wake the sends waiting for these records."""
    for _, done in batch:
        if not done.done():
            done.set_result(None)


def _ceil_second(t: datetime) -> datetime:
    """Round up to a whole second (retries of many reminders then share date jobs)."""
    return t if t.microsecond == 0 else t.replace(microsecond=0) + timedelta(seconds=1)
