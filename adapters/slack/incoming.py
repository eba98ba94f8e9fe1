"""What a Slack event says, as the core's Incoming; whether a message is for the bot; and the form a message the bot
answers is kept in the inbox (enough for any process to answer it in its place).

Identities are `slack:<team>:<user>` (user_id `<team>:<user>`), chats `<team>:<channel>`. A DM (channel_type im) is a
private chat. A channel is one shared conversation (thread_id ""): the bot answers there when @mentioned or in a
thread it is part of, and always answers in the message's thread (a top-level mention starts one), so threads keep
the channel tidy while the channel's conversation goes on across them, as a Discord server channel's does."""

from __future__ import annotations

import dataclasses
import html
import mimetypes
import re
from dataclasses import dataclass
from typing import Any

from adapters.base import hashed_id, stored_incoming
from core import Incoming, UploadKind

MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>")
LINK = re.compile(r"<((?:https?|mailto):[^|>]+)(?:\|([^>]*))?>")
SPECIAL = re.compile(r"<!(?:here|channel|everyone)(?:\|[^>]*)?>")
IGNORED_SUBTYPES = frozenset({"bot_message", "message_changed", "message_deleted", "channel_join", "channel_leave"})
PHOTO_MIMES = frozenset({"image/jpeg", "image/png", "image/webp"})


@dataclass(frozen=True)
class StoredFile:
    """A file shared with a message, by reference (downloaded with the bot token when its turn runs)."""

    id: str
    kind: UploadKind
    name: str
    size: int
    url: str
    mime: str | None = None


@dataclass(frozen=True)
class StoredMessage:
    """A message the bot answers, by ids only: any process can answer it."""

    incoming: Incoming
    channel: str  # the Slack channel id (D… a DM, C…/G… a channel)
    ts: str  # the message's timestamp (its id in the channel)
    thread_ts: str | None  # the thread the answer goes into (None: a DM's top level)
    files: tuple[StoredFile, ...] = ()

    @property
    def update_id(self) -> int:
        """The inbox's id of the message: the same for its `message` and `app_mention` events and their retries."""
        return update_id(self.channel, self.ts)

    def payload(self) -> dict[str, Any]:
        """The JSON kept in the inbox."""
        return {
            "incoming": dataclasses.asdict(self.incoming),
            "channel": self.channel,
            "ts": self.ts,
            "thread_ts": self.thread_ts,
            "files": [dataclasses.asdict(f) for f in self.files],
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> StoredMessage:
        """A stored message back from the inbox's JSON."""
        fields = payload["incoming"]
        incoming = stored_incoming(fields)
        files = tuple(StoredFile(**f) for f in payload.get("files", []))
        return cls(incoming, payload["channel"], payload["ts"], payload["thread_ts"], files)


def update_id(channel: str, ts: str) -> int:
    """A message's inbox id: a hash of its channel and timestamp (unique together in a workspace)."""
    return hashed_id(f"{channel}:{ts}")


def is_dm(event: dict[str, Any]) -> bool:
    """Whether the event comes from a person's DM with the bot."""
    return event.get("channel_type") == "im" or str(event.get("channel", "")).startswith("D")


def from_a_person(event: dict[str, Any], bot_user: str) -> bool:
    """A person's new message or mention (not the bot's own, another bot's, an edit or a join)."""
    if event.get("type") not in ("message", "app_mention") or event.get("bot_id"):
        return False
    if event.get("subtype") in IGNORED_SUBTYPES or event.get("user") in (None, bot_user):
        return False
    return event.get("subtype") in (None, "file_share", "thread_broadcast")


def mentions(event: dict[str, Any], bot_user: str) -> bool:
    """Whether the message @mentions the bot."""
    return event.get("type") == "app_mention" or f"<@{bot_user}" in str(event.get("text", ""))


def clean_text(text: str, bot_user: str, names: dict[str, str]) -> str:
    """Slack's text as the person wrote it: the bot's mention removed, others' as @name, links as their URL,
    @here/@channel as words, entities unescaped."""

    def person(m: re.Match[str]) -> str:
        return "" if m.group(1) == bot_user else f"@{names.get(m.group(1), 'someone')}"

    text = MENTION.sub(person, text)
    text = LINK.sub(lambda m: m.group(1).removeprefix("mailto:"), text)
    text = SPECIAL.sub(lambda m: "@" + m.group(0)[2:].split("|")[0].rstrip(">"), text)
    return html.unescape(text).strip()


def received(team: str, event: dict[str, Any], text: str, user_name: str, zone: str = "") -> StoredMessage:
    """A message as the core's Incoming with what its answer needs: where, and in which thread (`zone`: the
    person's time zone from their Slack profile)."""
    channel, ts = str(event["channel"]), str(event["ts"])
    private = is_dm(event)
    thread = event.get("thread_ts") or (None if private else ts)
    inc = Incoming(
        platform="slack",
        user_id=f"{team}:{event['user']}",
        chat_id=f"{team}:{channel}",
        chat_kind="private" if private else "group",
        chat_title="" if private else f"#{channel}",
        text=text,
        user_name=user_name,
        message_id=f"{channel}:{ts}",
        reply_to=f"{channel}:{event['thread_ts']}" if event.get("thread_ts") else None,
        attachments=tuple(str(f.get("name") or "file") for f in event.get("files") or []),
        zone=zone,
    )
    return StoredMessage(inc, channel, ts, str(thread) if thread else None, files_of(event, text))


def files_of(event: dict[str, Any], caption: str) -> tuple[StoredFile, ...]:
    """The shared files the core takes in: audio (a voice clip is "voice"), a JPEG/PNG/WebP photo (named by the
    text), any other non-image file as a document."""
    out = []
    for f in event.get("files") or []:
        name = str(f.get("name") or f.get("title") or "file")
        mime = str(f.get("mimetype") or "") or mimetypes.guess_type(name)[0]
        kind: UploadKind = "document"
        if mime in PHOTO_MIMES:
            kind, name = "photo", caption or name
        elif mime is not None and mime.startswith("image/"):
            continue
        elif mime is not None and (mime.startswith("audio/") or f.get("subtype") == "slack_audio"):
            kind = "voice" if f.get("subtype") == "slack_audio" else "audio"
        url = str(f.get("url_private_download") or f.get("url_private") or "")
        out.append(StoredFile(str(f["id"]), kind, name, int(f.get("size") or 0), url, mime))
    return tuple(out)


def command_incoming(team: str, payload: dict[str, Any], text: str = "") -> Incoming:
    """The core's view of a slash command or a button press (its person, its channel)."""
    user = payload.get("user")
    user_id = str(user["id"]) if isinstance(user, dict) else str(payload.get("user_id"))
    name = str(user.get("name", "")) if isinstance(user, dict) else str(payload.get("user_name", ""))
    channel = payload.get("channel")
    channel_id = str(channel["id"]) if isinstance(channel, dict) else str(payload.get("channel_id", ""))
    private = channel_id.startswith("D")
    return Incoming(
        platform="slack",
        user_id=f"{team}:{user_id}",
        chat_id=f"{team}:{channel_id}",
        chat_kind="private" if private else "group",
        chat_title="" if private else f"#{channel_id}",
        text=text,
        user_name=name,
        message_id=f"interaction:{payload.get('trigger_id', '')}",
    )


def split_id(key: str) -> tuple[str, str]:
    """(team, id) from `<team>:<id>`."""
    team, _, rest = key.partition(":")
    return team, rest
