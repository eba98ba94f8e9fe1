"""Which handler a stored Telegram update goes to, decided here in a few checks (not by PTB's handler and filter
dispatch), and the one error funnel around it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from telegram import CallbackQuery, Message, MessageEntity, Update
from telegram.ext import filters

from adapters.telegram.handlers import Handlers
from adapters.telegram.incoming import addressed
from adapters.telegram.request import TelegramBot
from core import COMMANDS, Allow, Command, Confirm, Delivery, OnTask, unpack

log = logging.getLogger(__name__)

CATALOGUE = {name: c for c in COMMANDS for name in (c.name, *c.aliases)}  # what a user may type after the slash
SERVICE = filters.StatusUpdate.ALL  # members joined or left, a pinned message, a new title…: PTB keeps the list


class Routes:
    """Hands each stored update to its handler; a handler failure is logged with its traceback and the user told."""

    def __init__(self, bot: TelegramBot, handlers: Handlers) -> None:
        """Route updates of `bot` to `handlers`."""
        self.bot, self.handlers = bot, handlers
        self._handling: set[asyncio.Task[Any]] = set()  # the inbox's tasks running a route now

    async def route(self, delivery: Delivery) -> None:
        """Handle one stored update (a new message or a button press; anything else is ignored)."""
        update: Update = delivery.update
        task = asyncio.current_task()
        assert task is not None
        self._handling.add(task)
        try:
            if update.message is not None:
                await self._message(update.message, delivery)
            elif update.callback_query is not None:
                await self._press(update.callback_query)
        except Exception:
            log.error("Telegram handler failed", exc_info=True)
            await self.handlers.failed(update)
        finally:
            self._handling.discard(task)

    async def finish(self, timeout: float) -> None:
        """Wait up to `timeout` s for the updates being handled: their answers need the bot's connections (the core's
        drain has waited for them already when the process stops)."""
        if self._handling:
            await asyncio.wait(set(self._handling), timeout=timeout)

    async def _message(self, msg: Message, delivery: Delivery) -> None:
        """A command of the catalogue (someone else's or an unknown one is ignored); text or a caption, a voice note, a
        file, a photo, a sticker or a GIF (Telegram sends one as a document too): a turn when addressed to the bot;
        anything else but a service message (a video, a video note): the "text only" note when addressed. Messages of
        bots are ignored, and a forward is someone else's text, never a command."""
        if msg.from_user is None or msg.from_user.is_bot:
            return
        if msg.forward_origin is None and starts_with_command(msg):
            found = command_of(msg, self.bot.username)
            if found is not None:
                await self.handlers.command(msg, *found)
        elif msg.text or msg.caption or msg.voice or msg.audio or msg.document or msg.photo or msg.sticker:  # media
            if addressed(msg, self.bot.id, self.bot.username):
                await self.handlers.turn(msg, delivery)
        elif not SERVICE.check_update(delivery.update) and addressed(msg, self.bot.id, self.bot.username):
            await self.handlers.text_only(msg)

    async def _press(self, query: CallbackQuery) -> None:
        """A reminder's Done / Snooze, the memory-wipe or /forget_me confirmation, a model button or an MCP call's
        "Allow"; other presses are ignored."""
        press = unpack(query.data or "")
        if isinstance(press, OnTask):
            await self.handlers.reminder_button(query, press)
        elif isinstance(press, Confirm):
            await self.handlers.confirm_button(query, press)
        elif isinstance(press, Allow):
            await self.handlers.allow_button(query, press)


def starts_with_command(msg: Message) -> bool:
    """Whether the text starts with a /command (any bot's)."""
    entities = msg.entities
    return bool(entities and msg.text) and entities[0].type == MessageEntity.BOT_COMMAND and entities[0].offset == 0


def command_of(msg: Message, username: str) -> tuple[Command, str] | None:
    """The catalogue's command a message starting with a /command asks for (`/name` or `/name@thisbot`, any case)
    and the text after it; None for a command of another bot or one the catalogue does not have."""
    assert msg.text is not None
    end = msg.entities[0].length
    name, *bot = msg.text[1:end].split("@")
    if bot and bot[0].lower() != username.lower():
        return None
    command = CATALOGUE.get(name.lower())
    return (command, msg.text[end:]) if command is not None else None
