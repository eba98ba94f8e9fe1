"""The Telegram adapter (python-telegram-bot 22): updates → Incoming, core events → HTML replies."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from telegram import (
    BotCommand,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    LinkPreviewOptions,
    Message,
    MessageEntity,
    ReplyParameters,
    Update,
)
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from adapters.telegram.limits import (
    TELEGRAM_DRAFT_CHARS,
    TELEGRAM_DRAFT_EVERY_S,
    TELEGRAM_FLEET_REFRESH_S,
    TELEGRAM_FLEET_STALE_S,
    TELEGRAM_POLL_READ_MARGIN_S,
    TELEGRAM_POLL_RETRY_MAX_S,
    TELEGRAM_POLL_TIMEOUT_S,
    TELEGRAM_PREVIEW_TIMEOUT_S,
    TELEGRAM_TYPING_AFTER_S,
    TELEGRAM_TYPING_EVERY_S,
)
from adapters.telegram.provenance import quoted_of
from adapters.telegram.render import esc, markdown_to_html, plain_text, render_reply, split_html, split_plain
from adapters.telegram.request import AiohttpRequest, PatientRateLimiter, redact_token, redact_tokens_in_logs
from core import (
    EXIT_UNREACHABLE,
    MEMORY_WIPE_CONFIRM,
    Assistant,
    AssistantDelta,
    CommandName,
    Core,
    Delivery,
    DeliveryRefused,
    Error,
    Incoming,
    ReminderMessage,
    Settings,
    StartupError,
)

log = logging.getLogger(__name__)

TEXT_ONLY = "I can only read text for now — please type your message (a caption on a photo works too)."
FAILED = "Sorry, something went wrong on my side. Please try again in a moment."
EMPTY_REPLY = "(The answer was empty.)"
SENT_PRIVATELY = "I've sent it to you in a private chat."
DEFAULT_API_HOST = "api.telegram.org"
TOKEN_SHAPE = re.compile(r"[0-9]{1,20}:[A-Za-z0-9_-]{30,64}")
# 400s that mean the chat itself is gone or closed to the bot (lower case; PTB capitalises the description)
CHAT_GONE = (
    "chat not found",
    "user not found",
    "peer_id_invalid",
    "have no rights to send",
    "not enough rights to send",
    "chat_write_forbidden",
    "message thread not found",
    "topic_deleted",
    "group chat was deactivated",
)
WIPE_LABEL = "🗑 Yes, wipe my memory"
NOT_YOUR_BUTTON = "This button is not for you: send /memory wipe to erase your own memory."
BUTTON_LABELS = {"done": "✅ Done", "snooze10": "😴 10 min", "snooze60": "😴 1 h"}
COMMANDS = [
    BotCommand("start", "what I can do"),
    BotCommand("help", "how to use me"),
    BotCommand("tasks", "your open tasks"),
    BotCommand("timezone", "show or set your time zone"),
    BotCommand("memory", "what I remember about you (forget a line, wipe)"),
    BotCommand("reset", "start a fresh conversation"),
    BotCommand("status", "how the bot is doing"),
]

App = Application[Any, Any, Any, Any, Any, Any]
HANDLED_UPDATES = [Update.MESSAGE, Update.CALLBACK_QUERY]  # allowed_updates: what the handlers take
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


class TelegramAdapter:
    """Runs the bot on Telegram inside the caller's event loop."""

    platform = "telegram"

    def __init__(self, core: Core, settings: Settings, *, poll_timeout: int = TELEGRAM_POLL_TIMEOUT_S) -> None:
        """Build the PTB application (not started yet)."""
        assert settings.TELEGRAM_BOT_TOKEN is not None
        redact_tokens_in_logs()  # before PTB builds the bot and logs its URLs
        self.core = core
        self.poll_timeout = poll_timeout
        self.api_host = _host(settings.TELEGRAM_API_BASE_URL)
        self.token_ok = TOKEN_SHAPE.fullmatch(settings.TELEGRAM_BOT_TOKEN.get_secret_value()) is not None
        # a 429 is waited out as often as it takes within a turn's whole budget
        self.rate_limiter = PatientRateLimiter(settings.AGENT_TOTAL_TIMEOUT)
        builder = (
            ApplicationBuilder()
            .token(settings.TELEGRAM_BOT_TOKEN.get_secret_value())
            .rate_limiter(self.rate_limiter)
            .concurrent_updates(True)
            .request(AiohttpRequest())
            .get_updates_request(
                AiohttpRequest(read_timeout=poll_timeout + TELEGRAM_POLL_READ_MARGIN_S, on_success=self._polled)
            )
        )
        if settings.TELEGRAM_API_BASE_URL:
            builder = builder.base_url(settings.TELEGRAM_API_BASE_URL)
        self.app: App = builder.build()
        self.username = ""
        self.bot_id = 0
        self.webhook_url = settings.TELEGRAM_WEBHOOK_URL  # None: long polling
        self.webhook_path = (urlsplit(self.webhook_url).path or "/") if self.webhook_url else None
        self._secret = settings.webhook_secret.encode()
        self._max_connections = settings.TELEGRAM_WEBHOOK_MAX_CONNECTIONS
        self._grace = settings.SHUTDOWN_GRACE_SECONDS
        self._poller: asyncio.Task[None] | None = None
        self._fleet_follower: asyncio.Task[None] | None = None
        self._fleet_size, self._fleet_read = 1, self.rate_limiter.clock()  # the last fleet view, and when it was read
        self._deliveries: dict[int, Delivery] = {}  # the stored updates being handled, by update_id
        self._add_handlers()

    def _add_handlers(self) -> None:
        """Commands, text (and captions), other messages, errors; edited messages are not handled. A forwarded
        command is someone else's text, not a command: it goes to the text handler."""
        fresh = filters.UpdateType.MESSAGE
        command = fresh & ~filters.FORWARDED
        add = self.app.add_handler
        add(CommandHandler(["start", "help"], self._on_help, filters=command))
        add(CommandHandler("tasks", self._on_tasks, filters=command))
        add(CommandHandler("timezone", self._on_timezone, filters=command))
        add(CommandHandler("memory", self._on_memory, filters=command))
        add(CommandHandler("reset", self._on_reset, filters=command))
        add(CommandHandler("status", self._on_status, filters=command))
        add(CallbackQueryHandler(self._on_button, pattern=r"^rem:"))
        add(CallbackQueryHandler(self._on_memory_button, pattern=r"^mem:wipe:\d+$"))
        text = fresh & (filters.TEXT | filters.CAPTION) & (~filters.COMMAND | filters.FORWARDED)
        add(MessageHandler(text, self._on_text))
        add(MessageHandler(fresh & ~filters.TEXT & ~filters.CAPTION & ~filters.StatusUpdate.ALL, self._on_other))
        self.app.add_error_handler(self._on_error)

    async def start(self) -> None:
        """Initialize, register the commands, start long polling and the handlers; a failure is a StartupError
        (one line, never the token) after undoing what was started."""
        if not self.token_ok:
            raise StartupError(
                "TELEGRAM_BOT_TOKEN does not look like a bot token: expected <digits>:<about 35 letters, digits, "
                "- or _>, as @BotFather gives it"
            )
        try:
            await self._start()
        except BaseException as e:
            with contextlib.suppress(Exception):
                await self.stop()
            with contextlib.suppress(Exception):
                await self.app.bot.shutdown()  # the HTTP sessions, when initialize failed half-way
            custom = self.api_host != DEFAULT_API_HOST
            if isinstance(e, InvalidToken):
                raise StartupError(
                    f"Telegram ({self.api_host}) rejected TELEGRAM_BOT_TOKEN: check the token @BotFather gave you"
                    + (" (or TELEGRAM_API_BASE_URL is not a Bot API server)" if custom else "")
                ) from None
            if isinstance(e, NetworkError):  # also TimedOut and 5xx answers
                raise StartupError(
                    f"Telegram Bot API at {self.api_host} cannot be reached ({_one_line(e)}); check the network"
                    + (" and TELEGRAM_API_BASE_URL" if custom else ""),
                    exit_code=EXIT_UNREACHABLE,
                ) from None
            if isinstance(e, TelegramError):
                raise StartupError(
                    f"Telegram Bot API at {self.api_host} refused to start the bot ({_one_line(e)})"
                ) from None
            raise

    async def _start(self) -> None:
        """Initialize (getMe), register the commands, set the webhook or start long polling, then take stored
        updates from the inbox (either way, an update is stored before Telegram is told it arrived)."""
        await self.app.initialize()
        me = self.app.bot
        self.username, self.bot_id = me.username or "", me.id
        await me.set_my_commands(COMMANDS)
        if self.webhook_url is not None:
            await self._set_webhook()
        else:
            await me.delete_webhook()  # getUpdates is refused while a webhook is set
            self._poller = asyncio.create_task(self._poll(), name="telegram long polling")
        await self.app.start()
        await self.take_share()  # before the first answer goes out
        self._fleet_follower = asyncio.create_task(self._follow_fleet(), name="telegram fleet share")
        self.core.serve("telegram", self._parse, self._on_stored)
        self.core.report_state("telegram", f"@{self.username}" + (" (webhook)" if self.webhook_url else ""))

    async def _set_webhook(self) -> None:
        """setWebhook; when several processes start at once Telegram refuses the later calls for a second (429),
        which is fine once the webhook points at our URL."""
        try:
            await self.app.bot.set_webhook(
                self.webhook_url, secret_token=self._secret.decode(), allowed_updates=HANDLED_UPDATES,
                max_connections=self._max_connections,
            )  # fmt: skip
        except RetryAfter:
            if (await self.app.bot.get_webhook_info()).url != self.webhook_url:
                raise

    async def stop(self) -> None:
        """Stop polling and the application, in reverse order; sends still waiting out a 429 give up. The webhook
        stays set: other processes go on receiving it."""
        self.rate_limiter.stop_waiting()
        for task in (self._poller, self._fleet_follower):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._poller = self._fleet_follower = None
        if self.app.running:
            await self.app.stop()
        await self.app.shutdown()
        self.core.report_state("telegram", None)

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
            log.warning("cannot read the fleet (%s): sending at most half this process's share of Telegram's messages "
                        "until it can", _one_line(e))  # fmt: skip
            processes = 2 * self._fleet_size
        else:
            self._fleet_size, self._fleet_read = processes, limiter.clock()
        if processes != limiter.processes:
            limiter.share(processes)
            count, window = limiter.budget.count, limiter.budget.window_s
            log.info("%d process(es) run this Telegram bot: this one sends %d message(s) per %.1f s", processes, count,
                     window)  # fmt: skip

    async def _follow_fleet(self) -> None:
        """Take the share again every TELEGRAM_FLEET_REFRESH_S until cancelled."""
        while True:
            await asyncio.sleep(TELEGRAM_FLEET_REFRESH_S)
            await self.take_share()

    def _polled(self) -> None:
        """Remember the last successful poll for /status."""
        self.core.report_poll("telegram")

    # ---- receiving: webhook or long polling into the inbox, then any process handles it -------------------

    async def _poll(self) -> None:
        """Long polling: store each batch in the inbox, and only then confirm it (the next offset); trouble is
        retried with a growing pause (at once the first time), and never stops the bot."""
        offset, pause = 0, 0.0
        while True:
            try:
                updates = await self.app.bot.get_updates(
                    offset=offset, timeout=self.poll_timeout, allowed_updates=HANDLED_UPDATES
                )
                for update in updates:
                    await self._store(update.to_dict(), update)
                    offset = update.update_id + 1
                pause = 0.0
            except Exception as e:
                log.warning("Telegram polling error (will retry in %g s): %s", pause, _one_line(e))
                await asyncio.sleep(pause)
                pause = min(max(pause * 2, 1.0), TELEGRAM_POLL_RETRY_MAX_S)

    async def on_webhook(self, request: web.Request) -> web.Response:
        """Telegram's POST of one update: 403 without the right secret; 200 only once it is stored in the inbox
        (503 while the database is away: Telegram delivers it again later)."""
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not hmac.compare_digest(given, self._secret):
            return web.Response(status=403, text="wrong or missing secret token")
        try:
            data = await request.json()
            update = Update.de_json(data, self.app.bot)
        except Exception:
            return web.Response(status=400, text="not a Telegram update")
        try:
            await self._store(data, update)
        except Exception as e:
            log.warning("could not store a Telegram update (%s); Telegram will deliver it again", _one_line(e))
            return web.Response(status=503, text="try again later")
        return web.Response(text="ok")

    async def _store(self, data: dict[str, Any], update: Update) -> None:
        """Put an update in the inbox under its chat (updates of one chat are handled one at a time, in order)."""
        chat, user = update.effective_chat, update.effective_user
        key = f"telegram:{chat.id}" if chat else f"telegram:user:{user.id}" if user else "telegram:-"
        await self.core.receive("telegram", update.update_id, key, data, update)

    def _parse(self, payload: dict[str, Any]) -> Update:
        """A stored update's payload as PTB's Update (bound to this bot)."""
        return Update.de_json(payload, self.app.bot)

    async def _on_stored(self, delivery: Delivery) -> None:
        """Handle a stored update with the handlers (its delivery reaches the turn through `_deliveries`)."""
        update: Update = delivery.update
        self._deliveries[update.update_id] = delivery
        try:
            await self.app.process_update(update)
        finally:
            self._deliveries.pop(update.update_id, None)

    # ---- translation -------------------------------------------------------------------------

    def _addressed(self, msg: Message) -> bool:
        """Private chats always; groups when the bot is @mentioned or replied to."""
        if msg.chat.type == ChatType.PRIVATE:
            return True
        reply = msg.reply_to_message
        if reply is not None and reply.from_user is not None and reply.from_user.id == self.bot_id:
            return True
        mention = f"@{self.username}".lower()
        parsed = msg.parse_entities([MessageEntity.MENTION]) or msg.parse_caption_entities([MessageEntity.MENTION])
        return any(v.lower() == mention for v in parsed.values())

    def _incoming(self, msg: Message, text: str) -> Incoming:
        """The core's view of a Telegram message: a forward's text is someone else's (quoted, the speaker said
        nothing), and so is a quote or a message of another chat replied to."""
        user = msg.from_user
        assert user is not None
        group = msg.chat.type != ChatType.PRIVATE
        if msg.forward_origin is not None:
            text = ""
        if self.username:
            text = text.replace(f"@{self.username}", "").strip()
        return Incoming(
            platform="telegram",
            user_id=str(user.id),
            chat_id=str(msg.chat.id),
            thread_id=str(msg.message_thread_id) if msg.is_topic_message and msg.message_thread_id else "",
            chat_kind="group" if group else "private",
            chat_title=msg.chat.title or "",
            text=text,
            user_name=user.full_name,
            message_id=str(msg.message_id),
            reply_to=str(msg.reply_to_message.message_id) if msg.reply_to_message else None,
            quoted=quoted_of(msg),
        )

    # ---- handlers ----------------------------------------------------------------------------

    async def _on_text(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """A text (or captioned) message: a turn when addressed."""
        msg = update.message
        if msg is None or msg.from_user is None or msg.from_user.is_bot or not self._addressed(msg):
            return
        await self._turn(
            self._incoming(msg, msg.text or msg.caption or ""), msg, self._deliveries.get(update.update_id)
        )

    async def _on_other(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Photos, stickers, voice…: a short "text only" answer when addressed to the bot."""
        msg = update.message
        if msg is None or msg.from_user is None or msg.from_user.is_bot or not self._addressed(msg):
            return
        inc = self._incoming(msg, "")
        if not self.core.is_allowed(inc):
            await self._refuse(inc, msg)
            return
        await self._send_parts(msg, [esc(TEXT_ONLY)])

    async def _command(
        self, update: Update, name: CommandName, arg: str = "", *, private: str | None = None, **kwargs: Any
    ) -> None:
        """Ask the core for a command's answer and send it; `private` (the command as typed) sends it to the
        user's private chat when asked in a group (with `kwargs` such as buttons). A refusal is sent where the
        command was asked."""
        msg = update.message
        if msg is None or msg.from_user is None or msg.from_user.is_bot:
            return
        inc = self._incoming(msg, msg.text or "")
        answer = await self.core.command(inc, name, arg)
        if isinstance(answer, Error):
            await self._send_parts(msg, [esc(answer.message)])
        elif answer is not None and private is not None:
            await self._answer_privately(inc, msg, answer, private, **kwargs)
        elif answer is not None:
            await self._send_parts(msg, split_html(markdown_to_html(answer)))

    async def _on_help(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/start and /help."""
        await self._command(update, "help")

    async def _on_tasks(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/tasks: the user's open tasks, without the LLM (privately when asked in a group)."""
        await self._command(update, "tasks", private="/tasks")

    async def _on_timezone(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/timezone [Area/City]: show or set (the answer privately when asked in a group)."""
        await self._command(update, "timezone", " ".join(context.args or []), private="/timezone")

    async def _on_memory(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/memory [forget <block> <line> | wipe [confirm]]: privately when asked in a group; `wipe` gets a
        confirmation button."""
        arg = " ".join(context.args or [])
        extra: dict[str, Any] = {}
        if arg.lower().split() == ["wipe"] and update.message is not None and update.message.from_user is not None:
            # the id only routes the press: the core acts on the presser, and a press by anyone else is ignored
            owner = update.message.from_user.id
            extra["reply_markup"] = InlineKeyboardMarkup(
                [[InlineKeyboardButton(WIPE_LABEL, callback_data=f"mem:wipe:{owner}")]]
            )
        await self._command(update, "memory", arg, private="/memory", **extra)

    async def _on_memory_button(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """A press of "Yes, wipe my memory": only by the person it was offered to, in their private chat."""
        query = update.callback_query
        if query is None or query.data is None:
            return
        presser = self._presser(query)
        if query.data != f"mem:wipe:{presser.user_id}" or presser.chat_id != presser.user_id:  # their private chat
            await query.answer(NOT_YOUR_BUTTON, show_alert=True)
            return
        answer = await self.core.command(presser, "memory", MEMORY_WIPE_CONFIRM, must_answer=True)
        if isinstance(answer, Error) or answer is None:
            await query.answer(answer.message if answer else None, show_alert=True)
            return
        await query.answer()
        if isinstance(query.message, Message):
            await query.edit_message_text(markdown_to_html(answer), parse_mode=ParseMode.HTML)

    async def _answer_privately(self, inc: Incoming, msg: Message, markdown: str, command: str, **kwargs: Any) -> None:
        """Personal data goes to the user's private chat; a group only sees a short note."""
        parts = split_html(markdown_to_html(markdown))
        if msg.chat.type == ChatType.PRIVATE:
            await self._send_parts(msg, parts, **kwargs)
            return
        try:
            await self._deliver(int(inc.user_id), parts, **kwargs)
            note = SENT_PRIVATELY
        except (Forbidden, BadRequest) as e:
            if _refusal(e) is None:
                raise
            log.info("cannot message user %s privately: %s", inc.user_id, e)  # they never started the bot
            note = (
                f"I can't message you privately yet: open t.me/{self.username}, press Start, then send {command} there."
            )
        await self._send_parts(msg, [esc(note)])

    async def _on_reset(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/reset: a fresh conversation (old messages stay stored)."""
        await self._command(update, "reset")

    async def _on_status(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/status: version, uptime, model, adapters, last poll, pending reminders (privately when asked in a group:
        it shows hosts and process ids)."""
        await self._command(update, "status", private="/status")

    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        """The one error funnel: log with the traceback, tell the user briefly."""
        log.error("Telegram handler failed", exc_info=context.error)
        if isinstance(update, Update) and update.effective_chat is not None:
            with contextlib.suppress(TelegramError):
                await self.app.bot.send_message(update.effective_chat.id, FAILED)

    # ---- reminders ---------------------------------------------------------------------------

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Push a reminder into its chat (mentioning the owner in groups) with Done / Snooze buttons; a permanent
        refusal (blocked, kicked, chat gone) is DeliveryRefused, anything else propagates as transient."""
        try:
            return await self._send_reminder(msg)
        except TelegramError as e:
            reason = _refusal(e)
            if reason is None:
                raise
            raise DeliveryRefused(reason) from e

    async def _send_reminder(self, msg: ReminderMessage) -> str | None:
        """Send the parts Telegram does not have yet (a retry of one cut short), each recorded as it is accepted;
        return the id of the last message, which holds the buttons (None when every part was sent before)."""
        body = markdown_to_html(msg.text)
        if msg.chat_kind == "group":
            body = f'<a href="tg://user?id={int(msg.owner_id)}">{esc(msg.owner_name or "you")}</a> {body}'
        parts = split_html(body)
        if msg.sent_parts >= len(parts):
            log.info("reminder for task %s was sent before its attempt failed; not sent again", msg.task_id)
            return None
        keyboard = InlineKeyboardMarkup(
            [[InlineKeyboardButton(BUTTON_LABELS[b], callback_data=f"rem:{b}:{msg.task_id}") for b in msg.buttons]]
        )
        thread = int(msg.thread_id) if msg.thread_id else None
        sent = await self._deliver(
            int(msg.chat_id), parts, first=msg.sent_parts, sent=msg.mark_sent, reply_markup=keyboard,
            message_thread_id=thread,
        )  # fmt: skip
        return str(sent[-1].message_id)

    def _presser(self, query: CallbackQuery) -> Incoming:
        """The core's view of a button press: who pressed it, in which chat."""
        chat = query.message.chat if query.message is not None else None
        group = chat is not None and chat.type != ChatType.PRIVATE
        return Incoming(
            platform="telegram", user_id=str(query.from_user.id), chat_id=str(chat.id if chat else query.from_user.id),
            chat_kind="group" if group else "private", chat_title=(chat.title or "") if chat else "", text="",
            user_name=query.from_user.full_name,
        )  # fmt: skip

    async def _on_button(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Done / Snooze pressed: only the owner may; the message is edited to show what happened."""
        query = update.callback_query
        if query is None or query.data is None:
            return
        _, action, task_id = query.data.split(":", 2)
        ok, text = await self.core.press_reminder(self._presser(query), int(task_id), action)
        await query.answer(text, show_alert=not ok)
        if ok and isinstance(query.message, Message):
            original = query.message.text or ""
            await query.edit_message_text(f"{esc(original)}\n\n{esc(text)}", parse_mode=ParseMode.HTML)

    # ---- a turn --------------------------------------------------------------------------------

    async def _turn(self, inc: Incoming, msg: Message, delivery: Delivery | None) -> None:
        """Run the core on one message with live feedback, then send the reply."""
        private = msg.chat.type == ChatType.PRIVATE
        typing = asyncio.create_task(self._keep_typing(msg))
        draft = _Draft(self, msg) if private else None
        try:
            async with aclosing(self.core.handle(inc, stream=private, delivery=delivery)) as events:
                async for event in events:
                    if isinstance(event, AssistantDelta) and draft is not None:
                        await draft.add(event.text)
                    elif isinstance(event, Assistant):
                        await self._send_answer(msg, event)
                    elif isinstance(event, Error):
                        await self._send_parts(msg, [esc(event.message)])
                        if event.turn_id is not None:  # an error answer is recorded as sent like any answer
                            await self.core.mark_sent(event.turn_id, 1)
        finally:
            typing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await typing

    async def _send_answer(self, msg: Message, answer: Assistant) -> None:
        """Send the parts of an answer that Telegram does not have yet, recording each one right after it is sent
        (the update may be taken again by another process if this one dies before the inbox marks it done)."""
        turn_id = answer.turn_id

        async def sent(parts: int) -> None:
            if turn_id is not None:
                await self.core.mark_sent(turn_id, parts)

        parts = render_reply(answer.text, answer.steps, answer.elapsed_s)
        if answer.sent_parts >= len(parts):
            log.info("answer of turn %s was sent before its process died; not sent again", turn_id)
            return
        await self._send_parts(msg, parts, first=answer.sent_parts, sent=sent)

    async def _keep_typing(self, msg: Message) -> None:
        """Show "typing…" once the turn takes longer than TELEGRAM_TYPING_AFTER_S and refresh it until cancelled."""
        thread = msg.message_thread_id if msg.is_topic_message else None
        await asyncio.sleep(TELEGRAM_TYPING_AFTER_S)
        while True:
            with contextlib.suppress(TelegramError):  # best effort: dropped while rate limited, never retried
                await self.app.bot.send_chat_action(
                    msg.chat.id, ChatAction.TYPING, message_thread_id=thread, read_timeout=TELEGRAM_PREVIEW_TIMEOUT_S
                )
            await asyncio.sleep(TELEGRAM_TYPING_EVERY_S)

    async def _refuse(self, inc: Incoming, msg: Message) -> None:
        """The polite refusal with the user's id (rate-limited by the core)."""
        refusal = await self.core.refusal(inc)
        if refusal is not None:
            await self._send_parts(msg, [esc(refusal.message)])

    async def _send_parts(self, msg: Message, parts: Sequence[str], **kwargs: Any) -> list[Message]:
        """Send HTML parts in order to the message's chat (and topic); in groups the first part replies to the user
        (`kwargs` such as reply_markup go to _deliver)."""
        thread = msg.message_thread_id if msg.is_topic_message else None
        reply = (
            ReplyParameters(msg.message_id, allow_sending_without_reply=True)
            if msg.chat.type != ChatType.PRIVATE
            else None
        )
        return await self._deliver(msg.chat.id, parts, message_thread_id=thread, reply_parameters=reply, **kwargs)

    async def _deliver(
        self,
        chat_id: int,
        parts: Sequence[str],
        *,
        first: int = 0,
        sent: Callable[[int], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> list[Message]:
        """Send HTML parts in order, from part `first` on, awaiting `sent(parts sent so far)` after each one:
        reply_parameters go with the first message, reply_markup with the last; a part Telegram rejects is resent
        as plain text and nothing is ever sent as nothing, so a reply is never lost."""
        parts = [p for p in parts if p.strip()] or [esc(EMPTY_REPLY)]
        out: list[Message] = []
        for i in range(first, len(parts)):
            out += await self._send_html(chat_id, parts[i], **_part_kwargs(kwargs, i, len(parts)))
            if sent is not None:
                await sent(i + 1)
        return out

    async def _send_html(self, chat_id: int, html_text: str, **kwargs: Any) -> list[Message]:
        """Send one HTML message without link previews; on any 400 but a closed chat (bad HTML, too long, empty
        after parsing…) resend its text as plain text, split at Telegram's limit."""
        kwargs["link_preview_options"] = LinkPreviewOptions(is_disabled=True)
        try:
            return [await self.app.bot.send_message(chat_id, html_text, parse_mode=ParseMode.HTML, **kwargs)]
        except BadRequest as e:
            if _refusal(e) is not None:
                raise
            log.warning("Telegram rejected a reply part (%s); resending it as plain text", e)
        text = plain_text(html_text).strip()
        pieces = [p for p in split_plain(text) if p.strip()] if text else []
        pieces = pieces or [EMPTY_REPLY]
        return [
            await self.app.bot.send_message(chat_id, piece, **_part_kwargs(kwargs, i, len(pieces)))
            for i, piece in enumerate(pieces)
        ]


def _part_kwargs(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """The send options of part i of n: the reply reference on the first part only, buttons on the last only."""
    out = dict(kwargs)
    if i > 0:
        out.pop("reply_parameters", None)
    if i < n - 1:
        out.pop("reply_markup", None)
    return out


def _refusal(e: TelegramError) -> str | None:
    """Why Telegram permanently refuses to deliver to a chat (blocked, kicked, chat gone), or None if it doesn't."""
    if isinstance(e, Forbidden):
        return e.message.removeprefix("Forbidden: ")
    if isinstance(e, ChatMigrated):
        return f"the group became a supergroup with the id {e.new_chat_id}"
    if isinstance(e, BadRequest) and any(k in e.message.lower() for k in CHAT_GONE):
        return e.message
    return None


def _one_line(e: BaseException) -> str:
    """The error's message on one line (its type when it says nothing), without a bot token."""
    return " ".join(redact_token(str(e)).split()) or type(e).__name__


def _host(base_url: str | None) -> str:
    """The host (and port) of the Bot API URL, for error messages."""
    if not base_url:
        return DEFAULT_API_HOST
    parts = urlsplit(base_url if "://" in base_url else f"https://{base_url}")
    try:
        port = parts.port
    except ValueError:  # not a number: aiohttp will say so when connecting
        port = None
    host = parts.hostname or "the TELEGRAM_API_BASE_URL host"
    return f"{host}:{port}" if port else host


class _Draft:
    """The streamed answer shown with sendMessageDraft in a private chat (throttled, best effort)."""

    def __init__(self, adapter: TelegramAdapter, msg: Message) -> None:
        """Start an empty draft for the reply to `msg`."""
        self.adapter, self.msg = adapter, msg
        self.text = ""
        self.last = time.monotonic()  # a fast answer needs no draft: the first waits DRAFT_EVERY_S
        self.draft_id = msg.message_id or 1

    async def add(self, delta: str) -> None:
        """Append streamed text; push it at most every TELEGRAM_DRAFT_EVERY_S."""
        self.text += delta
        now = time.monotonic()
        if now - self.last < TELEGRAM_DRAFT_EVERY_S or not self.text.strip():
            return
        self.last = now
        try:
            await self.adapter.app.bot.send_message_draft(
                self.msg.chat.id,
                self.draft_id,
                self.text[-TELEGRAM_DRAFT_CHARS:],
                read_timeout=TELEGRAM_PREVIEW_TIMEOUT_S,
            )
        except TelegramError as e:  # a draft is only a preview: never let it disturb the answer
            log.debug("draft update failed: %s", e)
