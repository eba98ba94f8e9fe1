"""Sending to Telegram: HTML parts in order with a plain-text fallback, reminders with their buttons, and the
live feedback of a turn ("typing…", the streamed draft)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, LinkPreviewOptions, Message, ReplyParameters
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, ChatMigrated, Forbidden, TelegramError

from adapters.telegram.limits import (
    TELEGRAM_BUTTON_LABEL,
    TELEGRAM_DRAFT_CHARS,
    TELEGRAM_DRAFT_EVERY_S,
    TELEGRAM_PREVIEW_TIMEOUT_S,
    TELEGRAM_TYPING_AFTER_S,
    TELEGRAM_TYPING_EVERY_S,
    TELEGRAM_UPLOAD_TIMEOUT_S,
)
from adapters.telegram.render import esc, markdown_to_html, plain_text, split_html, split_plain
from adapters.telegram.request import TelegramBot
from core import (
    EMPTY_ANSWER,
    REMINDER_BUTTON_LABELS,
    Button,
    DeliveryRefused,
    FileAnswer,
    OnTask,
    ReminderMessage,
    pack,
)

log = logging.getLogger(__name__)

Sent = Callable[[int], Awaitable[None]]  # awaited with the number of parts sent so far, after each part

NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
VOICE_FILE_NAME = "answer.ogg"  # an answer read aloud, sent as a voice note
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


class Sender:
    """Puts replies and reminders into Telegram chats; a reply is never lost to bad HTML or to nothing to send."""

    def __init__(self, bot: TelegramBot) -> None:
        """Send through `bot` (its rate limiter paces the messages)."""
        self.bot = bot

    async def reply(self, msg: Message, parts: Sequence[str], **kwargs: Any) -> list[Message]:
        """Send HTML parts in order to the message's chat (and topic); in groups the first part replies to the user
        (`kwargs` such as reply_markup go to deliver)."""
        return [m async for _, sent in self.replying(msg, parts, **kwargs) for m in sent]

    def replying(self, msg: Message, parts: Sequence[str], **kwargs: Any) -> AsyncIterator[tuple[int, list[Message]]]:
        """reply's parts one at a time, as `sending` yields them."""
        thread = msg.message_thread_id if msg.is_topic_message else None
        private = msg.chat.type == ChatType.PRIVATE
        reply = None if private else ReplyParameters(msg.message_id, allow_sending_without_reply=True)
        return self.sending(msg.chat.id, parts, message_thread_id=thread, reply_parameters=reply, **kwargs)

    async def deliver(
        self, chat_id: int, parts: Sequence[str], *, sent: Sent | None = None, **kwargs: Any
    ) -> list[Message]:
        """Send HTML parts (see `sending`), awaiting `sent(parts sent so far)` after each one."""
        out: list[Message] = []
        async for count, messages in self.sending(chat_id, parts, **kwargs):
            out += messages
            if sent is not None:
                await sent(count)
        return out

    async def sending(
        self, chat_id: int, parts: Sequence[str], *, first: int = 0, **kwargs: Any
    ) -> AsyncIterator[tuple[int, list[Message]]]:
        """Send HTML parts in order, from part `first` on, yielding after each one how many parts Telegram has and
        the messages it took: reply_parameters go with the first message, reply_markup with the last; a part Telegram
        rejects is resent as plain text and nothing is ever sent as nothing, so a reply is never lost."""
        parts = [p for p in parts if p.strip()] or [esc(EMPTY_ANSWER)]
        for i in range(first, len(parts)):
            yield i + 1, await self._html(chat_id, parts[i], **_part_kwargs(kwargs, i, len(parts)))

    async def _html(self, chat_id: int, html_text: str, **kwargs: Any) -> list[Message]:
        """Send one HTML message without link previews; on any 400 but a closed chat (bad HTML, too long, empty
        after parsing…) resend its text as plain text, split at Telegram's limit."""
        kwargs["link_preview_options"] = NO_PREVIEW
        try:
            return [await self.bot.send_message(chat_id, html_text, parse_mode=ParseMode.HTML, **kwargs)]
        except BadRequest as e:
            if refusal(e) is not None:
                raise
            log.warning("Telegram rejected a reply part (%s); resending it as plain text", e)
        text = plain_text(html_text).strip()
        pieces = (split_plain(text) if text else []) or [EMPTY_ANSWER]
        return [
            await self.bot.send_message(chat_id, piece, **_part_kwargs(kwargs, i, len(pieces)))
            for i, piece in enumerate(pieces)
        ]

    async def document(self, chat_id: int, answer: FileAnswer) -> Message:
        """Send a file answer (an export) with its text as the caption."""
        return await self.bot.send_document(
            chat_id,
            answer.data,
            filename=answer.filename,
            caption=markdown_to_html(answer.text),
            parse_mode=ParseMode.HTML,
            write_timeout=TELEGRAM_UPLOAD_TIMEOUT_S,
        )

    async def voice(self, msg: Message, data: bytes) -> Message | None:
        """Send an answer read aloud (OGG/Opus) as a voice note replying to `msg`; best effort: a refusal (their
        privacy settings forbid voice notes, a rate limit past its budget) is logged, the text answer stands."""
        thread = msg.message_thread_id if msg.is_topic_message else None
        reply = ReplyParameters(msg.message_id, allow_sending_without_reply=True)
        try:
            return await self.bot.send_voice(
                msg.chat.id,
                data,
                filename=VOICE_FILE_NAME,
                message_thread_id=thread,
                reply_parameters=reply,
                write_timeout=TELEGRAM_UPLOAD_TIMEOUT_S,
            )
        except TelegramError as e:
            log.warning("the answer read aloud could not be sent to chat %s: %s", msg.chat.id, e)
            return None

    async def reminder(self, msg: ReminderMessage) -> str | None:
        """Push a reminder into its chat (mentioning the owner in groups) with its buttons; a permanent refusal
        (blocked, kicked, chat gone) is DeliveryRefused, anything else propagates as transient."""
        try:
            return await self._reminder(msg)
        except TelegramError as e:
            reason = refusal(e)
            if reason is None:
                raise
            raise DeliveryRefused(reason) from e

    async def _reminder(self, msg: ReminderMessage) -> str | None:
        """Send the parts Telegram does not have yet (a retry of one cut short), each recorded as it is accepted;
        return the id of the last message, which holds the buttons (None when every part was sent before)."""
        body = markdown_to_html(msg.text)
        if msg.chat_kind == "group":
            body = f'<a href="tg://user?id={int(msg.owner_id)}">{esc(msg.owner_name or "you")}</a> {body}'
        parts = split_html(body)
        if msg.sent_parts >= len(parts):
            log.info("reminder for task %s was sent before its attempt failed; not sent again", msg.task_id)
            return None
        buttons = [
            InlineKeyboardButton(REMINDER_BUTTON_LABELS[b], callback_data=pack(OnTask(b, msg.task_id)))
            for b in msg.buttons
        ]
        thread = int(msg.thread_id) if msg.thread_id else None
        sent = await self.deliver(
            int(msg.chat_id),
            parts,
            first=msg.sent_parts,
            sent=msg.mark_sent,
            reply_markup=InlineKeyboardMarkup([buttons]) if buttons else None,  # a link notice has none
            message_thread_id=thread,
        )
        return str(sent[-1].message_id)

    def typing(self, msg: Message) -> Typing:
        """ "typing…" in the message's chat from TELEGRAM_TYPING_AFTER_S on, until stopped."""
        return Typing(self.bot, msg)

    def draft(self, msg: Message) -> Draft:
        """An empty streamed draft of the reply to `msg` (private chats)."""
        return Draft(self.bot, msg)


class Typing:
    """Shows "typing…" once a turn takes longer than TELEGRAM_TYPING_AFTER_S and refreshes it until stopped (a timer
    until then: a quick turn costs no task)."""

    def __init__(self, bot: TelegramBot, msg: Message) -> None:
        """Start the timer."""
        self.bot, self.chat_id = bot, msg.chat.id
        self.thread = msg.message_thread_id if msg.is_topic_message else None
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(TELEGRAM_TYPING_AFTER_S, self._start)

    def _start(self) -> None:
        """The turn is slow: keep showing "typing…"."""
        self._task = asyncio.create_task(self._keep(), name="telegram typing")

    async def _keep(self) -> None:
        """Send the typing action every TELEGRAM_TYPING_EVERY_S until cancelled."""
        while True:
            with contextlib.suppress(TelegramError):  # best effort: dropped while rate limited, never retried
                await self.bot.send_chat_action(
                    self.chat_id,
                    ChatAction.TYPING,
                    message_thread_id=self.thread,
                    read_timeout=TELEGRAM_PREVIEW_TIMEOUT_S,
                )
            await asyncio.sleep(TELEGRAM_TYPING_EVERY_S)

    async def stop(self) -> None:
        """No more typing actions."""
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class Draft:
    """The streamed answer shown with sendMessageDraft in a private chat (throttled, best effort)."""

    def __init__(self, bot: TelegramBot, msg: Message) -> None:
        """Start an empty draft for the reply to `msg`."""
        self.bot, self.chat_id = bot, msg.chat.id
        self.text = ""
        self.last = time.monotonic()  # a fast answer needs no draft: the first waits TELEGRAM_DRAFT_EVERY_S
        self.draft_id = msg.message_id or 1

    async def add(self, delta: str) -> None:
        """Append streamed text; push it at most every TELEGRAM_DRAFT_EVERY_S."""
        self.text += delta
        now = time.monotonic()
        if now - self.last < TELEGRAM_DRAFT_EVERY_S or not self.text.strip():
            return
        self.last = now
        try:
            await self.bot.send_message_draft(
                self.chat_id, self.draft_id, self.text[-TELEGRAM_DRAFT_CHARS:], read_timeout=TELEGRAM_PREVIEW_TIMEOUT_S
            )
        except TelegramError as e:  # a draft is only a preview: never let it disturb the answer
            log.debug("draft update failed: %s", e)


def keyboard(rows: tuple[tuple[Button, ...], ...]) -> dict[str, Any]:
    """Buttons as Telegram's inline keyboard (the press packed into the callback data), for a send's keywords."""
    markup = [
        [InlineKeyboardButton(b.label[:TELEGRAM_BUTTON_LABEL], callback_data=pack(b.press)) for b in row]
        for row in rows
    ]
    return {"reply_markup": InlineKeyboardMarkup(markup)} if markup else {}


def _part_kwargs(kwargs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    """The send options of part i of n: the reply reference on the first part only, buttons on the last only."""
    out = dict(kwargs)
    if i > 0:
        out.pop("reply_parameters", None)
    if i < n - 1:
        out.pop("reply_markup", None)
    return out


def refusal(e: TelegramError) -> str | None:
    """Why Telegram permanently refuses to deliver to a chat (blocked, kicked, chat gone), or None if it doesn't."""
    if isinstance(e, Forbidden):
        return e.message.removeprefix("Forbidden: ")
    if isinstance(e, ChatMigrated):
        return f"the group became a supergroup with the id {e.new_chat_id}"
    if isinstance(e, BadRequest) and any(k in e.message.lower() for k in CHAT_GONE):
        return e.message
    return None
