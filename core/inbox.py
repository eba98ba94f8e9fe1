"""The inbox worker: stores each platform update before the platform is told, and hands it to its adapter, parsed
once, one at a time per chat across all processes (taken at once by the receiving process when it can)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.constants import (
    INBOX_CONCURRENCY,
    INBOX_FORGET_BATCH,
    INBOX_KEEP_DONE_S,
    INBOX_LEASE_S,
    INBOX_MAX_ATTEMPTS,
    INBOX_POLL_S,
    INBOX_RETRY_S,
)
from core.metrics import Metrics
from core.storage import dead_letters
from core.storage import inbox_table as store
from core.storage.db import Pool, connect_like, is_transient, retry_dropped
from core.storage.inbox_table import InboxItem
from core.storage.listen import ChangeListener

log = logging.getLogger(__name__)

CHANNEL = "inbox"  # sql/008_inbox.sql's trigger notifies it when an update is stored


@dataclass(eq=False)
class Delivery:
    """A stored platform update handed to its adapter: parsed once, with how many times a process took it."""

    platform: str
    update_id: int
    attempt: int  # 1 the first time; more: a process before died or was cut while handling it
    update: Any  # what the adapter's parse function made of the stored payload
    lost: bool = False  # another process took it over (this one stalled past its lease): send and write nothing more
    journaled: bool = False  # its turn's answer and every part the platform accepted are stored (core/turn/reply.py)

    @property
    def redelivered(self) -> bool:
        """Whether an earlier attempt may have half done it (its turn resumes or resends its stored answer)."""
        return self.attempt > 1


Parse = Callable[[dict[str, Any]], Any]
Handler = Callable[[Delivery], Awaitable[None]]


@dataclass
class _Lease:
    """This process's hold on an update it handles, and the task handling it."""

    item: InboxItem
    delivery: Delivery
    task: asyncio.Task[None]
    held_until: float  # monotonic time until which the lease is surely still ours (claimed or renewed before it)
    finishing: bool = False  # the handler is done: the update is being marked done


@dataclass(frozen=True)
class Pace:
    """How an inbox takes stored updates: at most `concurrency` at once, each under a lease of `lease_s` (renewed
    while its turn runs), with a look for work every `poll_s` besides the notifications."""

    concurrency: int = INBOX_CONCURRENCY
    lease_s: float = INBOX_LEASE_S
    poll_s: float = INBOX_POLL_S


DEFAULT_PACE = Pace()


class Inbox:
    """Stores updates before they are acknowledged and runs them here, in order per chat, across all processes."""

    def __init__(
        self,
        pool: Pool,
        owner: str,
        metrics: Metrics,
        *,
        concurrency: int = INBOX_CONCURRENCY,
        lease_s: float = INBOX_LEASE_S,
        poll_s: float = INBOX_POLL_S,
    ) -> None:
        """`owner` names this process in the leases it takes."""
        self.pool, self.owner, self.metrics = pool, owner, metrics
        self.concurrency, self.lease_s, self.poll_s = concurrency, lease_s, poll_s
        self._handlers: dict[str, tuple[Parse, Handler]] = {}
        self._leases: dict[int, _Lease] = {}  # the updates being handled here, by update_id
        self._wake = asyncio.Event()
        self._notes = 0  # notifications of stored updates so far (a handler that ends looks again if any came)
        self._taking = False
        self._tasks: list[asyncio.Task[None]] = []
        self._listener = ChangeListener(CHANNEL, lambda: connect_like(pool), self._notified)

    async def receive(self, platform: str, update_id: int, chat_key: str, payload: dict[str, Any], update: Any) -> bool:
        """Store an update (committed when this returns: only then may the platform be told); False for a redelivery,
        or for an update that cannot be stored (kept as a dead letter: the chats behind it go on).
        When this process serves the platform, has room and the chat has nothing open, it takes the update in the
        same statement and starts `update` (the payload already parsed) here; otherwise the stored row wakes the
        processes. A dropped connection is retried: storing twice stores once."""
        take = self._taking and platform in self._handlers and len(self._leases) < self.concurrency
        claimer = self.owner if take else None
        claimed = time.monotonic()
        try:
            stored, item = await retry_dropped(
                lambda: store.receive(self.pool, platform, update_id, chat_key, payload, claimer, self.lease_s),
                "storing an update",
                pool=self.pool,
            )
        except Exception as e:
            if is_transient(e):
                raise  # the database is away or busy: the platform is not told, and sends it again
            await self.quarantine(platform, update_id, f"could not be stored: {_reason(e)}", payload, "store")
            return False
        if item is not None and item.update_id not in self._leases:  # ours (also when a retry found our own claim)
            self._start(item, claimed, update)
        return stored

    async def quarantine(self, platform: str, update_id: int | None, reason: str, payload: Any, stage: str) -> None:
        """Keep an update that cannot be stored or parsed as a dead letter (raises while the database is away, so
        the platform sends it again); logged once per update, counted by `stage`."""
        new = await retry_dropped(
            lambda: dead_letters.add(self.pool, platform, update_id, reason, payload), "keeping a dead letter"
        )
        if new:
            self.metrics.dead_letters.labels(platform.partition(":")[0], stage).inc()
            log.warning("%s update %s quarantined as a dead letter: %s", platform, update_id, reason)

    def serve(self, platform: str, parse: Parse, handler: Handler) -> None:
        """Run `platform`'s stored updates in this process: `parse` turns a stored payload into the adapter's update
        (once per delivery), `handler` handles it (starts taking work on first use)."""
        self._handlers[platform] = (parse, handler)
        self._wake.set()
        if not self._taking:
            self._taking = True
            self._listener.start()
            self._tasks = [
                asyncio.create_task(self._take(), name="inbox taker"),
                asyncio.create_task(self._renew(), name="inbox lease renewal"),
            ]

    def unserve(self, platform: str) -> None:
        """Take no more of `platform`'s updates in this process (its adapter stopped); ones running here go on."""
        self._handlers.pop(platform, None)

    @property
    def held(self) -> int:
        """How many updates this process is handling now."""
        return len(self._leases)

    async def confirm(self, delivery: Delivery) -> None:
        """Before an answer goes out: return while the update is still this process's, else cancel this task. Asks
        the database only when the lease may have run out (renewals failed, or this process stalled); when it cannot
        say, the answer goes out."""
        lease = self._leases.get(delivery.update_id)
        if (
            lease is not None
            and lease.delivery is delivery
            and not delivery.lost
            and time.monotonic() >= lease.held_until
        ):
            try:
                await self._keep([lease])
            except Exception as e:
                log.warning(
                    "could not confirm the lease on %s update %d (%s); answering anyway",
                    delivery.platform,
                    delivery.update_id,
                    _reason(e),
                )
        if delivery.lost:
            raise asyncio.CancelledError  # caught by _handle: nothing more is sent or written here

    async def stop(self, grace: float, hurry: asyncio.Event | None = None) -> int:
        """Take no new updates; let running ones finish for up to `grace` s, then cut them and hand their leases
        back so another process takes them at once (`hurry` set: stop waiting). Returns how many were handed back."""
        self._taking = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._listener.stop()
        running = [lease.task for lease in self._leases.values()]
        if running:
            log.info("waiting up to %g s for %d update(s) being handled", grace, len(running))
            finished: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
            hurried = asyncio.ensure_future((hurry or asyncio.Event()).wait())
            await asyncio.wait({finished, hurried}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
            hurried.cancel()
        late = dict(self._leases)
        for lease in late.values():
            lease.task.cancel()
        if late:
            await asyncio.wait([lease.task for lease in late.values()], timeout=1.0)
            try:  # not counted as failed attempts; updates whose lease was lost meanwhile are left to their owner
                handed = await store.release(self.pool, self.owner, list(late))
            except Exception as e:  # the leases run out on their own
                log.warning("could not hand back %d update(s) (%s); they are retaken after the lease", len(late), e)
                handed = 0
            log.warning("%d update(s) cut at shutdown and handed back to other processes", handed)
        return len(late)

    async def _notified(self, _payload: str | None) -> None:
        """An update was stored somewhere (or the listener reconnected): look for work."""
        self._notes += 1
        self._wake.set()

    async def _take(self) -> None:
        """Claim what may run now while there is room; otherwise wait for a wake-up or the next poll."""
        while self._taking:
            self._wake.clear()
            free = self.concurrency - len(self._leases)
            if free > 0 and self._handlers:
                claimed = time.monotonic()  # the leases run at least until this + lease_s
                try:
                    items = await store.claim(self.pool, self.owner, list(self._handlers), self.lease_s, free)
                except Exception as e:
                    log.warning("could not take updates from the inbox (%s); trying again", _reason(e))
                    await asyncio.sleep(INBOX_RETRY_S)
                    continue
                if not self._taking:  # stopped while claiming: give them back at once
                    await store.release(self.pool, self.owner, [i.update_id for i in items])
                    return
                for item in items:
                    self._start(item, claimed)
                if len(items) == free:
                    continue  # there may be more
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the cancel from stop()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_s):
                    await self._wake.wait()

    def _start(self, item: InboxItem, claimed: float, update: Any = None) -> None:
        """Handle one claimed update in its own task (`update`: already parsed by the receiver; else parsed there)."""
        self.metrics.inbox_wait.observe(item.waited_s)
        if item.attempts > 1:
            self.metrics.inbox_retaken.inc()
            log.info(
                "taking %s update %d again (attempt %d): the process before stopped or died while handling it",
                item.platform,
                item.update_id,
                item.attempts,
            )
        delivery = Delivery(item.platform, item.update_id, item.attempts, update)
        task = asyncio.create_task(self._handle(item, delivery), name=f"inbox {item.platform} {item.update_id}")
        self._leases[item.update_id] = _Lease(item, delivery, task, claimed + self.lease_s)

    async def _handle(self, item: InboxItem, delivery: Delivery) -> None:
        """Parse (unless the receiver did), run the adapter's handler, then mark the update done (a failure is logged:
        the update is not retried). A handler whose lease another process took over is cancelled and leaves the update
        to that process."""
        lease = self._leases[item.update_id]
        notes = self._notes  # updates stored while this one runs may wait for its chat (see the end)
        served = self._handlers.get(item.platform)
        if served is None:  # its adapter stopped since the claim: hand it back for another process at once
            await self._hand_back(item)
            return
        parse, handler = served
        try:
            if item.failed_attempts >= INBOX_MAX_ATTEMPTS:  # it took down every process that tried it: give up on it
                why = f"given up after {item.failed_attempts} attempts whose process died or stalled"
                await self.quarantine(item.platform, item.update_id, why, item.payload, "gave_up")
            elif await self._parsed(item, delivery, parse):
                await handler(delivery)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            declined = task is not None and not task.cancelling() and item.platform not in self._handlers
            if declined and not delivery.lost:  # its adapter stopped and turned it away: another process takes it now
                await self._hand_back(item)  # still counted as held here until the database has it back
                return
            self._forget(item.update_id)
            if delivery.lost:
                return  # another process answers it: nothing to finish or hand back here
            raise  # cut at shutdown: stop() hands it back
        except Exception:
            log.exception("handling %s update %d failed", item.platform, item.update_id)
        full, more = len(self._leases) >= self.concurrency, True
        lease.finishing = True
        try:
            more = not delivery.lost and await self._finish(item, delivery.journaled)
        finally:
            self._forget(item.update_id)
            # the chat's next update may go now, or a slot came free for waiting ones; or an update stored meanwhile
            # may have missed both the claim (its chat was still open) and `more` (stored as this one finished)
            if more or full or self._notes != notes:
                self._wake.set()

    async def _parsed(self, item: InboxItem, delivery: Delivery, parse: Parse) -> bool:
        """Parse the stored payload unless the receiver did; False (kept as a dead letter) when it cannot be."""
        if delivery.update is None:
            try:
                delivery.update = parse(item.payload)
            except Exception as e:
                await self.quarantine(
                    item.platform, item.update_id, f"could not be parsed: {_reason(e)}", item.payload, "parse"
                )
                return False
        return True

    async def _hand_back(self, item: InboxItem) -> None:
        """Give a claimed update back unhandled (not counted as a failed attempt)."""
        try:
            await store.release(self.pool, self.owner, [item.update_id])
        except Exception as e:  # its lease runs out on its own
            log.warning("could not hand back %s update %d (%s)", item.platform, item.update_id, _reason(e))
        finally:
            self._forget(item.update_id)

    def _forget(self, update_id: int) -> None:
        """The update is no longer handled here."""
        self._leases.pop(update_id, None)

    async def _finish(self, item: InboxItem, journaled: bool) -> bool:
        """Mark done, trying again while the database is away (else the update would run again after its lease);
        True when another update of its chat waits. A lease lost meanwhile is left to the process that took it."""
        while True:
            try:
                more = await retry_dropped(
                    lambda: store.finish(self.pool, item, journaled=journaled), "finishing an update", pool=self.pool
                )
                if more is None:
                    log.warning(
                        "%s update %d was taken over by another process while handled here (its lease ran "
                        "out); left to that process",
                        item.platform,
                        item.update_id,
                    )
                return bool(more)
            except Exception as e:
                log.warning(
                    "could not mark %s update %d done (%s); trying again", item.platform, item.update_id, _reason(e)
                )
                await asyncio.sleep(INBOX_RETRY_S)

    async def _renew(self) -> None:
        """Keep the leases of running updates (a handler whose lease another process took over is cancelled), and
        refresh the depth metrics and forget old handled updates."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                if self._leases:
                    await self._keep(list(self._leases.values()))
                depth, age = await store.depth(self.pool)
                self.metrics.inbox_depth.set(depth)
                self.metrics.inbox_age.set(age)
                await store.forget_done(self.pool, INBOX_KEEP_DONE_S, INBOX_FORGET_BATCH)
            except Exception as e:
                log.warning("could not renew inbox leases (%s); trying again", _reason(e))

    async def _keep(self, leases: Sequence[_Lease]) -> None:
        """Renew these leases; cancel the handlers of those another process took over."""
        started = time.monotonic()
        lost = set(await store.renew(self.pool, self.owner, [lease.item.update_id for lease in leases], self.lease_s))
        for lease in leases:
            if lease.item.update_id not in lost:
                lease.held_until = max(lease.held_until, started + self.lease_s)
            elif not lease.finishing and not lease.delivery.lost:  # a finished update is not held either: not a loss
                self._lose(lease)

    def _lose(self, lease: _Lease) -> None:
        """Another process took this update over after its lease ran out: stop its handler here, now."""
        item = lease.item
        lease.delivery.lost = True
        log.warning(
            "lost the lease on %s update %d (attempt %d) to another process: stopping its turn here",
            item.platform,
            item.update_id,
            item.attempts,
        )
        if self._leases.get(item.update_id) is lease and lease.task is not asyncio.current_task():
            lease.task.cancel()  # (Inbox.confirm stops its own task itself)


def _reason(e: BaseException) -> str:
    """One line: the error's type and message."""
    return f"{type(e).__name__}: {e}"
