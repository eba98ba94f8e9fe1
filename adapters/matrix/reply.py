"""The reply port of Matrix: a stored message's answer in its room: "typing…" while the turn runs, the answer's parts
(in a group room each a reply to the message), the last one with the steps (steps.py) and an "Allow" reaction per call
waiting on the person (buttons.py). Edits for drafts come next."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from mautrix.client import ClientAPI
from mautrix.types import EventType, Obj, RoomID

from adapters.matrix.buttons import BUTTONS_FIELD, keyed, with_legend
from adapters.matrix.limits import MATRIX_TYPING_MS
from adapters.matrix.render import content, parts
from adapters.matrix.send import Sender, as_obj, message, replying
from adapters.matrix.steps import with_activity
from core import Allow, Assistant, Button, Error, QuietReply

log = logging.getLogger(__name__)


class RoomReply(QuietReply):
    """Answers a stored message in its room. Each part goes with a transaction id made of the message's event id
    and the part's index: a send that is tried again (the same process, or another one after a crash between the
    homeserver taking it and the core recording it) is the same event, not a second one."""

    def __init__(self, client: ClientAPI, room_id: str, event_id: str, sender: Sender, *, reply: bool = False) -> None:
        """Answer the event `event_id` in `room_id` (`reply`: each part a reply to it, as in a group room)."""
        self.client, self.room_id, self.event_id = client, room_id, event_id
        self.sender, self.reply_to = sender, event_id if reply else None

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
        texts = parts(answer.text)
        if answer.sent_parts >= len(texts):
            log.info("answer of turn %s was sent before its process died; not sent again", answer.turn_id)
            return
        for i in range(answer.sent_parts, len(texts)):
            if i == len(texts) - 1 and (answer.steps or answer.asks):
                await self._last(texts[i], answer, f"answer.{i}")
            else:
                await self._send(texts[i], f"answer.{i}")
            yield i + 1

    async def _last(self, text: str, answer: Assistant, what: str) -> None:
        """The answer's last part with its steps, and an "Allow" reaction per call waiting on the person."""
        offered = keyed([Button(ask.label, Allow(ask.id)) for ask in answer.asks]) if answer.asks else []
        body = with_activity(message(with_legend(text, offered)), answer.steps, answer.elapsed_s)
        if offered:
            body[BUTTONS_FIELD] = [{"key": o.key, "label": o.label} for o in offered]
        txn = f"{self.event_id}.{what}"
        event_id = await self.sender.send(self.room_id, replying(body, self.reply_to), txn)
        if offered:
            await self.sender.offer(self.room_id, event_id, text, offered, txn)

    async def error(self, error: Error) -> None:
        """One line (split when long)."""
        for i, text in enumerate(parts(error.message)):
            await self._send(text, f"error.{i}")

    async def _send(self, text: str, what: str) -> None:
        txn = f"{self.event_id}.{what}"
        await self.client.send_message_event(
            RoomID(self.room_id), EventType.ROOM_MESSAGE, self._dressed(content(text)), txn_id=txn
        )

    def _dressed(self, body: Obj) -> Obj:
        """A part as a reply to the message, in a group room."""
        return as_obj(replying(dict(body.serialize()), self.reply_to)) if self.reply_to else body
