"""The reply port of Matrix: a stored message's answer in its room: "typing…" while the turn runs, a slow answer's
draft edited in place while it streams (draft.py), then the answer's parts as m.text with Matrix HTML (formatted_body)
and a plain body, the first one replacing the draft, the tool steps folded in a <details> at the end, the buttons as
reactions under the last."""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from mautrix.client import ClientAPI
from mautrix.types import EventType, Obj, RoomID

from adapters.matrix.buttons import BUTTONS_FIELD, Offered, keyed, legend
from adapters.matrix.draft import Draft
from adapters.matrix.limits import MATRIX_TYPING_MS
from adapters.matrix.render import answer_contents
from adapters.matrix.send import Sender, as_obj, editing, replying
from core import Allow, Assistant, Button, Error, QuietReply

log = logging.getLogger(__name__)


class RoomReply(QuietReply):
    """Answers a stored message in its room. Each part goes with a transaction id made of the message's event id
    and the part's index: a send that is tried again (the same process, or another one after a crash between the
    homeserver taking it and the core recording it) is the same event, not a second one.

    A slow answer streams as a draft (draft.py) that the answer's first part then replaces: an m.replace edit with the
    part's own transaction id, so a stored answer sent again is still that same event. A client without edits shows
    the draft and then the answer as "* " and its text (the spec's fallback). An error answer replaces the draft the
    same way; a turn a shutdown cuts short leaves it, followed by the "cut short" note. A process that dies after the
    draft and before the answer leaves it to the next one, which runs the turn again: a slow rerun's draft has the
    same transaction id, so the homeserver gives back the old draft and the rerun edits it into the answer; a quick
    rerun (or an answer stored before the crash) is sent as new messages, and the old draft stays as it was, ending
    in "…"."""

    def __init__(
        self,
        client: ClientAPI,
        room_id: str,
        event_id: str,
        sender: Sender,
        *,
        reply: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Answer the event `event_id` in `room_id` (`reply`: each part a reply to it, as in a group room); the
        draft's pace kept by `clock`."""
        self.client, self.room_id, self.event_id = client, room_id, event_id
        self.sender, self.reply_to = sender, event_id if reply else None
        self.streams = True
        self._draft = Draft(self._put, f"{event_id}.draft", reply_to=self.reply_to, clock=clock)

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

    async def draft(self, text: str) -> None:
        """More of the answer: the draft, when it is due (best effort)."""
        await self._draft.add(text)

    async def answer(self, answer: Assistant) -> AsyncIterator[int]:
        """The parts the room does not have yet, yielding as each is accepted; the first replaces the draft, if any."""
        contents = answer_contents(answer.text, answer.steps, answer.elapsed_s)
        if answer.sent_parts >= len(contents):
            log.info("answer of turn %s was sent before its process died; not sent again", answer.turn_id)
            return
        offered = keyed([Button(ask.label, Allow(ask.id)) for ask in answer.asks]) if answer.asks else []
        draft = await self._draft.sent() if answer.sent_parts == 0 else None
        for i in range(answer.sent_parts, len(contents)):
            last = i == len(contents) - 1
            message = self._offering(contents[i], offered) if last else contents[i]
            event_id = await self._send(message, f"answer.{i}", replacing=draft if i == 0 else None)
            if last and offered:
                await self.sender.offer(self.room_id, event_id, answer.text, offered, f"{self.event_id}.answer.{i}")
            yield i + 1

    def _offering(self, message: Obj, offered: list[Offered]) -> Obj:
        """The last part with the line naming its "Allow" reactions (none: unchanged)."""
        if not offered:
            return message
        body: dict[str, Any] = dict(message.serialize())
        line = legend(offered)
        body["body"] = f"{body.get('body', '')}\n\n{line}"
        body["formatted_body"] = f"{body.get('formatted_body', '')}<p>{html.escape(line)}</p>"
        body[BUTTONS_FIELD] = [{"key": o.key, "label": o.label} for o in offered]
        return as_obj(body)

    async def error(self, error: Error) -> None:
        """One line (split when long); it replaces the draft of an answer that failed while it streamed, if any."""
        draft = await self._draft.sent()
        for i, message in enumerate(answer_contents(error.message)):
            await self._send(message, f"error.{i}", replacing=draft if i == 0 else None)

    async def _send(self, message: Obj, what: str, *, replacing: str | None = None) -> str:
        """One message's content (a reply to the message in a group room), or an edit of the draft `replacing`, with
        a transaction id made of the event's id and `what`; the event id people see it under (the draft's, for an
        edit: its reactions and later edits go there)."""
        txn = f"{self.event_id}.{what}"
        if replacing is not None:
            await self._put(editing(dict(message.serialize()), replacing), txn)
            return replacing
        return await self._put(replying(dict(message.serialize()), self.reply_to), txn)

    async def _put(self, body: dict[str, Any], txn: str) -> str:
        """One m.room.message with the transaction id `txn`; its event id."""
        room = RoomID(self.room_id)
        return str(await self.client.send_message_event(room, EventType.ROOM_MESSAGE, as_obj(body), txn_id=txn))
