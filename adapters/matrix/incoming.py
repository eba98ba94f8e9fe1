"""What a Matrix event says, as the core's Incoming; whether a message is for the bot; and the form a message the bot
answers is kept in the inbox (enough for any process to answer it in its place).

Identities are `matrix:@user:server` (user_id `@user:server`), chats the room id. A direct room is a private chat;
in a group room the bot answers when mentioned (m.mentions or its display name) or replied to, and always to a
command of the catalogue (`!tasks`; commands.py). Three kinds are kept: a message (maybe with files), a command and a
press (a person's reaction to one of the bot's messages with buttons; buttons.py)."""

from __future__ import annotations

import dataclasses
import mimetypes
import re
from dataclasses import dataclass
from typing import Any, Literal

from adapters.base import hashed_id, stored_incoming
from adapters.matrix.limits import MATRIX_KEY_CHARS
from core import Incoming, UploadKind

TEXT_TYPES = frozenset({"m.text", "m.notice", "m.emote"})
FILE_TYPES = frozenset({"m.file", "m.image", "m.audio"})
PHOTO_MIMES = frozenset({"image/jpeg", "image/png", "image/webp"})
VOICE = "org.matrix.msc3245.voice"  # what marks an m.audio as a voice note (Element's recorder sets it)
Kind = Literal["message", "command", "press"]


@dataclass(frozen=True)
class StoredFile:
    """A file sent with a message, by reference (downloaded from the media repository when its turn runs)."""

    url: str  # mxc://server/media
    kind: UploadKind
    name: str
    mime: str | None = None
    size: int = 0


@dataclass(frozen=True)
class StoredMessage:
    """A message the bot answers, by ids only: any process can answer it."""

    incoming: Incoming
    room_id: str
    event_id: str
    kind: Kind = "message"
    files: tuple[StoredFile, ...] = ()
    command: str = ""  # a command's name, its text after it in incoming.text's place: `args`
    args: str = ""
    target: str = ""  # a press: the event of the bot's that was reacted to, and the reaction's key
    key: str = ""

    @property
    def update_id(self) -> int:
        """The inbox's id of the message: the same for every delivery of its event."""
        return update_id(self.event_id)

    def payload(self) -> dict[str, Any]:
        """The JSON kept in the inbox."""
        kept = dataclasses.asdict(self)
        return {**kept, "files": [dataclasses.asdict(f) for f in self.files]}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> StoredMessage:
        """A stored message back from the inbox's JSON."""
        fields = payload["incoming"]
        incoming = stored_incoming(fields)
        extra = {k: payload[k] for k in ("kind", "command", "args", "target", "key") if k in payload}
        files = tuple(StoredFile(**f) for f in payload.get("files", []))
        return cls(incoming, payload["room_id"], payload["event_id"], files=files, **extra)


def update_id(event_id: str) -> int:
    """An event's inbox id: a hash of its event id (unique on its homeserver and beyond)."""
    return hashed_id(event_id)


def obj(value: object) -> dict[str, Any]:
    """A JSON object of an event as given; {} for anything else (a string, a list, null where an object belongs)."""
    return value if isinstance(value, dict) else {}


def string(value: object) -> str:
    """A JSON string as given; "" for anything else."""
    return value if isinstance(value, str) else ""


def content_of(event: dict[str, Any]) -> dict[str, Any]:
    """An event's content (an object, whatever was sent)."""
    return obj(event.get("content"))


def replied_to(event: dict[str, Any]) -> str:
    """The event a message replies to ("": none, or an id that is no string)."""
    return string(obj(obj(content_of(event).get("m.relates_to")).get("m.in_reply_to")).get("event_id"))


def identified(event: dict[str, Any], bot: str) -> bool:
    """Whether the event names its id and its sender as strings, and the sender is someone other than the bot."""
    sender = string(event.get("sender"))
    return bool(string(event.get("event_id"))) and bool(sender) and sender != bot


def from_a_person(event: dict[str, Any], bot: str) -> bool:
    """A person's new text message or file (not the bot's own, not an edit, not a notice from another bot)."""
    if event.get("type") != "m.room.message" or not identified(event, bot):
        return False
    content = content_of(event)
    if obj(content.get("m.relates_to")).get("rel_type") == "m.replace":
        return False
    types = (TEXT_TYPES - {"m.notice"}) | FILE_TYPES
    return content.get("msgtype") in types and isinstance(content.get("body"), str)


def reaction(event: dict[str, Any], bot: str) -> tuple[str, str] | None:
    """A person's reaction: (the event reacted to, its key); None for anything else (a key longer than any button's
    is no button either)."""
    if event.get("type") != "m.reaction" or not identified(event, bot):
        return None
    relates = obj(content_of(event).get("m.relates_to"))
    target, key = string(relates.get("event_id")), string(relates.get("key"))
    if relates.get("rel_type") != "m.annotation" or not target or not key or len(key) > MATRIX_KEY_CHARS:
        return None
    return target, key


def caption(content: dict[str, Any]) -> str:
    """What a person wrote: a text's body; a file's caption (its body when a separate `filename` names the file,
    as from Matrix 1.10 on), else nothing."""
    body = string(content.get("body"))
    if content.get("msgtype") not in FILE_TYPES:
        return body
    name = string(content.get("filename"))
    return body if name and name != body else ""


def files_of(content: dict[str, Any], text: str) -> tuple[StoredFile, ...]:
    """The file a message carries: a voice note, audio, a JPEG/PNG/WebP photo (named by its caption) or a document;
    other images and a file without an mxc:// URL are none."""
    msgtype, url = content.get("msgtype"), string(content.get("url"))
    if msgtype not in FILE_TYPES or not url.startswith("mxc://"):
        return ()
    info = obj(content.get("info"))
    name = string(content.get("filename")) or string(content.get("body")) or "file"
    mime = string(info.get("mimetype")) or mimetypes.guess_type(name)[0]
    size = info.get("size")
    size = size if isinstance(size, int) and size > 0 else 0  # a size that is no count: found out when downloaded
    kind: UploadKind = "document"
    if msgtype == "m.audio":
        kind = "voice" if VOICE in content else "audio"
    elif msgtype == "m.image" or (mime or "").startswith("image/"):
        if mime not in PHOTO_MIMES:
            return ()
        kind, name = "photo", text or name
    return (StoredFile(url, kind, name, mime, size),)


def reply_text(text: str) -> str:
    """A reply's own words: without the quoted lines ("> …") older clients put before them."""
    lines = text.split("\n")
    while lines and (lines[0].startswith(">") or not lines[0].strip()):
        lines.pop(0)
    return "\n".join(lines).strip()


def without_mention(text: str, bot: str, name: str) -> str:
    """The text without a leading mention of the bot (its display name or id, as a client's pill writes it)."""
    for who in (bot, name):
        if who and text.casefold().startswith(who.casefold()):
            return re.sub(r"^[:,]?\s*", "", text[len(who) :])
    return text


def mentions(event: dict[str, Any], bot: str, name: str) -> bool:
    """Whether the message is for the bot: its id in m.mentions, or its id or display name typed as a word ("Bot" in
    "robot" is not a mention)."""
    content = content_of(event)
    ids = obj(content.get("m.mentions")).get("user_ids")
    if isinstance(ids, list) and bot in ids:
        return True
    body = string(content.get("body"))
    return any(typed and re.search(rf"(?<!\w){re.escape(typed)}(?!\w)", body, re.IGNORECASE) for typed in (bot, name))


def received(
    event: dict[str, Any], room_id: str, direct: bool, sender_name: str, text: str, files: tuple[StoredFile, ...] = ()
) -> StoredMessage:
    """A message as the core's Incoming with where its answer goes."""
    sender, event_id = str(event["sender"]), str(event["event_id"])
    reply_to = replied_to(event)
    inc = Incoming(
        platform="matrix",
        user_id=sender,
        chat_id=room_id,
        chat_kind="private" if direct else "group",
        chat_title="" if direct else room_id,
        text=text,
        user_name=sender_name,
        message_id=event_id,
        reply_to=reply_to or None,
        attachments=tuple(f.name for f in files),
    )
    return StoredMessage(inc, room_id, event_id, files=files)


def inviter_incoming(sender: str, room_id: str) -> Incoming:
    """The core's view of an invitation: its sender, asking in private (for the access check)."""
    return Incoming(
        platform="matrix", user_id=sender, chat_id=room_id, chat_kind="private", text="", message_id=f"invite:{room_id}"
    )
