"""The core entry: identity, access policy, one turn at a time per chat, de-duplication, the agent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from core import journal
from core.accounts import api_tokens, web_signin
from core.accounts.usage import Spending
from core.agent.llm import LLM
from core.agent.loop import Limits, run_agent
from core.agent.prompt import system_prompt
from core.agent.providers import PROVIDERS, model_choices
from core.agent.replay import build_replay
from core.capabilities import manager
from core.commands import (
    COMMAND,
    UNKNOWN_COMMAND,
    Answer,
    Ask,
    CommandArgs,
    CommandName,
    StatusBoard,
    app_version,
    chosen_model,
)
from core.constants import (
    ABANDONED_MARGIN,
    DUE_SOON,
    DUE_SOON_LINES,
    READY_DB_TIMEOUT_S,
    REFUSAL_EVERY_S,
    WEB_LINK_TTL,
)
from core.inbox import Delivery, Handler, Inbox, Parse
from core.mcp_servers import confirm as mcp_confirm
from core.mcp_servers.config import environment, load_mcp_config
from core.mcp_servers.hub import Hub
from core.media import intake, speaking
from core.media import store as media_store
from core.media.audio import Audio
from core.media.photos import keep as keep_photos
from core.media.photos import with_images
from core.media.tools import READ_ATTACHMENT
from core.memory.blocks import render_prompt_section
from core.memory.embeddings import Embedder
from core.memory.tools import SAVE_FILE, memory_tools
from core.metrics import Metrics
from core.reminders.buttons import UNDO, press
from core.reminders.engine import Outbox, ReminderEngine
from core.reminders.scheduler import ReminderScheduler
from core.settings import Settings
from core.storage import conversations, fleet, refusals
from core.storage.db import Pool
from core.storage.retention import pruning
from core.texts import NO_MODEL, NO_MODEL_HOW, RESTARTING, STEPS_GONE, STEPS_NOT_YOURS
from core.textsafe import clean_json, strip_nul
from core.timeutil import Clock, system_clock, zone
from core.tools.framework import Caps, Tool, ToolContext, ToolRegistry
from core.tools.sql import EXECUTE_SQL
from core.tools.tasks import MANAGE_TASKS
from core.tools.timezone import SET_TIMEZONE
from core.types import API as API_PLATFORM
from core.types import (
    JOB_MESSAGE_PREFIX,
    Assistant,
    Error,
    Event,
    Incoming,
    ModelToolCalls,
    Step,
    ToolResult,
    TurnSteps,
)

log = logging.getLogger(__name__)

FLOOD_USER = (
    "You're sending messages faster than I can take them (at most {n} a minute). I'll skip the ones that arrive in "
    "the next moments; they stay saved. Send your next message in a minute."
)
FLOOD_CHAT = (
    "This chat is sending more messages than I can take (at most {n} a minute). I'll skip the ones that arrive in "
    "the next moments; they stay saved."
)


def default_registry() -> ToolRegistry:
    """The built-in tools."""
    return ToolRegistry([MANAGE_TASKS, SET_TIMEZONE, EXECUTE_SQL, READ_ATTACHMENT])


@dataclass
class _ChatLock:
    """A per-chat lock with a count of turns using or waiting for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class Core:
    """Decides what happens with each incoming message; adapters only translate."""

    def __init__(
        self,
        settings: Settings,
        pool: Pool,
        llm: LLM,
        *,
        registry: ToolRegistry | None = None,
        clock: Clock = system_clock,
        capabilities_dir: Path | None = None,
        embedder: Embedder | None = None,
        metrics: Metrics | None = None,
        audio: Audio | None = None,
    ) -> None:
        """Wire the core with explicit dependencies (capabilities are materialised into `capabilities_dir`; the
        memory tools embed archival entries with `embedder` when given)."""
        self.settings = settings
        self.pool = pool
        self.llm = llm
        self.models = model_choices(settings)  # what /model offers, the default first (config_problem checked it)
        self.registry = registry or default_registry()
        self.spending = Spending(pool, settings, clock)  # token usage and budgets (core/accounts/usage.py)
        metered = embedder.metered(self.spending.embedded) if embedder is not None else None  # embeddings' usage too
        for tool in memory_tools(
            settings.MEMORY_BLOCK_WORDS,
            metered,
            archival_max_entries=settings.ARCHIVAL_MAX_ENTRIES,
            file_pages=media_store.text_of,  # "save it to memory": a file's text into archival memory
        ):
            self.registry.add(tool)
        self.clock = clock
        mcp = load_mcp_config(settings.MCP_CONFIG, environment()) if settings.MCP_CONFIG is not None else None
        # MCP tool servers (MCP_CONFIG): connected in the background by self.mcp.start() (core/startup.py)
        cap = settings.MEDIA_MAX_MB * 1_000_000  # images MCP results bring are kept as the speaker's photos
        self.mcp = Hub(
            mcp,
            pool,
            self.registry,
            clock,
            budget_tokens=settings.MCP_SCHEMA_TOKENS,
            keep_images=lambda images, user, chat, now: keep_photos(pool, images, user, chat, now, cap_bytes=cap),
        )
        self.limits = Limits(settings.AGENT_MAX_STEPS, settings.AGENT_STEP_TIMEOUT, settings.AGENT_TOTAL_TIMEOUT)
        self.caps = Caps(settings.MAX_OPEN_TASKS, settings.JOB_MIN_INTERVAL_MINUTES)
        self._admins = settings.admins
        self._allowed = settings.allowed_users
        self._locks: dict[str, _ChatLock] = {}
        self.task_listeners: list[Callable[[], None]] = []
        self.outboxes: dict[str, Outbox] = {}  # the running front ends' (see running): messages nobody asked for here
        self.web_url: str | None = None  # where this process serves the web page, on this machine (bot/ sets it)
        self.capabilities = manager.CapabilityManager(
            pool,
            self.registry,
            capabilities_dir or manager.materialised_dir(settings.DATA_DIR),
            settings.CAPABILITY_TIMEOUT,
            clock,
        )
        self.capabilities.install()
        self.exit_code: int | None = None  # set by restart(mode="full") once its answer has been sent
        self.stop_listeners: list[Callable[[], None]] = []
        self.draining = False  # set by drain(): new turns are turned away while running ones finish
        self._turn_tasks: set[asyncio.Task[Any]] = set()  # tasks that run (or wait for) a turn
        self._hurry = asyncio.Event()  # set by hurry(): drain() stops waiting
        self.status_board = StatusBoard()  # adapters report into it; /status shows it
        self.metrics = metrics if metrics is not None else Metrics()  # bot/ passes the process's (also the LLM's)
        self.process_id = fleet.new_process_id()  # in /status and in the inbox leases it holds
        self.inbox = Inbox(pool, self.process_id, self.metrics)  # platform updates, stored before acknowledged
        # voice notes: transcription (and speech) at the model's server or TRANSCRIPTION_BASE_URL (core/media/audio.py)
        self.audio = audio if audio is not None else Audio.from_settings(settings, PROVIDERS)

    # ---- what front ends call (docs/architecture.md lists the whole front door) ------------------------------

    async def command(
        self, inc: Incoming, name: CommandName, args: CommandArgs | str = "", *, must_answer: bool = False
    ) -> Answer | Error | None:
        """Answer a command of the catalogue (COMMANDS) without the LLM: its Markdown text (for /export a FileAnswer,
        always sent privately; for a reminder /remind made a Reminded, shown with an Undo button), or for a user who
        may not use the bot the refusal (None when already given in this chat within the hour, unless `must_answer`:
        a slash command or button always gets one). `args`: the options by name, or the text typed after it."""
        if not self.is_allowed(inc):
            return Error("not_allowed", self.refusal_text(inc)) if must_answer else await self.refusal(inc)
        command = COMMAND.get(name)
        if command is None:  # a forged button's command
            return Error("unknown_command", UNKNOWN_COMMAND.format(word=f"/{name}"[:40]))
        options = command.parse(strip_nul(args)) if isinstance(args, str) else clean_json(args)
        return await command.run(Ask(inc, options, self))

    async def new_api_token(self, inc: Incoming, name: str) -> str | Error:
        """A new API token of `inc`'s identity (`bot token`): its secret, shown once, or the line saying why not."""
        if not self.is_allowed(inc):
            return Error("not_allowed", self.refusal_text(inc))
        user, _ = await conversations.identify(self.pool, inc, self.settings.DEFAULT_TIMEZONE)
        try:
            return await api_tokens.create(self.pool, user, name, self.clock())
        except api_tokens.TokenRefused as e:
            return Error("token_refused", str(e))

    async def signin_line(self, inc: Incoming, base_url: str) -> str | None:
        """A line with a new one-time sign-in link of `inc`'s identity to the web page at `base_url` (`bot serve`
        prints the terminal's); None when the identity may not use the bot."""
        if not self.is_allowed(inc):
            return None
        user, _ = await conversations.identify(self.pool, inc, self.settings.DEFAULT_TIMEZONE)
        url = web_signin.link_url(base_url, await web_signin.new_link(self.pool, user, self.clock()))
        return web_signin.SIGNIN_LINE.format(minutes=WEB_LINK_TTL.seconds // 60, url=url)

    async def press_reminder(self, inc: Incoming, task_id: int, action: str) -> tuple[bool, str]:
        """A Done / Snooze button (or Undo under /remind's answer) pressed by `inc`'s user: (whether it took effect,
        the text to show)."""
        if not self.is_allowed(inc):
            return False, self.refusal_text(inc)
        pressed = await press(
            self.pool,
            self.clock,
            platform=inc.platform,
            presser_id=inc.user_id,
            task_id=task_id,
            action=action,
            default_tz=self.settings.DEFAULT_TIMEZONE,
        )
        if pressed[0] and action == UNDO:
            self._tasks_changed()  # the scheduler drops the deleted task's reminder
        return pressed

    async def allow_mcp(self, inc: Incoming, ask_id: int) -> tuple[bool, str]:
        """An "Allow" button (or /mcp allow <id>) pressed by `inc`'s user: the call parked for their OK runs, only for
        the person who was asked and once; (whether it ran, the line or its result to show)."""
        if not self.is_allowed(inc):
            return False, self.refusal_text(inc)
        user, chat = await conversations.identify(self.pool, inc, self.settings.DEFAULT_TIMEZONE)
        return await self.mcp.allow(user, chat, self.is_admin(inc), ask_id)

    async def turn_steps(self, inc: Incoming, turn_id: int) -> TurnSteps | Error:
        """A turn's steps for its "Show steps" button: only the user who asked (or an admin) may see them."""
        if not self.is_allowed(inc):
            return Error("not_allowed", self.refusal_text(inc))
        found = await conversations.turn_steps(self.pool, turn_id)
        if found is None or found.platform != inc.platform:
            return Error("gone", STEPS_GONE)
        if inc.user_id != found.user_id and not self.is_admin(inc):
            return Error("not_yours", STEPS_NOT_YOURS)
        return found

    def report_state(self, adapter: str, state: str | None, *, connected: bool = True) -> None:
        """An adapter's state for /status (None: stopped, no longer listed); not `connected`: /readyz says not ready."""
        board = self.status_board
        if state is None:
            board.adapters.pop(adapter, None)
        else:
            board.adapters[adapter] = state
        if connected and state is not None:
            board.disconnected.discard(adapter)
        else:
            board.disconnected.add(adapter)

    async def not_ready(self, adapters: Sequence[str]) -> str | None:
        """Why this process should get no traffic (shutting down, the database, one of `adapters` not connected), or
        None when ready. The reason names only the part, never a host, a state text or a secret."""
        if self.draining:
            return "shutting down"
        try:
            await asyncio.wait_for(self.pool.fetchval("SELECT 1"), READY_DB_TIMEOUT_S)
        except TimeoutError:
            return f"database: no answer within {READY_DB_TIMEOUT_S:g} s"
        except Exception as e:
            return f"database unreachable ({type(e).__name__})"
        for name in adapters:
            if name not in self.status_board.adapters:
                return f"{name}: not connected"
            if name in self.status_board.disconnected:
                return f"{name}: disconnected"
        return None

    def metrics_text(self) -> bytes:
        """This process's metrics in the Prometheus text format."""
        return self.metrics.exposition()

    def report_poll(self, adapter: str) -> None:
        """An adapter polled its platform successfully (shown in /status)."""
        self.status_board.last_poll[adapter] = system_clock()

    def report_failed_delivery(self) -> None:
        """A reminder could not be delivered (counted in /status since this start)."""
        self.status_board.failed_deliveries += 1

    async def fleet_peers(self, adapter: str) -> int:
        """How many other processes of the fleet run `adapter` now (beat within FLEET_ALIVE_S), so a platform's
        per-bot rate limit can be shared; raises when the database cannot say."""
        return await fleet.peers(self.pool, adapter, self.process_id)

    def now(self) -> datetime:
        """The core's clock (UTC)."""
        return self.clock()

    async def finish_mcp_oauth(
        self, state: str, code: str, error: str = "", iss: str | None = None
    ) -> tuple[bool, str]:
        """The bot's OAuth callback (/mcp/oauth/callback): a /mcp connect finished; whether it worked, and one line for
        the page."""
        return await self.mcp.finish_oauth(state, code, error, iss)

    def is_admin(self, inc: Incoming) -> bool:
        """Admins come from ADMINS; the local terminal user is always one (over the HTTP API only when ADMINS names it:
        a leaked token must not carry the operator's powers by default)."""
        return (inc.platform == "console" and not inc.via) or inc.user_key in self._admins

    def admins_only(self, platform: str, rows: Sequence[Mapping[str, Any]]) -> bool:
        """Whether every replayed message of a group comes from an admin's turn (else admin tools stay off:
        a member must not plant instructions that an admin's turn executes).

        A scheduled job's prompt does not count as the admin's: it may have been written by a turn that
        read other members' text, and it runs (and is replayed) with nobody watching.
        """
        return platform == "console" or all(
            r["author_id"] is not None
            and f"{platform}:{r['author_id']}" in self._admins
            and not (r["platform_message_id"] or "").startswith(JOB_MESSAGE_PREFIX)
            for r in rows
        )

    @staticmethod
    def _all_by(inc: Incoming, rows: Sequence[Mapping[str, Any]]) -> bool:
        """Whether every replayed user message of a group is the speaker's own (not a scheduled job's prompt)."""
        return all(
            r["author_id"] == inc.user_id and not (r["platform_message_id"] or "").startswith(JOB_MESSAGE_PREFIX)
            for r in rows
            if r["role"] == "user"
        )

    def _flood(self, inc: Incoming, user_recent: int, chat_recent: int) -> str | None:
        """None when the message may be answered; past a rate limit the note to send once (then "": stay silent).
        Scheduled jobs are limited by JOB_MIN_INTERVAL_MINUTES instead."""
        if (inc.message_id or "").startswith(JOB_MESSAGE_PREFIX):
            return None
        per_user, per_chat = self.settings.USER_MESSAGES_PER_MINUTE, self.settings.CHAT_MESSAGES_PER_MINUTE
        if user_recent >= per_user:
            return FLOOD_USER.format(n=per_user) if user_recent == per_user else ""
        if chat_recent >= per_chat:
            return FLOOD_CHAT.format(n=per_chat) if chat_recent == per_chat else ""
        return None

    def is_allowed(self, inc: Incoming) -> bool:
        """ALLOWED_USERS (or `*`) plus the admins, and the terminal's user wherever it speaks (its identity is the
        machine's own: only someone at it makes a `bot token` or a sign-in link for it)."""
        return inc.platform == "console" or self.is_admin(inc) or "*" in self._allowed or inc.user_key in self._allowed

    async def refusal(self, inc: Incoming) -> Error | None:
        """The refusal for a user who may not use the bot (at most once per chat per hour, across all processes)."""
        if not await refusals.claim_refusal_notice(self.pool, inc.chat_key, REFUSAL_EVERY_S):
            return None
        return Error("not_allowed", self.refusal_text(inc))

    @staticmethod
    def refusal_text(inc: Incoming) -> str:
        """The polite refusal that shows the user their id."""
        return (
            f"Sorry, this assistant is private. Your {inc.platform} id is {inc.user_id} — ask the owner to "
            f"add {inc.user_key} to ALLOWED_USERS."
        )

    async def receive(self, platform: str, update_id: int, chat_key: str, payload: dict[str, Any], update: Any) -> bool:
        """Store a platform update before the platform is told it arrived (False: stored before, a redelivery); it is
        handled once, in order per `chat_key`, by this process (at once when it can) or another one (see serve)."""
        return await self.inbox.receive(platform, update_id, chat_key, payload, update)

    async def quarantine(self, platform: str, update_id: int | None, reason: str, payload: Any) -> None:
        """Keep an update its adapter could not parse as a dead letter, so the platform can be told it arrived and
        the chats behind it go on (raises while the database is away: the platform sends it again)."""
        await self.inbox.quarantine(platform, update_id, reason, payload, "parse")

    def serve(self, platform: str, parse: Parse, handler: Handler) -> None:
        """Hand `platform`'s stored updates to `handler` as Deliveries (`parse` turns a stored payload back into the
        adapter's update); they are handled in this process from now on, until drain()."""
        self.inbox.serve(platform, parse, handler)

    def unserve(self, platform: str) -> None:
        """Stop handing `platform`'s stored updates to this process (its adapter stopped: other processes, or this one
        once the adapter serves again, take them); drain() stops the whole inbox."""
        self.inbox.unserve(platform)

    async def handle(
        self, inc: Incoming, *, stream: bool = False, delivery: Delivery | None = None
    ) -> AsyncGenerator[Event, None]:
        """Answer one incoming message (`delivery`: the stored update it came in, whose lease the answer needs);
        yields nothing for a duplicate or an ignored message."""
        if not self.is_allowed(inc):
            refusal = await self.refusal(inc)
            if refusal is not None:
                yield refusal
            return
        heard: tuple[Step, ...] = ()
        kept: list[int] = []
        answered: Assistant | None = None  # the answer to a voice note, read aloud after the turn (/voice on)
        if inc.uploads:  # voice notes and documents first become words (core/media/intake.py)
            inc, heard, notes, kept = await self._take_in(inc)
            if notes and not inc.text.strip() and not inc.quoted:  # nothing of it could be read
                yield Error("media", "\n".join(notes))
                return
        if not inc.text.strip() and not any(q.text.strip() for q in inc.quoted):
            return
        size, most = len(inc.text.strip()) + sum(len(q.text) for q in inc.quoted), self.settings.MAX_MESSAGE_CHARS
        if size > most:
            yield Error(
                "too_long",
                f"That message is {size:,} characters long; I can take up to {most:,}. "
                "Please send it in smaller parts.",
            )
            return
        if self.draining:
            yield Error("restarting", RESTARTING)
            return
        self._track_turn_task()
        started, counted = time.monotonic(), False
        try:
            async with self._chat_turn(inc.chat_key), aclosing(self._turn(inc, stream, delivery)) as events:
                async for event in events:
                    if isinstance(event, Assistant | Error) and delivery is not None:  # taken over: nothing sent
                        await self.inbox.confirm(delivery)
                    counted = self._measure(event, started) or counted
                    if heard and isinstance(event, Assistant):  # what was heard shows first among the steps
                        event = answered = replace(event, steps=(*heard, *event.steps))
                    if kept and isinstance(event, Assistant | Error) and event.turn_id is not None:
                        await media_store.link_turn(self.pool, kept, event.turn_id)  # for "Show steps" later
                    yield event
        except BaseException as e:  # a turn that ended without its final event
            if not counted:
                self.metrics.turn("failed" if isinstance(e, Exception) else "interrupted", time.monotonic() - started)
            raise
        if answered is not None and (spoken := await speaking.read_aloud(self.pool, self.audio, inc, answered)):
            yield spoken  # outside the chat's slot: the next message need not wait for the speech server

    async def _take_in(self, inc: Incoming) -> tuple[Incoming, tuple[Step, ...], list[str], list[int]]:
        """The message with what its files said (a transcript as the person's words, a document as quoted text), the
        steps that show it, and one line for each file that could not be read (kept as a platform reference)."""
        user, chat = await conversations.identify(self.pool, inc, self.settings.DEFAULT_TIMEZONE)
        if await conversations.recent_messages(self.pool, user.id) >= self.settings.USER_MESSAGES_PER_MINUTE:
            # past the person's rate: no transcription or extraction is spent; the turn's start says so (once)
            kinds = ", ".join(sorted({up.kind for up in inc.uploads}))
            return replace(inc, text=inc.text or f"[{kinds} not read]", uploads=()), (), [], []
        cap = self.settings.MEDIA_MAX_MB * 1_000_000
        vision = self._sees_images(self.llm.using(chosen_model(self.models, inc.model or user.model)))
        owner = intake.Owner(user.account_id, user.id, chat.id, self.clock(), cap, vision)
        got = await intake.take_in(self.pool, self.audio, inc.uploads, owner)
        said = got.message(inc.text)
        if said or got.quoted:  # the model answers what could be read, and says what could not
            said = "\n\n".join([said, *(f"[{note}]" for note in got.notes)]).strip()
        taken = replace(inc, text=said, quoted=(*inc.quoted, *got.quoted), uploads=())
        return taken, tuple(got.steps), got.notes, got.kept

    def _sees_images(self, llm: LLM) -> bool:
        """Whether photos go to this model as images: LLM_VISION on, or auto while the model has refused none."""
        return self.settings.LLM_VISION == "on" or (self.settings.LLM_VISION == "auto" and llm.sees_images())

    async def close(self) -> None:
        """Close the clients the core made itself (the audio ones, the MCP servers; the model client is its maker's)."""
        await self.mcp.close()
        await self.audio.aclose()

    def _measure(self, event: Event, started: float) -> bool:
        """Count a tool call or the end of a turn (True) in the metrics: only names the registry holds, no user data."""
        if isinstance(event, ToolResult):
            step = event.step
            known = step.name if self.registry.get(step.name) is not None else None
            self.metrics.tool_call(known, None if step.ok else step.error_code or "tool_error")
        elif isinstance(event, Assistant | Error):
            outcome = event.code if isinstance(event, Error) else "ok" if event.cut_short is None else "cut_short"
            self.metrics.turn(outcome, time.monotonic() - started)
            return True
        return False

    async def _answer_again(self, inc: Incoming) -> Assistant | Error | None:
        """The answer stored for a redelivered message, with its steps, to send what of it did not go out (its first
        process died after answering); an error answer (one part) only when it did not go out; None when none."""
        stored = await conversations.stored_answer(self.pool, inc)
        if stored is None:
            return None
        if stored.error_code is not None:
            if stored.sent_parts:
                log.info("error answer of turn %d was sent before its process died; not sent again", stored.turn_id)
                return None
            return Error(stored.error_code, stored.text, stored.turn_id)
        found = await conversations.turn_steps(self.pool, stored.turn_id)
        steps, elapsed = (found.steps, found.elapsed_s) if found is not None else ((), 0.0)
        return Assistant(stored.text, stored.turn_id, steps, elapsed, sent_parts=stored.sent_parts)

    async def mark_sent(self, turn_id: int, parts: int) -> None:
        """Record that the platform accepted the first `parts` parts of a turn's answer, so a process that takes the
        update again sends only the rest (best effort: a failure only risks sending a part twice)."""
        await journal.mark_sent(self.pool, turn_id, parts)

    async def close_abandoned_turns(self) -> int:
        """At start: close turns a dead process left running (safe while other processes run turns)."""
        older_than = timedelta(seconds=self.settings.AGENT_TOTAL_TIMEOUT) + ABANDONED_MARGIN
        closed = await conversations.close_abandoned_turns(self.pool, older_than)
        if closed:
            log.warning("closed %d turn(s) left running by a stopped process as cut short", closed)
        return closed

    @asynccontextmanager
    async def running(self, outboxes: Mapping[str, Outbox]) -> AsyncIterator[None]:
        """While the block runs: capability changes other processes make load here too, old rows are pruned, and the
        reminder scheduler delivers through `outboxes` (one per running front end; missed ones are caught up first)."""
        settings = self.settings
        engine = ReminderEngine(
            self.pool,
            outboxes,
            system_clock,
            agent=self.answer_text,
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
        async with fleet.beating(self.pool, self.status_board, app_version(), process_id=self.process_id):
            yield

    def on_exit(self, listener: Callable[[], None]) -> None:
        """Call `listener` when an answer asked the bot to stop (restart mode full); exit_code says with what."""
        self.stop_listeners.append(listener)

    def request_exit(self, code: int) -> None:
        """Stop the bot with this exit code: the composition root's stop listeners end the run."""
        log.warning("exit with code %d requested", code)
        self.exit_code = code
        for listener in self.stop_listeners:
            listener()

    def _track_turn_task(self) -> None:
        """Remember the task running this turn until it ends (it also sends the reply), for drain()."""
        task = asyncio.current_task()
        if task is not None and task not in self._turn_tasks:
            self._turn_tasks.add(task)
            task.add_done_callback(self._turn_tasks.discard)

    async def drain(self, timeout: float) -> int:
        """Take no more stored updates and turn other new messages away, let running answers finish for up to
        `timeout` s, then cut the rest (stored updates go back to the inbox for another process or the next start).

        Returns how many were cut. Called on SIGTERM/SIGINT and on a full restart, before adapters stop.
        """
        self.draining = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        # stored updates: none taken from now on; running ones finish within the grace or go back to other processes
        handed_back = await self.inbox.stop(timeout, self._hurry)
        timeout = max(0.0, timeout - (loop.time() - started))
        running = {t for t in self._turn_tasks if t is not asyncio.current_task() and not t.done()}
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

    def _tasks_changed(self) -> None:
        """Tell listeners (the reminder scheduler) that a task was created or moved."""
        for listener in self.task_listeners:
            listener()

    async def answer_text(self, inc: Incoming) -> str | None:
        """Run one turn and return its final answer text (None when it failed or was a duplicate)."""
        async with aclosing(self.handle(inc)) as events:
            async for event in events:
                if isinstance(event, Assistant):
                    return event.text if event.cut_short is None else None
        return None

    async def reset(self, inc: Incoming) -> None:
        """Start a fresh conversation in the incoming message's chat (old messages stay stored)."""
        _, chat = await conversations.identify(self.pool, inc, self.settings.DEFAULT_TIMEZONE)
        async with self._chat_turn(inc.chat_key):
            await conversations.reset_conversation(self.pool, chat)

    def _chat_turn(self, key: str) -> _TurnSlot:
        """The one-at-a-time slot of a chat."""
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = _ChatLock()
        return _TurnSlot(self._locks, key, entry)

    async def _turn(self, inc: Incoming, stream: bool, delivery: Delivery | None) -> AsyncGenerator[Event, None]:
        """One turn inside the chat's slot."""
        now = self.clock()
        # Personal memory (prompt and tools) only outside groups: private chats, the terminal, jobs posted there; not in
        # a job whose prompt was written with others' text around (it comes as a "job" quote).
        admin, group = self.is_admin(inc), inc.chat_kind == "group"
        personal = not group and not any(q.kind == "job" for q in inc.quoted)
        start = await journal.begin(
            self.pool,
            inc,
            delivery,
            default_tz=self.settings.DEFAULT_TIMEZONE,
            history=self.settings.HISTORY_MESSAGES,
            due_before=now + DUE_SOON,
            due_limit=DUE_SOON_LINES,
            authors=group,
            memory=personal,
            budget=self.spending.admission(now),
        )
        user, chat, turn_id, rows, due = start.user, start.chat, start.turn_id, start.history, start.due
        if turn_id is None:  # stored before: a duplicate, or a redelivery whose turn ended (answered or not)
            again = await self._answer_again(inc) if delivery is not None and delivery.redelivered else None
            if again is not None:
                yield again
            else:
                log.info("duplicate platform message %s in %s ignored", inc.message_id, inc.chat_key)
            return
        writes = journal.TurnJournal(self.pool, chat, turn_id, delivery)
        meter = self.spending.meter(
            user, start.budget
        )  # the budget check before each model call (core/accounts/usage.py)
        flood = self._flood(inc, start.user_recent, start.chat_recent)
        if flood is not None:  # stored, not answered: the note (once) is the turn's answer, resent on a redelivery
            meter.close()
            note = Error("rate_limited", flood, turn_id) if flood else None
            await writes.fail(note)
            if note is not None:
                yield note
            return
        if self.settings.model_off:  # LLM_PROVIDER=none, or the terminal before a model is set: stored, not answered
            meter.close()
            operator = admin or inc.platform == "console"  # the person at this machine, also on its local page
            note = Error("no_model", NO_MODEL + (NO_MODEL_HOW if operator else ""), turn_id)
            await writes.fail(note)
            yield note
            return
        # Whose words the context holds: in a private chat the speaker's unless something quoted (a forward, an
        # untrusted job) is in it; in a group only when every replayed message is the speaker's. Admin tools need a
        # context of admins' own words; tasks written without own words never get admin or memory powers later.
        foreign = any(r.get("quoted_kind") for r in rows)
        own_words = not foreign and (not group or self._all_by(inc, rows))
        is_admin = admin and not foreign and (not group or self.admins_only(inc.platform, rows))
        ctx = ToolContext(
            self.pool,
            user,
            chat,
            is_admin,
            self.clock,
            self.limits.step_timeout,
            self._tasks_changed,
            personal=personal,
            own_words=own_words,
            caps=self.caps,
        )
        files = any(r.get("quoted_kind") == "file" for r in rows)  # file tools only with a document in context

        def offer(ctx: ToolContext) -> list[Tool]:
            """The tools of this turn for the speaker as they stand now (asked again when they change mid-turn)."""
            tools = self.registry.offered(ctx.is_admin, ctx.personal)
            tools = tools if files else [t for t in tools if t.name not in (READ_ATTACHMENT.name, SAVE_FILE)]
            return self.mcp.offer(tools, ctx)  # the MCP servers' tools this speaker may use, or mcp_search

        tools = offer(ctx)
        caps = self.capabilities.summaries()
        memory = None if start.memory is None else render_prompt_section(start.memory, self.settings.MEMORY_BLOCK_WORDS)
        prompt = system_prompt(user, chat, zone(user.timezone), now, due, tools, caps, memory)
        messages = [
            {"role": "system", "content": prompt},
            *build_replay(rows, group=chat.kind == "group"),
        ]
        # the message's model (the API checked it is on offer), else the account's if still on offer
        llm = self.llm.using(chosen_model(self.models, inc.model or user.model))
        try:
            if self._sees_images(llm):  # the newest photos named in the conversation go as images
                await with_images(self.pool, chat.id, messages)
            async for event in run_agent(
                llm, self.registry, tools, ctx, turn_id, messages, self.limits, stream=stream, meter=meter, offer=offer
            ):
                if isinstance(event, Assistant) and ctx.parked:  # calls waiting for the person's OK: a button each
                    buttons = inc.chat_platform in ("telegram", "discord")  # elsewhere: /mcp allow <id>
                    http = inc.chat_platform == API_PLATFORM  # the HTTP API: its route allows it
                    event = await mcp_confirm.asking(self.pool, event, ctx.parked, buttons=buttons, http=http)
                await writes.record(event)
                if isinstance(event, Assistant):  # with the tokens its model calls used (all reported by now)
                    event = replace(event, tokens=meter.used)
                if not isinstance(event, ModelToolCalls):  # the journal's business only
                    yield event
        except BaseException as e:  # cancelled at shutdown, closed by the adapter, or a failure: not `running`
            await writes.close_unfinished("failed" if isinstance(e, Exception) else "cut_short")
            raise
        finally:  # runs once the adapter consumed the answer (or closed the turn after it)
            meter.close()
            if ctx.requested_exit is not None:
                self.request_exit(ctx.requested_exit)


class _TurnSlot:
    """Async context manager holding a chat's lock; forgets the lock when nobody uses it."""

    def __init__(self, locks: dict[str, _ChatLock], key: str, entry: _ChatLock) -> None:
        """Remember which lock to hold."""
        self.locks, self.key, self.entry = locks, key, entry

    async def __aenter__(self) -> None:
        """Wait for the chat's earlier turns."""
        self.entry.users += 1
        try:
            await self.entry.lock.acquire()
        except BaseException:
            self._release_user()
            raise

    async def __aexit__(self, *exc: object) -> None:
        """Let the chat's next turn run."""
        self.entry.lock.release()
        self._release_user()

    def _release_user(self) -> None:
        """Drop the lock entry when no turn uses or waits for it."""
        self.entry.users -= 1
        if self.entry.users == 0 and self.locks.get(self.key) is self.entry:
            del self.locks[self.key]
