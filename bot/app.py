"""The composition root: settings → database → LLM → core → adapters → run."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta

from adapters import console
from adapters.discord import DiscordAdapter
from adapters.telegram import TelegramAdapter
from bot.web import WebServer
from core import Core, Outbox, Settings
from core.agent.llm import LLM
from core.commands import app_version
from core.memory.embeddings import Embedder, openai_embedder, prepare_embeddings
from core.metrics import Metrics
from core.reminders.engine import ReminderEngine
from core.reminders.scheduler import ReminderScheduler
from core.storage.db import Pool, check_database, create_pool
from core.storage.embedded import EmbeddedPostgres, start_embedded
from core.storage.fleet import beating
from core.storage.migrations import migrate
from core.storage.retention import pruning
from core.timeutil import system_clock

log = logging.getLogger(__name__)


@asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[Pool]:
    """A migrated pool on DATABASE_URL, or on an embedded server in DATA_DIR/pg (stopped on exit)."""
    embedded: EmbeddedPostgres | None = None
    if settings.DATABASE_URL is not None:
        dsn = settings.DATABASE_URL.get_secret_value()
    else:
        embedded = start_embedded(settings.DATA_DIR)
        dsn = embedded.uri
    try:
        await check_database(dsn)  # a bad DATABASE_URL: one line, within CONNECT_TIMEOUT_S
        pool = await create_pool(dsn)
        try:
            await migrate(pool)
            yield pool
        finally:
            await pool.close()
    finally:
        if embedded is not None:
            embedded.stop()


async def run_bot(settings: Settings, *, ask_text: str | None = None, ask_continue: bool = False) -> int:
    """Run until stopped; with `ask_text`, answer it in the terminal (continuing the previous ask) and return."""
    async with database(settings) as pool:
        metrics = Metrics()  # the process's; /metrics serves it when PORT is set
        llm = LLM.from_settings(settings, metrics=metrics)
        try:
            core = Core(settings, pool, llm, embedder=await embeddings(settings, pool, llm), metrics=metrics)
            await core.close_abandoned_turns()  # turns a dead process left `running` end as cut short
            await core.capabilities.load_all()  # a capability that fails to load is logged and skipped
            if ask_text is not None:
                answer, answered = await console.ask_once(core, ask_text, fresh=not ask_continue)
                print(answer)
                return core.exit_code if core.exit_code is not None else 0 if answered else 1
            async with core.capabilities.following():  # changes made by other processes load here too
                if settings.TELEGRAM_BOT_TOKEN is None and settings.DISCORD_BOT_TOKEN is None:
                    return await run_console(settings, core)
                return await run_platforms(settings, core)
        finally:
            await llm.aclose()


async def embeddings(settings: Settings, pool: Pool, llm: LLM) -> Embedder | None:
    """The archival memory's embedder when EMBEDDING_MODEL is set and pgvector is there (else a warning, text only)."""
    if settings.EMBEDDING_MODEL is None:
        return None
    if not await prepare_embeddings(pool):
        return None
    log.info("archival memory embeddings: %s", settings.EMBEDDING_MODEL)
    return openai_embedder(llm.client, settings.EMBEDDING_MODEL)


def pruning_old_rows(settings: Settings, core: Core) -> AbstractAsyncContextManager[None]:
    """Old reminder occurrences and refusal notices are deleted in the background while the bot runs."""
    return pruning(core.pool, core.clock, timedelta(days=settings.RETENTION_DAYS))


@asynccontextmanager
async def reminders(settings: Settings, core: Core, outboxes: dict[str, Outbox]) -> AsyncIterator[None]:
    """The reminder scheduler for the running adapters (catches up on missed ones at start)."""
    engine = ReminderEngine(
        core.pool, outboxes, system_clock, agent=core.answer_text,
        grace=timedelta(hours=settings.REMINDER_GRACE_HOURS), on_failure=core.report_failed_delivery,
        default_tz=settings.DEFAULT_TIMEZONE, metrics=core.metrics,
    )  # fmt: skip
    scheduler = ReminderScheduler(engine)
    core.task_listeners.append(scheduler.tasks_changed)
    await scheduler.start()
    try:
        yield
    finally:
        await scheduler.stop(settings.SHUTDOWN_GRACE_SECONDS)
        core.task_listeners.remove(scheduler.tasks_changed)


async def run_console(settings: Settings, core: Core) -> int:
    """The terminal chat, with reminders printed into it while it runs."""

    def write(text: str) -> None:
        print(text, end="", flush=True)

    async with pruning_old_rows(settings, core), reminders(settings, core, {"console": console.ConsoleOutbox(write)}):
        await console.chat_loop(core, until_exit(core, console.stdin_lines()), write)
    return core.exit_code or 0


async def until_exit(core: Core, lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The lines, until an answer asked the bot to exit (checked before reading the next line)."""
    async for line in lines:
        yield line
        if core.exit_code is not None:
            return


async def run_platforms(settings: Settings, core: Core) -> int:
    """Start every configured platform adapter and the reminders, and run until interrupted."""
    adapters: list[TelegramAdapter | DiscordAdapter] = []
    if settings.TELEGRAM_BOT_TOKEN is not None:
        adapters.append(TelegramAdapter(core, settings))
    if settings.DISCORD_BOT_TOKEN is not None:
        adapters.append(DiscordAdapter(core, settings))
    if not adapters:
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        """The first SIGINT/SIGTERM stops after draining running answers; a second one cuts them now."""
        if stop.is_set():
            core.hurry()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    core.stop_listeners.append(stop.set)  # restart(mode="full"), after its answer was sent
    started: list[TelegramAdapter | DiscordAdapter] = []
    # health and metrics while polling only when PORT is set; webhook mode always serves it (Telegram posts there)
    webhook = settings.TELEGRAM_WEBHOOK_URL is not None
    web = WebServer(core, [a.platform for a in adapters], settings.PORT) if settings.serve_http or webhook else None
    for adapter in adapters:
        if web is not None and isinstance(adapter, TelegramAdapter) and adapter.webhook_path is not None:
            web.app.router.add_post(adapter.webhook_path, adapter.on_webhook)
    try:
        if web is not None:  # first, so /healthz answers during a slow start (/readyz waits for the adapters)
            await web.start()
        for adapter in adapters:
            await adapter.start()
            started.append(adapter)
            log.info("%s adapter started", adapter.platform)
        outboxes: dict[str, Outbox] = {a.platform: a for a in started}
        # in the fleet until drained: the answers still going out count in the processes sharing Telegram's rate
        async with beating(core.pool, core.status_board, app_version(), process_id=core.process_id):
            async with pruning_old_rows(settings, core), reminders(settings, core, outboxes):
                await stop.wait()
            # SIGTERM/SIGINT or a full restart: take no new updates; running answers finish within the grace, the
            # rest are cut and handed back to other processes; then the process leaves the fleet, the adapters stop
            await core.drain(settings.SHUTDOWN_GRACE_SECONDS)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        for adapter in reversed(started):
            await adapter.stop()
        if web is not None:
            await web.stop()
    return core.exit_code or 0
