"""Sending to Matrix beyond a turn's answer: messages with buttons (reactions), replies, mentions and edits, files
through the media repository, and each person's direct room with the bot (found, or made with createRoom). Every send
has a transaction id made of what it answers, so a send tried again is the same event."""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from mautrix.client import ClientAPI
from mautrix.types import EventID, EventType, Obj, RoomCreatePreset, RoomID, UserID

from adapters.matrix.buttons import BUTTONS_FIELD, Kept, Offered, keyed, with_legend
from adapters.matrix.render import answer_contents
from core import Button, Core, FileAnswer

log = logging.getLogger(__name__)

HTML = "org.matrix.custom.html"
DIRECT = "direct"  # the value kept for a room that is a direct chat
PILL = '<a href="https://matrix.to/#/{user}">{name}</a>'


def as_obj(body: dict[str, Any]) -> Obj:
    """A content dict as mautrix sends it."""
    return Obj(**body)  # type: ignore[no-untyped-call]


def messages(text: str) -> list[dict[str, Any]]:
    """Markdown as the m.text contents of its parts (Matrix HTML and a plain body), as dicts."""
    return [dict(made.serialize()) for made in answer_contents(text)]


def formatted(body: dict[str, Any]) -> str:
    """The content's HTML (its body escaped, line breaks kept, when the renderer gave none)."""
    if body.get("format") == HTML and isinstance(body.get("formatted_body"), str):
        return str(body["formatted_body"])
    return html.escape(str(body.get("body", ""))).replace("\n", "<br>")


def replying(body: dict[str, Any], event_id: str | None) -> dict[str, Any]:
    """The content as a reply to `event_id` (unchanged for None)."""
    if event_id:
        body["m.relates_to"] = {**(body.get("m.relates_to") or {}), "m.in_reply_to": {"event_id": event_id}}
    return body


def editing(new: dict[str, Any], event_id: str) -> dict[str, Any]:
    """The content that makes `event_id` read `new` (an m.replace edit); its own body is "* " and the new text, the
    spec's fallback for clients without edits (they show it as one more message)."""
    new = {k: v for k, v in new.items() if k != "m.relates_to"}  # an edit keeps the original's reply, if any
    body = {
        **new,
        "body": f"* {new.get('body', '')}",
        "m.new_content": new,
        "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
    }
    if "formatted_body" in new:
        body["formatted_body"] = f"* {new['formatted_body']}"
    return body


def mentioning(body: dict[str, Any], user: str, name: str) -> dict[str, Any]:
    """The content starting with a mention of `user` (a pill), the only one it notifies."""
    shown = name or user
    html_body = PILL.format(user=html.escape(user, quote=True), name=html.escape(shown)) + ": " + formatted(body)
    return {
        **body,
        "body": f"{shown}: {body.get('body', '')}",
        "format": HTML,
        "formatted_body": html_body,
        "m.mentions": {"user_ids": [user]},
    }


class Sender:
    """Sends as the bot into rooms; keeps what each message with buttons offers, and each person's direct room."""

    def __init__(self, client: ClientAPI, core: Core, source: str, bot: str) -> None:
        """Send with `client`; keep under keys starting with `source`."""
        self.client, self.core, self.source, self.bot = client, core, source, bot

    # ---- messages ------------------------------------------------------------------------------------

    async def send(self, room_id: str, body: dict[str, Any], txn: str) -> str:
        """One event's content into a room; its event id."""
        room = RoomID(room_id)
        return str(await self.client.send_message_event(room, EventType.ROOM_MESSAGE, as_obj(body), txn_id=txn))

    async def post(
        self,
        room_id: str,
        text: str,
        txn: str,
        *,
        reply_to: str | None = None,
        buttons: Sequence[Button] = (),
        mention: tuple[str, str] | None = None,
        first: int = 0,
        sent: Callable[[int], Awaitable[None]] | None = None,
    ) -> str | None:
        """Markdown into a room, split in parts from `first` on: each a reply to `reply_to` when given, the first
        starting with a mention of `mention` (user, name), the buttons under the last one; `sent` told how many parts
        the room has after each. The last part's event id (None: none sent)."""
        offered = keyed(buttons) if buttons else []
        contents = messages(with_legend(text, offered))
        event_id: str | None = None
        for i in range(first, len(contents)):
            last = i == len(contents) - 1
            body = contents[i]
            if i == 0 and mention is not None:
                body = mentioning(body, *mention)
            if last and offered:
                body[BUTTONS_FIELD] = [{"key": o.key, "label": o.label} for o in offered]
            event_id = await self.send(room_id, replying(body, reply_to), f"{txn}.{i}")
            if last and offered:
                await self.offer(room_id, event_id, text, offered, txn)
            if sent is not None:
                await sent(i + 1)
        return event_id

    async def offer(self, room_id: str, event_id: str, text: str, offered: Sequence[Offered], txn: str) -> None:
        """Keep what the message's reactions press, then put them under it."""
        kept = Kept(text, tuple(offered))
        await self._keep_buttons(event_id, kept)
        reactions = []
        for i, o in enumerate(offered):
            relates = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": o.key}}
            reactions.append(
                await self.client.send_message_event(
                    RoomID(room_id), EventType.REACTION, as_obj(relates), txn_id=f"{txn}.react.{i}"
                )
            )
        await self._keep_buttons(event_id, Kept(text, tuple(offered), tuple(reactions)))

    async def _keep_buttons(self, event_id: str, kept: Kept) -> None:
        """Keep what a message's reactions press for as long as reminders' history is kept (RETENTION_DAYS)."""
        keep = timedelta(days=self.core.settings.RETENTION_DAYS)
        await self.core.kept.put(self._buttons_key(event_id), kept.dumps(), keep=keep)

    async def kept(self, event_id: str) -> Kept | None:
        """What a message's reactions press (None: not a message with buttons, or they were used)."""
        value = await self.core.kept.get(self._buttons_key(event_id))
        return Kept.loads(value) if value else None

    async def settle(self, room_id: str, event_id: str, kept: Kept, text: str, txn: str) -> None:
        """A pressed message now reads `text`, without buttons: edited in place, the bot's reactions taken away."""
        await self.core.kept.forget(self._buttons_key(event_id))
        new = messages(text)[-1]  # what the pressed (last) message of the text now reads
        await self.send(room_id, editing(new, event_id), f"{txn}.edit")
        for reaction in kept.reactions:
            try:
                await self.client.redact(RoomID(room_id), EventID(reaction))
            except Exception as e:  # the buttons are spent anyway (the kept ones are gone)
                log.info("could not take back the reaction %s: %s", reaction, e)

    def _buttons_key(self, event_id: str) -> str:
        return f"{self.source}:buttons:{event_id}"

    # ---- files ---------------------------------------------------------------------------------------

    async def send_file(self, room_id: str, answer: FileAnswer, txn: str) -> str:
        """A file into a room as m.file through the media repository, its text as the caption (Matrix 1.10)."""
        mime = "application/json" if answer.filename.endswith(".json") else "application/octet-stream"
        url = await self.client.upload_media(answer.data, mime_type=mime, filename=answer.filename)
        caption = messages(answer.text)[0]
        body = {
            **caption,
            "msgtype": "m.file",
            "filename": answer.filename,
            "url": str(url),
            "info": {"mimetype": mime, "size": len(answer.data)},
        }
        return await self.send(room_id, body, txn)

    # ---- direct rooms --------------------------------------------------------------------------------

    async def direct_room(self, user: str) -> str:
        """The person's direct room with the bot: the one they opened or the bot made, else a new one (the person
        invited; messages wait there for them)."""
        key = self._direct_key(user)
        found = await self.core.kept.get(key)
        if found:
            return found
        room = await self.client.create_room(
            preset=RoomCreatePreset.TRUSTED_PRIVATE, is_direct=True, invitees=[UserID(user)]
        )
        await self.core.kept.put(key, str(room), owner=f"matrix:{user}")  # goes with their /forget_me
        await self.core.kept.put(f"{self.source}:room:{room}", DIRECT)
        return str(room)

    async def keep_direct(self, user: str, room_id: str) -> None:
        """A direct room a person opened with the bot is theirs."""
        await self.core.kept.put(self._direct_key(user), room_id, owner=f"matrix:{user}")

    def _direct_key(self, user: str) -> str:
        return f"{self.source}:dm:{user}"
