"""The reply port of Matrix: a stored message's answer in its room: "typing…" while the turn runs, then the answer's
parts as m.text with Matrix HTML (formatted_body) and a plain body, the tool steps folded in a <details> at the end
(reactions for the buttons come next)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from mautrix.client import ClientAPI
from mautrix.types import EventType, Obj, RoomID

from adapters.matrix.limits import MATRIX_TYPING_MS
from adapters.matrix.render import answer_contents
from core import Assistant, Error, QuietReply

log = logging.getLogger(__name__)


class RoomReply(QuietReply):
    """Answers a stored message in its room. Each part goes with a transaction id made of the message's event id
    and the part's index: a send that is tried again (the same process, or another one after a crash between the
    homeserver taking it and the core recording it) is the same event, not a second one."""

    def __init__(self, client: ClientAPI, room_id: str, event_id: str) -> None:
        """Answer the event `event_id` in `room_id`."""
        self.client, self.room_id, self.event_id = client, room_id, event_id

    @contextlib.asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """ "typing…" while the turn runs (renewed before the homeserver's timeout runs out; best effort)."""
        room = RoomID(self.room_id)

        async def keep_typing() -> None:
            while True:
                with contextlib.suppress(Exception):
                    await self.client.set_typing(room, timeout=MATRIX_TYPING_MS)
                await asyncio.sleep(MATRIX_TYPING_MS / 2000)

        task = asyncio.create_task(keep_typing())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            with contextlib.suppress(Exception):
                await self.client.set_typing(room, timeout=0)

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The parts the room does not have yet, yielding as each is accepted."""
        contents = answer_contents(answer.text, answer.steps, answer.elapsed_s)
        if answer.sent_parts >= len(contents):
            log.info("answer of turn %s was sent before its process died; not sent again", answer.turn_id)
            return
        for i in range(answer.sent_parts, len(contents)):
            await self._send(contents[i], f"answer.{i}")
            yield i + 1

    async def error(self, error: Error) -> None:
        """One line (split when long)."""
        for i, message in enumerate(answer_contents(error.message)):
            await self._send(message, f"error.{i}")

    async def _send(self, message: Obj, what: str) -> None:
        """One message's content, with a transaction id made of the event's id and `what`."""
        txn = f"{self.event_id}.{what}"
        await self.client.send_message_event(RoomID(self.room_id), EventType.ROOM_MESSAGE, message, txn_id=txn)
