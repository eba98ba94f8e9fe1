"""What each kind of Telegram update does: a turn of the core with live feedback, a command of the catalogue, the
"text only" note, files (an export) sent privately, the reminder, memory-wipe and /forget_me buttons, and the note when
a handler failed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from telegram import CallbackQuery, Message, Update
from telegram.constants import ParseMode
from telegram.error import BadRequest, Forbidden, TelegramError

from adapters.telegram.config import bot_id
from adapters.telegram.files import FileRefused, Media, download, media_of
from adapters.telegram.incoming import incoming, presser
from adapters.telegram.limits import TELEGRAM_MAX_DOWNLOAD_BYTES, TELEGRAM_UPLOAD_LIMIT
from adapters.telegram.render import esc, markdown_to_html, split_html
from adapters.telegram.reply import TelegramReply
from adapters.telegram.request import TelegramBot
from adapters.telegram.send import Sender, keyboard, refusal
from core import (
    FAILED,
    MODEL_NOT_YOURS,
    NOT_YOUR_BUTTON,
    NOT_YOUR_FORGET,
    NOT_YOUR_PRESS,
    SENT_PRIVATELY,
    TEXT_ONLY,
    Allow,
    Command,
    CommandArgs,
    CommandName,
    Confirm,
    Core,
    Delivery,
    Error,
    FileAnswer,
    Incoming,
    OnTask,
    Upload,
    UploadKind,
    file_too_large,
    sticker_text,
)

log = logging.getLogger(__name__)

# the kinds the core takes in, fetched for it (a JPEG, PNG or WebP sent as a file is a photo: files.media_of)
UPLOADED: dict[str, UploadKind] = {"voice": "voice", "audio": "audio", "document": "document", "photo": "photo"}
UPLOAD_NAMES = {"voice": "voice.ogg", "audio": "audio", "document": "document", "photo": "photo.jpg"}  # no file name
DESCRIBED = frozenset({"sticker", "animation"})  # said in words (emoji, file name): never downloaded, no image

WIPE_HOW = "send /memory wipe"  # Telegram's way to ask for a wipe, in NOT_YOUR_BUTTON
FORGET_HOW = "send /forget_me"  # Telegram's way to ask for a /forget_me, in NOT_YOUR_FORGET
NOT_YOURS = {  # what someone else pressing a person's confirmation or choice is told
    "memory": NOT_YOUR_BUTTON.format(how=WIPE_HOW),
    "forget_me": NOT_YOUR_FORGET.format(how=FORGET_HOW),
    "model": MODEL_NOT_YOURS,
}
NOT_STARTED = "I can't message you privately yet: open t.me/{bot}, press Start, then send {command} there."


class Handlers:
    """Answers routed updates through the core; the message's sender has been checked to be a person."""

    def __init__(self, core: Core, bot: TelegramBot, send: Sender) -> None:
        """Answer with `core`, as `bot`, through `send`."""
        self.core, self.bot, self.send = core, bot, send
        self.bot_id = bot_id(bot.token)

    def _incoming(self, msg: Message, text: str) -> Incoming:
        """The core's view of `msg` saying `text`."""
        return incoming(msg, text, self.bot.username, self.bot_id)

    async def turn(self, msg: Message, delivery: Delivery) -> None:
        """Have the core answer a text (or captioned) message, a voice note, a document or a photo through the
        message's reply port (files are fetched only when the core asks for them)."""
        inc = self._incoming(msg, msg.text or msg.caption or "")
        media = media_of(msg)
        if media is not None and media.kind in DESCRIBED:  # a sticker or GIF: its words, then the caption
            inc = replace(inc, text=described(media, inc.text))
        if media is not None and media.kind in UPLOADED:  # fetched when the core takes it in
            inc = replace(inc, uploads=(self._upload(media, inc.text),))
        await self.core.answer(
            inc, TelegramReply(self.send, msg, private=inc.chat_kind == "private"), delivery=delivery
        )

    async def allow_button(self, query: CallbackQuery, press: Allow) -> None:
        """ "Allow" pressed: the parked call runs (only for the person who was asked, once) and its result comes as a
        message of its own, as plain text; anyone else, a second or a late press gets one line as an alert."""
        ok, text = await self.core.allow_mcp(presser(query), press.ask_id)
        if not ok:
            await query.answer(text, show_alert=True)
            return
        with contextlib.suppress(BadRequest):  # a slow call: the press may be too old to answer now (the result goes)
            await query.answer()
        if isinstance(query.message, Message):
            await self.send.reply(query.message, split_html(esc(text)))

    def _upload(self, media: Media, caption: str = "") -> Upload:
        """A voice note, audio file, document or photo as the core takes it, fetched when it does: its bytes, or why
        they could not be fetched. A photo is named by its caption (without the bot's @mention), else its file name."""
        kind = UPLOADED[media.kind]
        name = (caption if kind == "photo" else "") or media.file_name or UPLOAD_NAMES[kind]
        base = Upload(kind, name, media.mime_type, None, platform_ref=media.file_id, duration_s=media.duration)

        async def load() -> Upload:
            try:
                data = await download(
                    self.bot, media.file_id, max_bytes=TELEGRAM_MAX_DOWNLOAD_BYTES, size=media.file_size
                )
            except FileRefused as e:
                return replace(base, refused=str(e))
            return replace(base, data=data)

        return replace(base, load=load)

    async def text_only(self, msg: Message) -> None:
        """A message the bot cannot read (a video, a location, a contact…): a short note saying what it reads (the
        refusal for someone who may not use the bot)."""
        inc = self._incoming(msg, "")
        if not self.core.is_allowed(inc):
            refused = await self.core.refusal(inc)  # once per chat within the hour
            if refused is not None:
                await self.send.reply(msg, [esc(refused.message)])
            return
        await self.send.reply(msg, [esc(TEXT_ONLY)])

    async def command(self, msg: Message, command: Command, args: str) -> None:
        """Ask the core for a command's answer (`args`: the text after it) and send it, with its buttons; a personal
        one (and a file: /export) goes to the user's private chat when asked in a group. A refusal is sent where the
        command was asked."""
        inc = self._incoming(msg, msg.text or "")
        answer = await self.core.command(inc, command.name, args)
        if isinstance(answer, Error):
            await self.send.reply(msg, [esc(answer.message)])
        elif isinstance(answer, FileAnswer):
            await self._file(inc, msg, answer, f"/{command.name}")
        elif answer is not None:
            text, extra = (answer, {}) if isinstance(answer, str) else (answer.text, keyboard(answer.rows))
            if command.private:
                await self._privately(inc, msg, text, f"/{command.name}", **extra)
            else:
                await self.send.reply(msg, split_html(markdown_to_html(text)), **extra)

    async def _privately(self, inc: Incoming, msg: Message, markdown: str, command: str, **kwargs: Any) -> None:
        """Personal data goes to the user's private chat; a group only sees a short note."""
        parts = split_html(markdown_to_html(markdown))
        if inc.chat_kind == "private":
            await self.send.reply(msg, parts, **kwargs)
            return
        await self._from_group(inc, msg, command, self.send.deliver(int(inc.user_id), parts, **kwargs))

    async def _file(self, inc: Incoming, msg: Message, answer: FileAnswer, command: str) -> None:
        """A file answer (an export) goes to the person's private chat only: a group sees a short note. One larger
        than Telegram lets a bot send is one line saying so, where it was asked."""
        if len(answer.data) > TELEGRAM_UPLOAD_LIMIT:
            await self.send.reply(msg, [esc(file_too_large(len(answer.data), TELEGRAM_UPLOAD_LIMIT))])
            return
        if inc.chat_kind == "private":
            await self.send.document(msg.chat.id, answer)
            return
        await self._from_group(inc, msg, command, self.send.document(int(inc.user_id), answer))

    async def _from_group(self, inc: Incoming, msg: Message, command: str, sending: Awaitable[object]) -> None:
        """Send an answer asked for in a group to the person's private chat, and tell the group it went there (or
        how to start the bot privately first, when Telegram does not let it write to them)."""
        try:
            await sending
            note = SENT_PRIVATELY
        except (Forbidden, BadRequest) as e:
            if refusal(e) is None:
                raise
            log.info("cannot message user %s privately: %s", inc.user_id, e)  # they never started the bot
            note = NOT_STARTED.format(bot=self.bot.username, command=command)
        await self.send.reply(msg, [esc(note)])

    async def reminder_button(self, query: CallbackQuery, press: OnTask) -> None:
        """Done / Snooze (or /remind's Undo) pressed: only the owner may; the message is edited to show what
        happened."""
        ok, text = await self.core.press_reminder(presser(query), press.task_id, press.action)
        await query.answer(text, show_alert=not ok)
        if ok and isinstance(query.message, Message):
            original = query.message.text or ""
            await query.edit_message_text(f"{esc(original)}\n\n{esc(text)}", parse_mode=ParseMode.HTML)

    async def confirm_button(self, query: CallbackQuery, press: Confirm) -> None:
        """A confirmation or a choice pressed (wipe my memory, delete everything, a model): only by the person it was
        offered to, in their private chat; the message under it then shows the command's answer."""
        person = presser(query)
        if press.owner != person.user_id or person.chat_id != person.user_id:  # their private chat
            await query.answer(NOT_YOURS.get(press.command, NOT_YOUR_PRESS), show_alert=True)
            return
        await self._confirmed(query, person, press.command, press.args)

    async def _confirmed(self, query: CallbackQuery, person: Incoming, name: CommandName, args: CommandArgs) -> None:
        """Run the command a button of its owner stands for, and edit the message under it to its answer (a refusal
        or an answer that is not text is shown as an alert)."""
        answer = await self.core.command(person, name, args, must_answer=True)
        if not isinstance(answer, str):
            await query.answer(answer.message if isinstance(answer, Error) else None, show_alert=True)
            return
        await query.answer()
        if isinstance(query.message, Message):
            await query.edit_message_text(markdown_to_html(answer), parse_mode=ParseMode.HTML)

    async def failed(self, update: Update) -> None:
        """Tell the update's chat that something went wrong (its handler failed; the traceback is logged)."""
        if update.effective_chat is not None:
            with contextlib.suppress(TelegramError):
                await self.bot.send_message(update.effective_chat.id, FAILED)


def described(media: Media, text: str) -> str:
    """A sticker (its emoji) or GIF (its file name) in words, before the text sent with it: no download, no image."""
    words = sticker_text(media.emoji, media.file_name, media.kind == "animation")
    return f"{words}\n{text}" if text else words
