"""Sending to Discord: answer parts (recorded as they go out), interaction answers and notes, typing, reminders."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import discord
from discord.abc import Messageable

from adapters.discord.limits import DISCORD_CUT_NOTE_S, DISCORD_TYPING_EVERY_S, DISCORD_UPLOAD_LIMIT
from adapters.discord.render import split_markdown
from core import DeliveryRefused, FileAnswer, ReminderMessage, file_too_large

NO_MENTIONS = discord.AllowedMentions.none()  # every send pings nobody (not even the author it replies to) …
# permanent refusals of a reminder send (Discord JSON error codes) → the reason shown in /tasks
REFUSALS = {
    10003: "the channel no longer exists",
    50001: "the bot has no access to the channel",
    50013: "the bot lacks permission to post in the channel",
    50007: "the user does not accept direct messages from the bot",
}


def owner_ping(owner_id: str) -> discord.AllowedMentions:
    """… except a reminder, which pings its owner and nobody else."""
    return discord.AllowedMentions(
        everyone=False, roles=False, replied_user=False, users=[discord.Object(int(owner_id))]
    )


def view(*items: discord.ui.Item[Any]) -> discord.ui.View:
    """A view made of persistent items (never expires; not tracked per message by discord.py)."""
    buttons = discord.ui.View(timeout=None)
    for item in items:
        buttons.add_item(item)
    return buttons


def reply_reference(message_id: int, channel_id: int, guild_id: int | None) -> discord.MessageReference | None:
    """In a server an answer replies to the message it answers (silently); in a DM it just follows it."""
    if guild_id is None:
        return None
    return discord.MessageReference(
        message_id=message_id, channel_id=channel_id, guild_id=guild_id, fail_if_not_exists=False
    )


async def send_parts(
    channel: Messageable,
    parts: Sequence[str],
    *,
    reference: discord.MessageReference | None = None,
    buttons: discord.ui.View | None = None,
) -> list[discord.Message]:
    """Send parts in order (see `sending`)."""
    return [m async for _, m in sending(channel, parts, reference=reference, buttons=buttons)]


async def sending(
    channel: Messageable,
    parts: Sequence[str],
    *,
    reference: discord.MessageReference | None = None,
    buttons: discord.ui.View | None = None,
    first: int = 0,
) -> AsyncIterator[tuple[int, discord.Message]]:
    """Send parts[first:] in order, yielding after each how many parts Discord has accepted and the message: the
    first one sent replies to `reference`, the buttons go on the last one."""
    for i in range(first, len(parts)):
        extra: dict[str, Any] = {}
        if i == first and reference is not None:
            extra["reference"] = reference
        if buttons is not None and i == len(parts) - 1:
            extra["view"] = buttons
        yield i + 1, await channel.send(parts[i], allowed_mentions=NO_MENTIONS, **extra)


async def respond_parts(
    interaction: discord.Interaction, parts: Sequence[str], *, ephemeral: bool, buttons: discord.ui.View | None
) -> None:
    """Answer an interaction in parts (the response, then follow-ups); the buttons go under the last part."""
    last: Any = buttons or discord.utils.MISSING
    first_view = last if len(parts) == 1 else discord.utils.MISSING
    await interaction.response.send_message(
        parts[0], ephemeral=ephemeral, allowed_mentions=NO_MENTIONS, view=first_view
    )
    for i, part in enumerate(parts[1:], 2):
        part_view = last if i == len(parts) else discord.utils.MISSING
        await interaction.followup.send(part, ephemeral=ephemeral, allowed_mentions=NO_MENTIONS, view=part_view)


async def followups(interaction: discord.Interaction, parts: Sequence[str], buttons: discord.ui.View | None) -> None:
    """Send parts as follow-ups of a deferred interaction (the first replaces "thinking…"); buttons on the last."""
    for i, part in enumerate(parts):
        if buttons is not None and i == len(parts) - 1:
            await interaction.followup.send(part, view=buttons, allowed_mentions=NO_MENTIONS)
        else:
            await interaction.followup.send(part, allowed_mentions=NO_MENTIONS)


async def send_file(interaction: discord.Interaction, answer: FileAnswer) -> None:
    """A file answer (an export) as a follow-up only its person sees, after a deferral; one larger than Discord lets
    a bot send is one line saying so."""
    if len(answer.data) > DISCORD_UPLOAD_LIMIT:
        text = file_too_large(len(answer.data), DISCORD_UPLOAD_LIMIT)
        await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_MENTIONS)
        return
    file = discord.File(io.BytesIO(answer.data), filename=answer.filename)
    await interaction.followup.send(answer.text, file=file, ephemeral=True, allowed_mentions=NO_MENTIONS)


async def note(interaction: discord.Interaction, text: str) -> None:
    """The interaction's response as a note only its user sees."""
    await interaction.response.send_message(text, ephemeral=True, allowed_mentions=NO_MENTIONS)


async def tell(interaction: discord.Interaction, text: str) -> None:
    """Best effort, a short note only the user sees: the response, or a follow-up when it was answered already."""
    with contextlib.suppress(discord.HTTPException):
        if interaction.response.is_done():
            await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_MENTIONS)
        else:
            await note(interaction, text)


async def keep_typing(channel: Messageable) -> None:
    """Refresh the typing indicator until cancelled (failures only cost the indicator)."""
    while True:
        with contextlib.suppress(discord.HTTPException):
            await channel.typing()
        await asyncio.sleep(DISCORD_TYPING_EVERY_S)


async def briefly(send: Awaitable[Any]) -> None:
    """Best effort, bounded by DISCORD_CUT_NOTE_S: a note to a user whose answer a shutdown cut."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DISCORD_CUT_NOTE_S):
            await send


async def stop_task(task: asyncio.Task[None]) -> None:
    """Cancel a helper task and wait for it."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def deliver_reminder(channel: Messageable, msg: ReminderMessage, buttons: discord.ui.View) -> str | None:
    """Push a reminder into its channel (pinging only its owner, in servers) with the buttons on its last part, each
    part recorded as it is accepted; a permanent refusal (channel gone, no access, DMs closed) raises DeliveryRefused.
    Returns the id of the message with the buttons (None when all was sent before)."""
    body, mentions = msg.text, NO_MENTIONS
    if msg.chat_kind == "group":
        body = f"<@{int(msg.owner_id)}> {body}"
        mentions = owner_ping(msg.owner_id)
    parts = split_markdown(body)
    sent: discord.Message | None = None
    try:
        for i in range(msg.sent_parts, len(parts)):  # a retry sends only the parts Discord does not have
            if i == len(parts) - 1:  # the buttons go on the last part
                sent = await channel.send(parts[i], allowed_mentions=mentions, view=buttons)
            else:
                sent = await channel.send(parts[i], allowed_mentions=mentions)
            await msg.mark_sent(i + 1)
    except (discord.NotFound, discord.Forbidden) as e:
        if e.code in REFUSALS:  # permanent: the engine marks the occurrence failed with this reason
            raise DeliveryRefused(f"Discord: {REFUSALS[e.code]} ({e.code} {e.text})") from e
        raise  # anything else (network, 5xx, rate limits, other codes) is transient and retried
    return str(sent.id) if sent is not None else None
