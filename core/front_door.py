"""The core's facade: what front ends and bot/ call. It wires the rooms and passes each call to the one that owns it:
`access` (who may use the bot), `turn/` (runner, journal, chat slots, the reply port), `lifecycle` (running, fleet,
drain, status), the inbox, the command catalogue and the accounts."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from pathlib import Path

from core.access import Access, refusal_text
from core.accounts import api_tokens, web_signin
from core.accounts.usage import Spending
from core.agent.llm import LLM
from core.agent.loop import Limits
from core.agent.providers import PROVIDERS, model_choices
from core.capabilities import manager
from core.commands import COMMAND, UNKNOWN_COMMAND, Answer, Ask, CommandArgs, CommandName
from core.constants import WEB_LINK_TTL
from core.inbox import DEFAULT_PACE, Delivery, Inbox, Pace
from core.lifecycle import Exits, Lifecycle
from core.mcp_servers.config import environment, load_mcp_config
from core.mcp_servers.hub import Hub
from core.media import store as media_store
from core.media.audio import Audio
from core.media.photos import keep as keep_photos
from core.media.tools import READ_ATTACHMENT
from core.memory.embeddings import Embedder
from core.memory.tools import memory_tools
from core.metrics import Metrics
from core.reminders.buttons import UNDO, press
from core.reminders.engine import Outbox
from core.reminders.watching import PageReader
from core.settings import Settings
from core.storage import conversations, fleet
from core.storage.db import Pool
from core.storage.platform_state import PlatformState
from core.textsafe import clean_json, strip_nul
from core.timeutil import Clock, system_clock
from core.tools.framework import Caps, ToolRegistry
from core.tools.sql import EXECUTE_SQL
from core.tools.tasks import MANAGE_TASKS
from core.tools.timezone import SET_TIMEZONE
from core.turn.reply import Reply
from core.turn.runner import TurnParts, Turns
from core.types import Error, Event, Incoming
from core.web.fetch import FetchPolicy
from core.web.search import Search
from core.web.tools import page_reader as reading
from core.web.tools import web_tools


def default_registry() -> ToolRegistry:
    """The built-in tools."""
    return ToolRegistry([MANAGE_TASKS, SET_TIMEZONE, EXECUTE_SQL, READ_ATTACHMENT])


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
        inbox_pace: Pace = DEFAULT_PACE,
        page_reader: PageReader | None = None,
    ) -> None:
        """Wire the rooms with explicit dependencies (capabilities go to `capabilities_dir`, archival memory is embedded
        with `embedder` when given, watched pages are read with `page_reader` (default: the safe fetch))."""
        self.settings, self.pool, self.llm, self.clock = settings, pool, llm, clock
        self.kept = PlatformState(pool)  # small values adapters keep across restarts (a sync token)
        self.models = model_choices(settings)  # what /model offers, the default first (config_problem checked it)
        self.registry = registry or default_registry()
        self.spending = Spending(pool, settings, clock)  # token usage and budgets (core/accounts/usage.py)
        metered = embedder.metered(self.spending.embedded) if embedder is not None else None  # embeddings' usage too
        words, most = settings.MEMORY_BLOCK_WORDS, settings.ARCHIVAL_MAX_ENTRIES
        for tool in memory_tools(words, metered, archival_max_entries=most, file_pages=media_store.text_of):
            self.registry.add(tool)  # file_pages: "save it to memory" puts a file's text into archival memory
        mcp = load_mcp_config(settings.MCP_CONFIG, environment()) if settings.MCP_CONFIG is not None else None
        cap = settings.MEDIA_MAX_MB * 1_000_000  # images MCP results bring are kept as the speaker's photos
        self.mcp = Hub(  # MCP tool servers (MCP_CONFIG): connected in the background by self.mcp.start() (startup.py)
            mcp, pool, self.registry, clock, budget_tokens=settings.MCP_SCHEMA_TOKENS,
            keep_images=lambda images, user, chat, now: keep_photos(pool, images, user, chat, now, cap_bytes=cap),
        )  # fmt: skip
        self.search = Search(settings, clock=clock)  # WEB_SEARCH_PROVIDER (core/web/: search, safe fetch, tools)
        policy = FetchPolicy.from_settings(settings)
        self.page_reader: PageReader | None = page_reader or reading(policy)
        for tool in web_tools(policy, self.search, self.spending.web_call, self.page_reader):
            self.registry.add(tool)
        self.caps = Caps(settings.MAX_OPEN_TASKS, settings.JOB_MIN_INTERVAL_MINUTES)
        self.access = Access(settings, pool)
        self.task_listeners: list[Callable[[], None]] = []  # told when a task was made or moved (the scheduler)
        self.outboxes: dict[str, Outbox] = {}  # the running front ends' (see running): messages nobody asked for here
        self.web_url: str | None = None  # where this process serves the web page, on this machine (bot/ sets it)
        folder = capabilities_dir or manager.materialised_dir(settings.DATA_DIR)
        self.capabilities = manager.CapabilityManager(pool, self.registry, folder, settings.CAPABILITY_TIMEOUT, clock)
        self.capabilities.install()
        self.metrics = metrics if metrics is not None else Metrics()  # bot/ passes the process's (also the LLM's)
        self.process_id = fleet.new_process_id()  # in /status and in the inbox leases it holds
        self.inbox = Inbox(  # platform updates, stored before they are acknowledged
            pool, self.process_id, self.metrics, concurrency=inbox_pace.concurrency, lease_s=inbox_pace.lease_s,
            poll_s=inbox_pace.poll_s,
        )  # fmt: skip
        # voice notes: transcription (and speech) at the model's server or TRANSCRIPTION_BASE_URL (core/media/audio.py)
        self.audio = audio if audio is not None else Audio.from_settings(settings, PROVIDERS)
        self.exits = Exits()
        limits = Limits(settings.AGENT_MAX_STEPS, settings.AGENT_STEP_TIMEOUT, settings.AGENT_TOTAL_TIMEOUT)
        self.turns = Turns(
            TurnParts(
                settings, pool, llm, self.models, self.registry, self.capabilities, self.mcp, self.spending,
                self.audio, self.inbox, self.metrics, self.access, clock, limits, self.caps,
                tasks_changed=self._tasks_changed, request_exit=self.exits.request,
            )
        )  # fmt: skip
        self.lifecycle = Lifecycle(
            settings, pool, clock, turns=self.turns, inbox=self.inbox, spending=self.spending,
            capabilities=self.capabilities, metrics=self.metrics, task_listeners=self.task_listeners,
            outboxes=self.outboxes, process_id=self.process_id, page_reader=self.page_reader,
        )  # fmt: skip
        self.status_board = self.lifecycle.board  # adapters report into it; /status shows it
        # what front ends and bot/ call of the rooms, under the names they always had (docs/architecture.md)
        life, inbox = self.lifecycle, self.inbox
        self.running, self.in_fleet, self.drain, self.hurry = life.running, life.in_fleet, life.drain, life.hurry
        self.report_state, self.report_poll, self.not_ready = life.report_state, life.report_poll, life.not_ready
        self.report_failed_delivery, self.fleet_peers = life.report_failed_delivery, life.fleet_peers
        self.close_abandoned_turns = life.close_abandoned_turns
        self.receive, self.serve, self.unserve = inbox.receive, inbox.serve, inbox.unserve
        self.is_allowed, self.is_admin, self.refusal = self.access.is_allowed, self.access.is_admin, self.access.refusal
        self.answer_text, self.turn_steps = self.turns.answer_text, self.turns.steps
        self.metrics_text, self.now = self.metrics.exposition, clock
        self.finish_mcp_oauth = self.mcp.finish_oauth  # the bot's OAuth callback (/mcp/oauth/callback)
        self.refusal_text = refusal_text

    async def command(
        self, inc: Incoming, name: CommandName, args: CommandArgs | str = "", *, must_answer: bool = False
    ) -> Answer | Error | None:
        """Answer a command of the catalogue (COMMANDS) without the LLM: its Markdown text (for /export a FileAnswer,
        always sent privately; for a reminder /remind made a Reminded, shown with an Undo button), or for a user who
        may not use the bot the refusal (None when already given in this chat within the hour, unless `must_answer`:
        a slash command or button always gets one). `args`: the options by name, or the text typed after it."""
        if not self.is_allowed(inc):
            return Error("not_allowed", refusal_text(inc)) if must_answer else await self.refusal(inc)
        command = COMMAND.get(name)
        if command is None:  # a forged button's command
            return Error("unknown_command", UNKNOWN_COMMAND.format(word=f"/{name}"[:40]))
        options = command.parse(strip_nul(args)) if isinstance(args, str) else clean_json(args)
        return await command.run(Ask(inc, options, self))

    async def new_api_token(self, inc: Incoming, name: str) -> str | Error:
        """A new API token of `inc`'s identity (`bot token`): its secret, shown once, or the line saying why not."""
        if not self.is_allowed(inc):
            return Error("not_allowed", refusal_text(inc))
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
            return False, refusal_text(inc)
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
            return False, refusal_text(inc)
        user, chat = await conversations.identify(self.pool, inc, self.settings.DEFAULT_TIMEZONE)
        return await self.mcp.allow(user, chat, self.is_admin(inc), ask_id)

    async def answer(self, inc: Incoming, reply: Reply, *, delivery: Delivery | None = None) -> None:
        """Answer one incoming message through the front end's `reply` port (`delivery`: the stored update it came
        in); the core sends every event of the turn through it and records what the platform accepted."""
        await self.turns.answer(inc, reply, delivery=delivery)

    def handle(
        self, inc: Incoming, *, stream: bool = False, delivery: Delivery | None = None
    ) -> AsyncGenerator[Event, None]:
        """The events of one message's turn, for a caller that is no front end (bot ask's tests, benchmarks)."""
        return self.turns.handle(inc, stream=stream, delivery=delivery)

    async def reset(self, inc: Incoming) -> None:
        """Start a fresh conversation in the incoming message's chat (old messages stay stored)."""
        _, chat = await conversations.identify(self.pool, inc, self.settings.DEFAULT_TIMEZONE)
        async with self.turns.slots.turn(inc.chat_key):
            await conversations.reset_conversation(self.pool, chat)

    async def quarantine(self, platform: str, update_id: int | None, reason: str, payload: object) -> None:
        """Keep an update its adapter could not parse as a dead letter, so the platform can be told it arrived and
        the chats behind it go on (raises while the database is away: the platform sends it again)."""
        await self.inbox.quarantine(platform, update_id, reason, payload, "parse")

    @property
    def draining(self) -> bool:
        """Whether drain() began: new turns are turned away."""
        return self.turns.draining

    @property
    def exit_code(self) -> int | None:
        """The exit code an answer asked the bot to stop with (restart mode full), once its answer was sent."""
        return self.exits.code

    def on_exit(self, listener: Callable[[], None]) -> None:
        """Call `listener` when an answer asked the bot to stop (restart mode full); exit_code says with what."""
        self.exits.listeners.append(listener)

    def _tasks_changed(self) -> None:
        """Tell listeners (the reminder scheduler) that a task was created or moved."""
        for listener in self.task_listeners:
            listener()

    async def close(self) -> None:
        """Close the clients the core made itself (audio, MCP servers, web search; the model client is its maker's)."""
        await self.mcp.close()
        await self.audio.aclose()
        await self.search.close()
