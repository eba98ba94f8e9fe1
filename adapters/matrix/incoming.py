"""What a Matrix event says, as the core's Incoming; whether a message is for the bot; and the form a message the bot
answers is kept in the inbox (enough for any process to answer it in its place).

Identities are `matrix:@user:server` (user_id `@user:server`), chats the room id. A direct room is a private chat;
in a group room the bot answers when mentioned (m.mentions or its display name) or replied to."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from core import Incoming, Quoted

TEXT_TYPES = frozenset({"m.text", "m.notice", "m.emote"})


@dataclass(frozen=True)
class StoredMessage:
    """A message the bot answers, by ids only: any process can answer it."""

    incoming: Incoming
    room_id: str
    event_id: str

    @property
    def update_id(self) -> int:
        """The inbox's id of the message: the same for every delivery of its event."""
        return update_id(self.event_id)

    def payload(self) -> dict[str, Any]:
        """The JSON kept in the inbox."""
        return {"incoming": dataclasses.asdict(self.incoming), "room_id": self.room_id, "event_id": self.event_id}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> StoredMessage:
        """A stored message back from the inbox's JSON."""
        fields = payload["incoming"]
        incoming = Incoming(
            **{
                **fields,
                "attachments": tuple(fields["attachments"]),
                "quoted": tuple(Quoted(**q) for q in fields["quoted"]),
                "uploads": (),
            }
        )
        return cls(incoming, payload["room_id"], payload["event_id"])


def update_id(event_id: str) -> int:
    """An event's inbox id: 63 bits of a hash of its event id (unique on its homeserver and beyond)."""
    digest = hashlib.blake2b(event_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 63) - 1)


def from_a_person(event: dict[str, Any], bot: str) -> bool:
    """A person's new text message (not the bot's own, not an edit, not a notice from another bot)."""
    if event.get("type") != "m.room.message" or event.get("sender") in (None, bot):
        return False
    content = event.get("content") or {}
    if (content.get("m.relates_to") or {}).get("rel_type") == "m.replace":
        return False
    return content.get("msgtype") in TEXT_TYPES - {"m.notice"} and isinstance(content.get("body"), str)


def mentions(event: dict[str, Any], bot: str, name: str) -> bool:
    """Whether the message is for the bot: its id in m.mentions, or its display name in the text."""
    content = event.get("content") or {}
    if bot in ((content.get("m.mentions") or {}).get("user_ids") or []):
        return True
    return bool(name) and name.casefold() in str(content.get("body", "")).casefold()


def received(event: dict[str, Any], room_id: str, direct: bool, sender_name: str, text: str) -> StoredMessage:
    """A message as the core's Incoming with where its answer goes."""
    sender, event_id = str(event["sender"]), str(event["event_id"])
    relates = (event.get("content") or {}).get("m.relates_to") or {}
    reply_to = (relates.get("m.in_reply_to") or {}).get("event_id")
    inc = Incoming(
        platform="matrix",
        user_id=sender,
        chat_id=room_id,
        chat_kind="private" if direct else "group",
        chat_title="" if direct else room_id,
        text=text,
        user_name=sender_name,
        message_id=event_id,
        reply_to=str(reply_to) if reply_to else None,
    )
    return StoredMessage(inc, room_id, event_id)


def inviter_incoming(sender: str, room_id: str) -> Incoming:
    """The core's view of an invitation: its sender, asking in private (for the access check)."""
    return Incoming(
        platform="matrix", user_id=sender, chat_id=room_id, chat_kind="private", text="", message_id=f"invite:{room_id}"
    )
