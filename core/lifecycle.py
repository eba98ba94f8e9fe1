"""The process around the turns: running (reminders, pruning, capability reloads), the fleet, the drain at shutdown,
the exit a turn asked for, and the state adapters report for /status and /readyz."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from core.accounts.usage import Spending
from core.agent.llm import LLM, LLMReply
from core.capabilities.manager import CapabilityManager
from core.commands import StatusBoard, app_version
from core.constants import ABANDONED_MARGIN, READY_DB_TIMEOUT_S
from core.inbox import Inbox
from core.metrics import Metrics
from core.reminders.engine import Outbox, ReminderEngine
from core.reminders.scheduler import ReminderScheduler
from core.reminders.watching import PageReader, Summarizer
from core.settings import Settings
from core.storage import conversations, fleet
from core.storage.db import Pool
from core.storage.retention import pruning
from core.timeutil import Clock, system_clock
from core.turn.runner import Turns
from core.types import UserRef

log = logging.getLogger(__name__)


class Exits:
    """An exit a turn asked for (restart mode full): the composition root's listeners end the run."""

    def __init__(self) -> None:
        """No exit asked for yet."""
        self.code: int | None = None
        self.listeners: list[Callable[[], None]] = []

    def request(self, code: int) -> None:
        """Stop the bot with this exit code."""
        log.warning("exit with code %d requested", code)
        self.code = code
        for listener in self.listeners:
            listener()


def summarizer(llm: LLM, spending: Spending, timeout: float) -> Summarizer:
    """A page change's summary by one model call without tools, only when the account has budget left (its usage is
    recorded like a turn's); None when the model cannot be asked or fails."""

    async def summarize(account_id: int, identity_id: int | None, messages: list[dict[str, str]]) -> str | None:
        user = UserRef(account_id, identity_id or 0, "", "", "", "UTC")
        meter = spending.meter(user, await spending.admit(account_id))
        try:
            if await meter.admit() is not None:
                return None  # a budget is used up: the diff goes alone
            reply: LLMReply | None = None
            async for item in llm.chat(list(messages), [], stream=False, timeout=timeout):
                if isinstance(item, LLMReply):
                    reply = item
            meter.spent(reply)
            said = (reply.content or "").strip() if reply is not None else ""
            return said or None
        finally:
            meter.close()

    return summarize


class Lifecycle:
    """Starts what runs beside the turns, reports the process's state, and drains it at shutdown."""

    def __init__(
        self,
        settings: Settings,
        pool: Pool,
        clock: Clock,
        *,
        turns: Turns,
        inbox: Inbox,
        spending: Spending,
        capabilities: CapabilityManager,
        metrics: Metrics,
        task_listeners: list[Callable[[], None]],
        outboxes: dict[str, Outbox],
        process_id: str,
        page_reader: PageReader | None = None,
    ) -> None:
        """Manage the process with these collaborators (`task_listeners` and `outboxes` are shared with the core;
        `page_reader` reads watched pages, whose changes the model sums up when there is one)."""
        self.settings, self.pool, self.clock = settings, pool, clock
        self.turns, self.inbox, self.spending, self.capabilities = turns, inbox, spending, capabilities
        self.metrics, self.task_listeners, self.outboxes = metrics, task_listeners, outboxes
        self.board = StatusBoard()  # adapters report into it; /status shows it
        self.process_id = process_id  # in /status and in the inbox leases it holds
        self.page_reader = page_reader
        self.summarize = (
            None if settings.model_off else summarizer(turns.parts.llm, spending, settings.AGENT_STEP_TIMEOUT)
        )
        self._hurry = asyncio.Event()  # set by hurry(): drain() stops waiting

    @asynccontextmanager
    async def running(self, outboxes: Mapping[str, Outbox]) -> AsyncIterator[None]:
        """While the block runs: capability changes other processes make load here too, old rows are pruned, and the
        reminder scheduler delivers through `outboxes` (one per running front end; missed ones are caught up first)."""
        settings = self.settings
        engine = ReminderEngine(
            self.pool,
            outboxes,
            system_clock,
            agent=self.turns.answer_text,
            reader=self.page_reader,
            summarize=self.summarize,
            grace=timedelta(hours=settings.REMINDER_GRACE_HOURS),
            on_failure=self.report_failed_delivery,
            default_tz=settings.DEFAULT_TIMEZONE,
            metrics=self.metrics,
        )
        scheduler = ReminderScheduler(engine)
        keep = timedelta(days=settings.RETENTION_DAYS)
        async with self.capabilities.following(), pruning(self.pool, self.clock, keep):
            self.task_listeners.append(scheduler.tasks_changed)
            await scheduler.start()
            self.outboxes.update(outboxes)  # also for telling a link code's issuer (core/accounts/linking.py)
            try:
                yield
            finally:
                await scheduler.stop(settings.SHUTDOWN_GRACE_SECONDS)
                self.task_listeners.remove(scheduler.tasks_changed)
                for name in outboxes:
                    self.outboxes.pop(name, None)

    @asynccontextmanager
    async def in_fleet(self) -> AsyncIterator[None]:
        """While the block runs this process is in the fleet (/status lists it; platforms share their rate limits by
        it): bot/ keeps it there until drained, since answers still going out count."""
        async with fleet.beating(self.pool, self.board, app_version(), process_id=self.process_id):
            yield

    async def close_abandoned_turns(self) -> int:
        """At start: close turns a dead process left running (safe while other processes run turns)."""
        older_than = timedelta(seconds=self.settings.AGENT_TOTAL_TIMEOUT) + ABANDONED_MARGIN
        closed = await conversations.close_abandoned_turns(self.pool, older_than)
        if closed:
            log.warning("closed %d turn(s) left running by a stopped process as cut short", closed)
        return closed

    async def drain(self, timeout: float) -> int:
        """Take no more stored updates and turn other new messages away, let running answers finish for up to
        `timeout` s, then cut the rest (stored updates go back to the inbox for another process or the next start).

        Returns how many were cut. Called on SIGTERM/SIGINT and on a full restart, before adapters stop.
        """
        self.turns.draining = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        # stored updates: none taken from now on; running ones finish within the grace or go back to other processes
        handed_back = await self.inbox.stop(timeout, self._hurry)
        timeout = max(0.0, timeout - (loop.time() - started))
        running = {t for t in self.turns.tasks if t is not asyncio.current_task() and not t.done()}
        if not running:
            await self.spending.flush()  # the token usage of the answers that ended
            return handed_back
        log.info("waiting up to %g s for %d running answer(s)", timeout, len(running))
        finished: asyncio.Future[Any] = asyncio.gather(*running, return_exceptions=True)
        hurried: asyncio.Future[Any] = asyncio.ensure_future(self._hurry.wait())
        await asyncio.wait({finished, hurried}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        hurried.cancel()
        late = {t for t in running if not t.done()}
        for task in late:
            task.cancel()
        if late:
            log.warning("%d running answer(s) cut at shutdown (SHUTDOWN_GRACE_SECONDS=%g)", len(late), timeout)
            await asyncio.wait(late, timeout=1.0)
        await self.spending.flush()
        return handed_back + len(late)

    def hurry(self) -> None:
        """Stop waiting in drain() now (a second SIGINT/SIGTERM)."""
        self._hurry.set()

    def report_state(self, adapter: str, state: str | None, *, connected: bool = True) -> None:
        """An adapter's state for /status (None: stopped, no longer listed); not `connected`: /readyz says not ready."""
        board = self.board
        if state is None:
            board.adapters.pop(adapter, None)
        else:
            board.adapters[adapter] = state
        if connected and state is not None:
            board.disconnected.discard(adapter)
        else:
            board.disconnected.add(adapter)

    def report_poll(self, adapter: str) -> None:
        """An adapter polled its platform successfully (shown in /status)."""
        self.board.last_poll[adapter] = system_clock()

    def report_failed_delivery(self) -> None:
        """A reminder could not be delivered (counted in /status since this start)."""
        self.board.failed_deliveries += 1

    async def not_ready(self, adapters: Sequence[str]) -> str | None:
        """Why this process should get no traffic (shutting down, the database, one of `adapters` not connected), or
        None when ready. The reason names only the part, never a host, a state text or a secret."""
        if self.turns.draining:
            return "shutting down"
        try:
            await asyncio.wait_for(self.pool.fetchval("SELECT 1"), READY_DB_TIMEOUT_S)
        except TimeoutError:
            return f"database: no answer within {READY_DB_TIMEOUT_S:g} s"
        except Exception as e:
            return f"database unreachable ({type(e).__name__})"
        for name in adapters:
            if name not in self.board.adapters:
                return f"{name}: not connected"
            if name in self.board.disconnected:
                return f"{name}: disconnected"
        return None

    async def fleet_peers(self, adapter: str) -> int:
        """How many other processes of the fleet run `adapter` now (beat within FLEET_ALIVE_S), so a platform's
        per-bot rate limit can be shared; raises when the database cannot say."""
        return await fleet.peers(self.pool, adapter, self.process_id)
