"""Someone else's text that comes with a Telegram message: forwards, quotes and replies to other chats."""

from __future__ import annotations

from telegram import (
    ExternalReplyInfo,
    Message,
    MessageOrigin,
    MessageOriginChannel,
    MessageOriginChat,
    MessageOriginHiddenUser,
    MessageOriginUser,
)

from core import Quoted

# what a message from another chat holds when it has no quoted text (the first field set wins)
CONTENT_NAMES = (
    ("photo", "a photo"),
    ("video", "a video"),
    ("animation", "an animation"),
    ("audio", "an audio file"),
    ("voice", "a voice message"),
    ("video_note", "a video message"),
    ("document", "a document"),
    ("sticker", "a sticker"),
    ("story", "a story"),
    ("poll", "a poll"),
    ("checklist", "a checklist"),
    ("location", "a location"),
    ("venue", "a venue"),
    ("contact", "a contact"),
    ("dice", "a dice"),
    ("game", "a game"),
    ("giveaway", "a giveaway"),
    ("giveaway_winners", "giveaway winners"),
    ("invoice", "an invoice"),
    ("paid_media", "paid media"),
)
UNKNOWN_CONTENT = "a message"
UNKNOWN_AUTHOR = "an unknown author"


def quoted_of(msg: Message) -> tuple[Quoted, ...]:
    """The others' text a message carries: the forwarded text, a quoted part of the message replied to, or a
    message of another chat replied to."""
    out: list[Quoted] = []
    if msg.forward_origin is not None:
        out.append(Quoted("forward", origin_name(msg.forward_origin), msg.text or msg.caption or ""))
    quote = msg.quote.text if msg.quote is not None else ""
    if msg.external_reply is not None:
        out.append(Quoted("reply", origin_name(msg.external_reply.origin), quote or _content(msg.external_reply)))
    elif quote:
        out.append(Quoted("quote", _author(msg.reply_to_message), quote))
    return tuple(out)


def origin_name(origin: MessageOrigin) -> str:
    """Who wrote a forwarded or replied-to message, as Telegram names them."""
    if isinstance(origin, MessageOriginUser):
        return origin.sender_user.full_name
    if isinstance(origin, MessageOriginHiddenUser):
        return origin.sender_user_name or UNKNOWN_AUTHOR
    if isinstance(origin, MessageOriginChat):
        return _signed(f"group {origin.sender_chat.effective_name or ''}".strip(), origin.author_signature)
    if isinstance(origin, MessageOriginChannel):
        return _signed(f"channel {origin.chat.effective_name or ''}".strip(), origin.author_signature)
    return UNKNOWN_AUTHOR


def _signed(name: str, signature: str | None) -> str:
    """A chat's name with the post author's signature, e.g. "channel News (Bob)"."""
    return f"{name} ({signature})" if signature else name


def _author(msg: Message | None) -> str:
    """The author of a message in this chat (the original author when it is itself a forward)."""
    if msg is None:
        return UNKNOWN_AUTHOR
    if msg.forward_origin is not None:
        return origin_name(msg.forward_origin)
    if msg.sender_chat is not None:
        return msg.sender_chat.effective_name or UNKNOWN_AUTHOR
    return msg.from_user.full_name if msg.from_user is not None else UNKNOWN_AUTHOR


def _content(info: ExternalReplyInfo) -> str:
    """A short description of a message from another chat, e.g. "a photo"."""
    return next((name for field, name in CONTENT_NAMES if getattr(info, field, None)), UNKNOWN_CONTENT)
