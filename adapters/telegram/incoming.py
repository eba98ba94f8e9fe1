"""The core's view of a Telegram message or button press (an Incoming), and whether a message is for the bot."""

from __future__ import annotations

from telegram import CallbackQuery, Message, MessageEntity
from telegram.constants import ChatType

from adapters.telegram.provenance import quoted_of
from core import Incoming


def addressed(msg: Message, bot_id: int, username: str) -> bool:
    """Private chats always; groups when the bot is @mentioned or replied to."""
    if msg.chat.type == ChatType.PRIVATE:
        return True
    reply = msg.reply_to_message
    if reply is not None and reply.from_user is not None and reply.from_user.id == bot_id:
        return True
    mention = f"@{username}".lower()
    parsed = msg.parse_entities([MessageEntity.MENTION]) or msg.parse_caption_entities([MessageEntity.MENTION])
    return any(v.lower() == mention for v in parsed.values())


def incoming(msg: Message, text: str, username: str, bot_id: str) -> Incoming:
    """A message from a person as the core sees it: a forward's text is someone else's (quoted, the speaker said
    nothing), and so is a quote or a message of another chat replied to; the bot's @mention is dropped. Its message
    id is `<bot id>:<message id>`: message ids count per bot in a private chat, so two bots on one database (or a
    new token on an old one) never take each other's messages for ones seen before."""
    user = msg.from_user
    assert user is not None
    if msg.forward_origin is not None:
        text = ""
    if username:
        text = text.replace(f"@{username}", "").strip()
    return Incoming(
        platform="telegram",
        user_id=str(user.id),
        chat_id=str(msg.chat.id),
        thread_id=str(msg.message_thread_id) if msg.is_topic_message and msg.message_thread_id else "",
        chat_kind="private" if msg.chat.type == ChatType.PRIVATE else "group",
        chat_title=msg.chat.title or "",
        text=text,
        user_name=user.full_name,
        message_id=f"{bot_id}:{msg.message_id}",
        reply_to=f"{bot_id}:{msg.reply_to_message.message_id}" if msg.reply_to_message else None,
        quoted=quoted_of(msg),
        language=user.language_code or "",
    )


def presser(query: CallbackQuery) -> Incoming:
    """Who pressed a button, in which chat."""
    chat = query.message.chat if query.message is not None else None
    group = chat is not None and chat.type != ChatType.PRIVATE
    return Incoming(
        platform="telegram",
        user_id=str(query.from_user.id),
        chat_id=str(chat.id if chat else query.from_user.id),
        chat_kind="group" if group else "private",
        chat_title=(chat.title or "") if chat else "",
        text="",
        user_name=query.from_user.full_name,
    )
