"""The reply port of one Telegram message: the core sends its turn's answer through it ("typing…", the streamed draft
in a private chat, the HTML parts with the activity and Allow buttons, an error line, the answer read aloud)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from telegram import Message

from adapters.telegram.render import esc, render_reply
from adapters.telegram.send import Draft, Sender, keyboard
from core import Allow, Assistant, Button, Error, QuietReply, Spoken

log = logging.getLogger(__name__)


class TelegramReply(QuietReply):
    """Answers `msg` in its chat (and topic) through `send`."""

    def __init__(self, send: Sender, msg: Message, *, private: bool) -> None:
        """Reply to `msg`; a `private` chat sees the answer while it is written."""
        self.send, self.msg, self.streams = send, msg, private
        self._draft: Draft | None = send.draft(msg) if self.streams else None

    @asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """ "typing…" while the turn is slow (see Typing)."""
        typing = self.send.typing(self.msg)
        try:
            yield
        finally:
            await typing.stop()

    async def draft(self, text: str) -> None:
        """The streamed draft (throttled, best effort)."""
        if self._draft is not None:
            await self._draft.add(text)

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The parts Telegram does not have yet, yielding as each is sent, with an "Allow" button per call the answer
        waits on under the last."""
        parts = render_reply(answer.text, answer.steps, answer.elapsed_s)
        if answer.sent_parts >= len(parts):
            log.info("answer of turn %s was sent before its process died; not sent again", answer.turn_id)
            return
        allow = tuple((Button(f"✅ {ask.label}", Allow(ask.id)),) for ask in answer.asks)
        async for count, _ in self.send.replying(self.msg, parts, first=answer.sent_parts, **keyboard(allow)):
            yield count

    async def error(self, error: Error) -> None:
        """One line."""
        await self.send.reply(self.msg, [esc(error.message)])

    async def voice(self, spoken: Spoken) -> None:
        """A voice note replying to the message (/voice on)."""
        await self.send.voice(self.msg, spoken.data)
