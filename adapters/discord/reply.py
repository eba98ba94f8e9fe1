"""The reply ports of Discord: a stored message's answer in its channel, and /ask's as follow-ups of its interaction.
The core sends its turn's events through them."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import discord
from discord.abc import Messageable

from adapters.discord.buttons import AllowButton, StepsButton
from adapters.discord.limits import DISCORD_UPLOAD_LIMIT
from adapters.discord.render import render_reply, split_markdown
from adapters.discord.send import NO_MENTIONS, followups, keep_typing, send_parts, sending, stop_task, view
from core import Assistant, Error, QuietReply, Spoken

log = logging.getLogger(__name__)

VOICE_FILE_NAME = "answer.ogg"  # an answer read aloud, sent as a file


class ChannelReply(QuietReply):
    """Answers a stored message in its channel (replying to it in a server), with "typing…" until the answer."""

    def __init__(self, channel: Messageable, reference: discord.MessageReference | None) -> None:
        """Answer in `channel`, replying to `reference`."""
        self.channel, self.reference = channel, reference
        self._typing: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """The typing indicator, refreshed until the answer goes out."""
        self._typing = asyncio.create_task(keep_typing(self.channel))
        try:
            yield
        finally:
            await self._stop_typing()

    async def _stop_typing(self) -> None:
        """No more typing: the answer is here."""
        if self._typing is not None:
            await stop_task(self._typing)

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The parts Discord does not have yet, yielding as each is accepted; Show steps and an Allow button per call
        the answer waits on go under the last part."""
        await self._stop_typing()
        parts = render_reply(answer.text, answer.steps, answer.elapsed_s)
        if answer.sent_parts >= len(parts):
            log.info("answer of turn %s was sent before its process died; not sent again", answer.turn_id)
            return
        items: list[discord.ui.Item[Any]] = [StepsButton(answer.turn_id)] if answer.steps and answer.turn_id else []
        items += [AllowButton(ask.id, ask.label) for ask in answer.asks]  # calls waiting for the person's OK
        buttons = view(*items) if items else None
        first = answer.sent_parts
        async for count, _ in sending(self.channel, parts, reference=self.reference, buttons=buttons, first=first):
            yield count

    async def error(self, error: Error) -> None:
        """One line (split when long)."""
        await self._stop_typing()
        await send_parts(self.channel, split_markdown(error.message), reference=self.reference)

    async def voice(self, spoken: Spoken) -> None:
        """The answer read aloud as the file answer.ogg under the text answer; best effort: a refusal or a file
        larger than Discord lets a bot send is logged, the text answer stands."""
        if len(spoken.data) > DISCORD_UPLOAD_LIMIT:
            log.warning("the answer read aloud (%d bytes) is larger than Discord takes; not sent", len(spoken.data))
            return
        file = discord.File(io.BytesIO(spoken.data), filename=VOICE_FILE_NAME)
        extra: dict[str, Any] = {"reference": self.reference} if self.reference is not None else {}
        try:
            await self.channel.send(file=file, allowed_mentions=NO_MENTIONS, **extra)
        except discord.HTTPException as e:
            log.warning("the answer read aloud could not be sent: %s", e)


class InteractionReply(QuietReply):
    """Answers /ask as follow-ups of its deferred interaction ("thinking…" until then)."""

    def __init__(self, interaction: discord.Interaction) -> None:
        """Follow up `interaction`."""
        self.interaction = interaction
        self.answered = False  # nothing came: a duplicate delivery of the same interaction

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The answer's parts with Show steps under the last."""
        parts = render_reply(answer.text, answer.steps, answer.elapsed_s)
        steps = view(StepsButton(answer.turn_id)) if answer.steps and answer.turn_id else None
        await followups(self.interaction, parts, steps)
        self.answered = True
        yield len(parts)

    async def error(self, error: Error) -> None:
        """One line."""
        await followups(self.interaction, split_markdown(error.message), None)
        self.answered = True
