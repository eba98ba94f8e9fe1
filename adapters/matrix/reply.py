"""The reply port of Matrix: a stored message's answer in its room (in progress: the answer's parts as plain m.text;
typing, the steps' <details>, edits for drafts and reactions for the buttons come next)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from mautrix.client import ClientAPI
from mautrix.types import EventType, RoomID

from adapters.matrix.render import content, parts
from core import Assistant, Error, QuietReply

log = logging.getLogger(__name__)


class RoomReply(QuietReply):
    """Answers a stored message in its room. Each part goes with a transaction id made of the message's event id
    and the part's index: a send that is tried again (the same process, or another one after a crash between the
    homeserver taking it and the core recording it) is the same event, not a second one."""

    def __init__(self, client: ClientAPI, room_id: str, event_id: str) -> None:
        """Answer the event `event_id` in `room_id`."""
        self.client, self.room_id, self.event_id = client, room_id, event_id

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The parts the room does not have yet, yielding as each is accepted."""
        texts = parts(answer.text)
        if answer.sent_parts >= len(texts):
            log.info("answer of turn %s was sent before its process died; not sent again", answer.turn_id)
            return
        for i in range(answer.sent_parts, len(texts)):
            await self._send(texts[i], f"answer.{i}")
            yield i + 1

    async def error(self, error: Error) -> None:
        """One line (split when long)."""
        for i, text in enumerate(parts(error.message)):
            await self._send(text, f"error.{i}")

    async def _send(self, text: str, what: str) -> None:
        txn = f"{self.event_id}.{what}"
        await self.client.send_message_event(RoomID(self.room_id), EventType.ROOM_MESSAGE, content(text), txn_id=txn)
