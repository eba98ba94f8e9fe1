"""What a Discord message or interaction says, as the core's Incoming; whether a message is for the bot; and the
form a message the bot answers is kept in the inbox (enough to answer it from any process)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import discord

from adapters.base import stored_incoming
from adapters.discord.files import StoredFile, files_of, gif_names
from core import Incoming, Quoted, sticker_text

MENTION = re.compile(r"<@!?(\d+)>")
UNKNOWN_AUTHOR = "an unknown author"
STICKER = discord.StickerFormatType
ANIMATED_STICKERS = frozenset({STICKER.apng, STICKER.lottie, STICKER.gif})  # a sticker that moves: said as a GIF


@dataclass(frozen=True)
class StoredMessage:
    """A message the bot answers, by ids only: any process can reply to it, also one that never saw it."""

    incoming: Incoming
    channel_id: int  # where it was posted (a thread's own id)
    guild_id: int | None  # None: a DM
    files: tuple[StoredFile, ...] = ()  # attachments the core takes in, by reference (downloaded for the turn)

    @property
    def message_id(self) -> int:
        """The Discord message id (the inbox's update id: a message stored twice is answered once); the Incoming's
        is `<bot id>:<message id>` (only the message id in what a version before stored)."""
        return int((self.incoming.message_id or "0").rpartition(":")[2])

    def payload(self) -> dict[str, Any]:
        """The JSON kept in the inbox."""
        guild = str(self.guild_id) if self.guild_id is not None else None
        return {
            "incoming": dataclasses.asdict(self.incoming),
            "channel_id": str(self.channel_id),
            "guild_id": guild,
            "files": [f.to_json() for f in self.files],
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> StoredMessage:
        """A stored message back from the inbox's JSON."""
        fields = payload["incoming"]
        incoming = stored_incoming(fields)
        guild = payload["guild_id"]
        files = tuple(StoredFile.from_json(f) for f in payload.get("files", []))  # none in what a version before stored
        return cls(incoming, int(payload["channel_id"]), int(guild) if guild is not None else None, files)


def received(client: discord.Client, message: discord.Message, text: str) -> StoredMessage:
    """A message as the core's Incoming with the ids an answer needs: its stickers and GIFs in words before its text,
    and the attachments the core takes in (a photo named by the text)."""
    guild_id = message.guild.id if message.guild else None
    said = "\n".join(x for x in [*described(message), text] if x)
    files = files_of(message, text)
    return StoredMessage(message_incoming(client, message, said), message.channel.id, guild_id, files)


def described(message: discord.Message) -> list[str]:
    """A message's stickers (by name; an animated one counts as a GIF) and GIF attachments (by file name) in words:
    nothing of them is downloaded, and the model gets no image."""
    stickers = [sticker_text(None, s.name, s.format in ANIMATED_STICKERS) for s in message.stickers]
    return [*stickers, *(sticker_text(None, name, True) for name in gif_names(message))]


def bot_id(client: discord.Client) -> int:
    """The bot's own user id (0 before login)."""
    return client.user.id if client.user else 0


def addressed(client: discord.Client, message: discord.Message, channels: frozenset[int]) -> bool:
    """DMs always; elsewhere a mention, a reply to the bot, or a listed channel (or a thread in one)."""
    if dm_message(message):
        return True
    me = bot_id(client)
    if any(u.id == me for u in message.mentions):
        return True
    ref = message.reference
    if ref is not None and isinstance(ref.resolved, discord.Message) and ref.resolved.author.id == me:
        return True
    channel = message.channel
    parent = channel.parent_id if isinstance(channel, discord.Thread) else None
    return channel.id in channels or parent in channels


def message_text(client: discord.Client, message: discord.Message) -> str:
    """The message text without the bot's mention; other mentions become @names."""
    me = bot_id(client)
    names = {u.id: getattr(u, "display_name", u.name) for u in message.mentions}

    def name(mention: re.Match[str]) -> str:
        uid = int(mention.group(1))
        return "" if uid == me else f"@{names.get(uid, 'someone')}"

    return MENTION.sub(name, message.content).strip()


def message_incoming(client: discord.Client, message: discord.Message, text: str) -> Incoming:
    """The core's view of a Discord message (a forwarded message is someone else's text: quoted). Its message id is
    `<bot id>:<message id>`: two bots on one database that both answer a message (both mentioned, or both
    listening in a channel) each get a turn for it, not one taken for a duplicate of the other's."""
    ref = message.reference
    replied = ref is not None and ref.type == discord.MessageReferenceType.reply and ref.message_id
    me = bot_id(client)
    return _make_incoming(
        message.author,
        message.channel,
        message.channel.id,
        message.guild.id if message.guild else None,
        text,
        f"{me}:{message.id}",
        private=dm_message(message),
        reply_to=f"{me}:{ref.message_id}" if ref and replied else None,
        attachments=tuple(a.filename for a in message.attachments),
        quoted=_forwarded(client, message),
    )


def interaction_incoming(interaction: discord.Interaction, text: str) -> Incoming:
    """The core's view of a slash command or button press."""
    inc = _make_incoming(
        interaction.user,
        interaction.channel,
        interaction.channel_id,
        interaction.guild_id,
        text,
        f"interaction:{interaction.id}",
        private=private_interaction(interaction),
    )
    return dataclasses.replace(inc, language=str(interaction.locale.value))


def dm_message(message: discord.Message) -> bool:
    """Whether a message was sent in a DM with the bot (not a group DM)."""
    return message.guild is None and getattr(message.channel, "type", None) == discord.ChannelType.private


def private_interaction(interaction: discord.Interaction) -> bool:
    """Whether a slash command or button press comes from the user's own DM with the bot through the server
    install; a group DM, another DM or a user install is never private (others may see the answers)."""
    kind = interaction.context
    return (
        interaction.guild_id is None
        and getattr(interaction.channel, "type", None) == discord.ChannelType.private
        and kind.dm_channel
        and not kind.private_channel
        and not interaction.is_user_integration()
    )


def has_media(message: discord.Message) -> bool:
    """Whether a message (or a message it forwards) holds attachments or stickers."""
    forwarded = any(s.attachments or s.stickers for s in message.message_snapshots)
    return bool(message.attachments or message.stickers or forwarded)


def _where(channel: Any, guild_id: int | None) -> tuple[str, str, str]:
    """(chat id, thread id, title): a thread is its own conversation inside its parent channel."""
    name = getattr(channel, "name", None) or ""
    if isinstance(channel, discord.Thread):
        return str(channel.parent_id), str(channel.id), f"#{name}"
    return str(channel.id), "", f"#{name}" if guild_id else ""


def _make_incoming(
    author: discord.User | discord.Member,
    channel: Any,
    channel_id: int | None,
    guild_id: int | None,
    text: str,
    message_id: str,
    *,
    private: bool,
    reply_to: str | None = None,
    attachments: tuple[str, ...] = (),
    quoted: tuple[Quoted, ...] = (),
) -> Incoming:
    """An Incoming for a user speaking in a channel (a thread is its own conversation in its parent); only a
    real DM with the bot is a private chat."""
    chat_id, thread_id, title = _where(channel, guild_id) if channel is not None else (str(channel_id), "", "")
    return Incoming(
        platform="discord",
        user_id=str(author.id),
        chat_id=chat_id,
        thread_id=thread_id,
        chat_kind="private" if private else "group",
        chat_title=title,
        text=text,
        user_name=author.display_name,
        message_id=message_id,
        reply_to=reply_to,
        attachments=attachments,
        quoted=quoted,
    )


def _forwarded(client: discord.Client, message: discord.Message) -> tuple[Quoted, ...]:
    """The text of the messages a forward carries (Discord sends a snapshot without its author: named when
    the bot saw the original, else by its channel)."""
    ref = message.reference
    if ref is None or ref.type != discord.MessageReferenceType.forward:
        return ()
    out = []
    for snapshot in message.message_snapshots:
        text = MENTION.sub(lambda m: _mention_name(client, m), snapshot.content).strip()
        if text:
            out.append(Quoted("forward", _forward_origin(client, snapshot, ref.channel_id), text))
    return tuple(out)


def _forward_origin(client: discord.Client, snapshot: discord.MessageSnapshot, channel_id: int | None) -> str:
    """Who wrote a forwarded message, as far as the bot can tell."""
    original = snapshot.cached_message
    if original is not None:
        return original.author.display_name
    channel = client.get_channel(channel_id) if channel_id else None
    name = getattr(channel, "name", None)
    return f"someone in #{name}" if name else UNKNOWN_AUTHOR


def _mention_name(client: discord.Client, mention: re.Match[str]) -> str:
    """A user mention in someone else's text as @name."""
    uid = int(mention.group(1))
    user = client.user if uid == bot_id(client) else client.get_user(uid)
    return f"@{user.display_name}" if user is not None else "@someone"
