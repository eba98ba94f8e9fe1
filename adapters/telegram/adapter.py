"""The Telegram adapter (python-telegram-bot 22's Bot, without its Application): starts and stops the bot, and keeps
this process to its share of the bot's messages. Updates come in through receive.py, go to their handler through
routes.py (handlers.py) and replies go out through send.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from telegram import BotCommand
from telegram.error import InvalidToken, NetworkError, RetryAfter, TelegramError

from adapters.telegram.config import (
    DEFAULT_API_HOST,
    LEGACY_SOURCE,
    api_host,
    bot_api_url,
    bot_file_url,
    bot_id,
    config_problem,
)
from adapters.telegram.handlers import Handlers
from adapters.telegram.limits import (
    TELEGRAM_FLEET_REFRESH_S,
    TELEGRAM_FLEET_STALE_S,
    TELEGRAM_LIMITS,
    TELEGRAM_POLL_READ_MARGIN_S,
    TELEGRAM_POLL_TIMEOUT_S,
)
from adapters.telegram.receive import HANDLED_UPDATES, Receiver
from adapters.telegram.request import AiohttpRequest, PatientRateLimiter, TelegramBot, one_line, redact_tokens_in_logs
from adapters.telegram.routes import Routes
from adapters.telegram.send import Sender
from core import COMMANDS, EXIT_UNREACHABLE, Core, ReminderMessage, Settings, StartupError

if TYPE_CHECKING:  # the web server's types: webhook mode only
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger(__name__)


class TelegramAdapter:
    """Runs the bot on Telegram inside the caller's event loop."""

    platform = "telegram"
    limits = TELEGRAM_LIMITS

    def __init__(self, core: Core, settings: Settings, *, poll_timeout: int = TELEGRAM_POLL_TIMEOUT_S) -> None:
        """Build the bot and its parts (nothing is sent to Telegram before start)."""
        assert settings.TELEGRAM_BOT_TOKEN is not None
        redact_tokens_in_logs()  # before PTB builds the bot and logs its URLs
        self.core = core
        self.problem = config_problem(settings)
        self.api_host = api_host(settings.TELEGRAM_API_BASE_URL)
        token = settings.TELEGRAM_BOT_TOKEN.get_secret_value()
        # the inbox key of this bot's updates: another bot's process on the same database never takes them, and update
        # ids (which count per bot) never collide
        self.source = f"telegram:{bot_id(token)}"
        # a 429 is waited out as often as it takes within a turn's whole budget
        self.rate_limiter = PatientRateLimiter(settings.AGENT_TOTAL_TIMEOUT)
        self.bot = TelegramBot(
            token,
            request=AiohttpRequest(),
            get_updates_request=AiohttpRequest(
                read_timeout=poll_timeout + TELEGRAM_POLL_READ_MARGIN_S, on_success=self._polled
            ),
            base_url=bot_api_url(settings.TELEGRAM_API_BASE_URL),
            base_file_url=bot_file_url(settings.TELEGRAM_API_BASE_URL),
            rate_limiter=self.rate_limiter,
        )
        self.send = Sender(self.bot)
        self.receiver = Receiver(core, self.bot, self.source, poll_timeout, settings.webhook_secret)
        self.routes = Routes(self.bot, Handlers(core, self.bot, self.send))
        self.webhook_url = settings.TELEGRAM_WEBHOOK_URL  # None: long polling
        self.webhook_path = (urlsplit(self.webhook_url).path or "/") if self.webhook_url else None
        self._secret = settings.webhook_secret
        self._max_connections = settings.TELEGRAM_WEBHOOK_MAX_CONNECTIONS
        self._grace = settings.SHUTDOWN_GRACE_SECONDS
        self._poller: asyncio.Task[None] | None = None
        self._fleet_follower: asyncio.Task[None] | None = None
        self._fleet_size, self._fleet_read = 1, self.rate_limiter.clock()  # the last fleet view, and when it was read

    async def start(self) -> None:
        """Check the token, register the commands, start receiving and handling; a failure is a StartupError (one
        line, never the token) after undoing what was started."""
        if self.problem is not None:
            raise StartupError(self.problem)
        try:
            await self._start()
        except BaseException as e:
            with contextlib.suppress(Exception):
                await self.stop()
            if isinstance(e, TelegramError):
                raise self._startup_error(e) from None
            raise

    def _startup_error(self, e: TelegramError) -> StartupError:
        """What went wrong at start, in one line that names the variable to check."""
        custom = self.api_host != DEFAULT_API_HOST
        if isinstance(e, InvalidToken):
            return StartupError(
                f"TELEGRAM_BOT_TOKEN: rejected by Telegram at {self.api_host} (check the token @BotFather gave you"
                + (", or whether TELEGRAM_API_BASE_URL is a Bot API server)" if custom else ")")
            )
        if isinstance(e, NetworkError):  # also TimedOut and 5xx answers
            return StartupError(
                f"Telegram: the Bot API at {self.api_host} cannot be reached ({one_line(e)}; check the network"
                + (" and TELEGRAM_API_BASE_URL)" if custom else ")"),
                exit_code=EXIT_UNREACHABLE,
            )
        return StartupError(f"Telegram: the Bot API at {self.api_host} refused to start the bot ({one_line(e)})")

    async def _start(self) -> None:
        """getMe, the command menu, then the webhook or long polling; then take stored updates from the inbox (either
        way, an update is stored before Telegram is told it arrived)."""
        await self.bot.initialize()
        await self.bot.set_my_commands(menu())
        if self.webhook_url is not None:
            await self._set_webhook(self.webhook_url)
        else:
            await self.bot.delete_webhook()  # getUpdates is refused while a webhook is set
            self._poller = asyncio.create_task(self.receiver.poll(), name="telegram long polling")
        await self.take_share()  # before the first answer goes out
        self._fleet_follower = asyncio.create_task(self._follow_fleet(), name="telegram fleet share")
        self.core.serve(self.source, self.receiver.parse, self.routes.route)
        # updates stored by a version that did not name the bot, not yet handled (a database used by one bot)
        self.core.serve(LEGACY_SOURCE, self.receiver.parse, self.routes.route)
        self.core.report_state("telegram", f"@{self.bot.username}" + (" (webhook)" if self.webhook_url else ""))

    async def _set_webhook(self, url: str) -> None:
        """setWebhook; when several processes start at once Telegram refuses the later calls for a second (429),
        which is fine once the webhook points at our URL."""
        try:
            await self.bot.set_webhook(
                url,
                secret_token=self._secret,
                allowed_updates=HANDLED_UPDATES,
                max_connections=self._max_connections,
            )
        except RetryAfter:
            if (await self.bot.get_webhook_info()).url != url:
                raise

    async def stop(self) -> None:
        """Stop polling and following the fleet, let the updates being handled finish (within SHUTDOWN_GRACE_SECONDS),
        then close the bot's HTTP sessions; sends still waiting out a 429 give up. The webhook stays set: other
        processes go on receiving it."""
        self.rate_limiter.stop_waiting()
        for task in (self._poller, self._fleet_follower):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._poller = self._fleet_follower = None
        await self.routes.finish(self._grace)
        await self.bot.shutdown()
        self.core.report_state("telegram", None)

    async def on_webhook(self, request: Request) -> Response:
        """Telegram's POST of one update (served on webhook_path)."""
        return await self.receiver.on_webhook(request)

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Push a reminder into its chat with its buttons (DeliveryRefused when the chat is closed for good)."""
        return await self.send.reminder(msg)

    async def take_share(self) -> None:
        """Take this process's share of the bot's messages from the processes running Telegram now (Telegram's 30 per
        second are per bot); while the database cannot say for TELEGRAM_FLEET_STALE_S, half the last share (more
        processes may have started meanwhile)."""
        limiter = self.rate_limiter
        try:
            async with asyncio.timeout(TELEGRAM_FLEET_REFRESH_S):
                processes = 1 + await self.core.fleet_peers(self.platform)
        except Exception as e:
            if limiter.clock() - self._fleet_read <= TELEGRAM_FLEET_STALE_S or limiter.processes > self._fleet_size:
                return
            log.warning(
                "cannot read the fleet (%s): sending at most half this process's share of Telegram's messages until "
                "it can",
                one_line(e),
            )
            processes = 2 * self._fleet_size
        else:
            self._fleet_size, self._fleet_read = processes, limiter.clock()
        if processes != limiter.processes:
            limiter.share(processes)
            log.info(
                "%d process(es) run this Telegram bot: this one sends %.1f message(s) a second, %d at once at most",
                processes,
                limiter.budget.rate,
                math.floor(limiter.budget.burst),
            )

    async def _follow_fleet(self) -> None:
        """Take the share again every TELEGRAM_FLEET_REFRESH_S until cancelled."""
        while True:
            await asyncio.sleep(TELEGRAM_FLEET_REFRESH_S)
            await self.take_share()

    def _polled(self) -> None:
        """Remember the last successful poll for /status."""
        self.core.report_poll("telegram")


def menu() -> list[BotCommand]:
    """Telegram's command menu: the catalogue's commands, each under its aliases (/start, which a new chat sends
    first) and its name."""
    return [BotCommand(name, c.summary) for c in COMMANDS for name in (*c.aliases, c.name)]
