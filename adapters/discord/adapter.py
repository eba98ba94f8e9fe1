"""The Discord adapter (discord.py 2): start and stop, messages in (through the inbox) and their answers out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

import discord
from discord.abc import Messageable

from adapters.base import RunningAnswers
from adapters.discord.buttons import BUTTONS, ReminderButton
from adapters.discord.commands import install_commands
from adapters.discord.files import lazy
from adapters.discord.gateway import Client, Gateway
from adapters.discord.incoming import StoredMessage, addressed, bot_id, has_media, message_text, received
from adapters.discord.limits import DISCORD_CUT_NOTE_S, DISCORD_LIMITS
from adapters.discord.reply import ChannelReply
from adapters.discord.send import (
    NO_MENTIONS,
    briefly,
    deliver_reminder,
    reply_reference,
    send_parts,
    tell,
    view,
)
from core import (
    CUT_SHORT,
    FAILED,
    RESTARTING,
    TEXT_ONLY,
    Core,
    Delivery,
    ReminderMessage,
    Settings,
)

log = logging.getLogger(__name__)

LEGACY_SOURCE = "discord"  # the inbox key of messages stored before it named the bot


class DiscordAdapter:
    """Runs the bot on Discord inside the caller's event loop.

    A message the bot answers is stored in the core's inbox before its turn starts (Discord's gateway sends nothing
    again after a crash): the process that received it answers it at once, or another process (or the restarted one)
    after its lease runs out. Slash commands and buttons must be answered within 3 s by the process that got them,
    so they are answered directly."""

    platform = "discord"
    limits = DISCORD_LIMITS

    def __init__(
        self,
        core: Core,
        settings: Settings,
        *,
        guild_ready_timeout: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Prepare the client (not connected yet); `sleep` waits between reconnection attempts."""
        self.core = core
        self.channels = settings.discord_channels
        shards = settings.discord_shards
        # one process uploads the slash commands: the one running shard 0 (or the only one, unsharded)
        self.syncs_commands = shards is None or 0 in shards[1]
        self.gateway = Gateway(self, core, settings, guild_ready_timeout=guild_ready_timeout, sleep=sleep)
        self.running = RunningAnswers("Discord", settings.SHUTDOWN_GRACE_SECONDS, DISCORD_CUT_NOTE_S)
        # the inbox key of this bot's messages, `discord:<bot user id>` once logged in: another bot's process on the
        # same database never takes them, and a message both bots see is stored once for each
        self.source = LEGACY_SOURCE

    @property
    def client(self) -> Client:
        """The current discord.py client (a new one replaces a connection that ended for good)."""
        return self.gateway.client

    @property
    def ready_timeout(self) -> float:
        """How long start() waits for READY."""
        return self.gateway.ready_timeout

    # ---- start and stop ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect until READY (a failure is a one-line StartupError), then answer this bot's stored messages (and
        those a version that did not name the bot stored and left unanswered)."""
        self.running.restart()
        await self.gateway.start()
        for source in {self.source, LEGACY_SOURCE}:
            self.core.serve(source, StoredMessage.from_payload, self._on_stored)

    async def setup(self, client: Client) -> None:
        """Once per login: the bot's inbox key (its id is known now), persistent buttons, slash commands (uploaded
        only when they changed)."""
        self.source = f"discord:{bot_id(client)}"
        client.add_dynamic_items(*BUTTONS)
        await install_commands(client, self, sync=self.syncs_commands)

    async def stop(self) -> None:
        """Stop taking new messages, let running answers finish and be sent (at most SHUTDOWN_GRACE_SECONDS;
        later ones are cut with a short note), then close the connection."""
        self.running.stopping = True
        for source in {self.source, LEGACY_SOURCE}:
            self.core.unserve(source)
        await self.running.drain()
        await self.gateway.close()
        self.core.report_state("discord", None)

    # ---- messages in -------------------------------------------------------------------------------

    async def on_message(self, message: discord.Message) -> None:
        """A message: stored for its turn when addressed to the bot; the bot's own and other bots' messages are
        ignored, and what needs no turn (a refusal, "text only") is answered here."""
        if message.author.bot or message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return
        if not addressed(self.client, message, self.channels):
            return
        with self.running.tracked():
            try:
                await self._receive(message)
            except Exception as e:
                await self._fail_message(message.channel, e)

    async def _receive(self, message: discord.Message) -> None:
        """Store an addressed message in the inbox (it starts here at once when it can), or answer it directly."""
        text = message_text(self.client, message)
        stored = received(self.client, message, text)
        inc = stored.incoming
        reference = reply_reference(message.id, message.channel.id, stored.guild_id)
        if self.running.stopping:  # a new session would not see it again: ask for it later
            if self.core.is_allowed(inc):
                await send_parts(message.channel, [RESTARTING], reference=reference)
        elif not self.core.is_allowed(inc):
            refusal = await self.core.refusal(inc)  # at most once per chat per hour
            if refusal is not None:
                await send_parts(message.channel, [refusal.message], reference=reference)
        elif not inc.text and not inc.quoted and not stored.files:  # e.g. a forwarded image alone: not read
            if has_media(message):
                await send_parts(message.channel, [TEXT_ONLY], reference=reference)
        else:
            await self.core.receive(self.source, stored.message_id, inc.chat_key, stored.payload(), stored)

    async def _on_stored(self, delivery: Delivery) -> None:
        """A stored message's turn, in the process that received it or another one: replied to by ids."""
        stored: StoredMessage = delivery.update
        await self.gateway.connected_once()
        if self.running.stopping:  # declined: the inbox hands it back at once for another process (or the next start)
            raise asyncio.CancelledError
        channel = self.client.get_partial_messageable(stored.channel_id, guild_id=stored.guild_id)
        reference = reply_reference(stored.message_id, stored.channel_id, stored.guild_id)
        with self.running.tracked():
            try:
                await self._turn(stored, channel, reference, delivery)
            except asyncio.CancelledError:  # the core's drain hands it back (another process answers): no note
                if self.running.cutting:  # … but stop() itself cut it
                    await briefly(send_parts(channel, [CUT_SHORT], reference=reference))
                raise
            except Exception as e:
                await self._fail_message(channel, e)

    # ---- answers out -------------------------------------------------------------------------------

    async def _turn(
        self,
        stored: StoredMessage,
        channel: Messageable,
        reference: discord.MessageReference | None,
        delivery: Delivery,
    ) -> None:
        """Have the core answer one message (with its voice messages, documents and photos, downloaded when the
        core takes them in) through the channel's reply port."""
        inc = stored.incoming
        if stored.files:
            inc = replace(inc, uploads=tuple(lazy(self.client, f) for f in stored.files))
        await self.core.answer(inc, ChannelReply(channel, reference), delivery=delivery)

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Push a reminder into its channel with Done / Snooze buttons (see send.deliver_reminder)."""
        channel = self.client.get_partial_messageable(int(msg.thread_id or msg.chat_id))
        buttons = view(*(ReminderButton(b, msg.task_id) for b in msg.buttons))
        return await deliver_reminder(channel, msg, buttons)

    # ---- the error funnel --------------------------------------------------------------------------

    async def guard(self, interaction: discord.Interaction, work: Coroutine[Any, Any, None]) -> None:
        """Run an interaction's work as running work for stop(); any failure is logged and answered briefly;
        while stopping, new work is turned away."""
        if self.running.stopping:
            work.close()
            await tell(interaction, RESTARTING)
            return
        with self.running.tracked():
            try:
                await work
            except asyncio.CancelledError:  # only a shutdown cancels an answer (stop() or the core's drain)
                await briefly(tell(interaction, CUT_SHORT))
                raise
            except Exception as e:
                await self.fail(interaction, e)

    async def fail(self, interaction: discord.Interaction, error: BaseException) -> None:
        """Log with the traceback and tell the user briefly (only they see it)."""
        log.error("Discord interaction failed", exc_info=error)
        await tell(interaction, FAILED)

    async def _fail_message(self, channel: Messageable, error: BaseException) -> None:
        """Log with the traceback and answer in the message's channel briefly."""
        log.error("Discord message handler failed", exc_info=error)
        with contextlib.suppress(discord.HTTPException):
            await channel.send(FAILED, allowed_mentions=NO_MENTIONS)
