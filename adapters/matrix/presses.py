"""What a press does: a person's reaction to one of the bot's messages with buttons (buttons.py), handled like the
other platforms' presses. Only the button's person may press it (the core decides for reminders and "Allow"; a
confirmation or a choice is its owner's): anyone else is told so in their direct room with the bot (Matrix has no
message only one person in a room sees). A press that took effect edits the message to its outcome and takes the
bot's reactions away; a reaction that is no button of the message is ignored."""

from __future__ import annotations

from adapters.matrix.buttons import Kept
from adapters.matrix.commands import PRIMARY, on_matrix
from adapters.matrix.incoming import StoredMessage
from adapters.matrix.send import Sender
from core import (
    MODEL_NOT_YOURS,
    NOT_YOUR_BUTTON,
    NOT_YOUR_FORGET,
    NOT_YOUR_PRESS,
    Allow,
    Confirm,
    Core,
    Error,
    OnTask,
)

NOT_YOURS = {
    "memory": NOT_YOUR_BUTTON.format(how=f"send {PRIMARY}memory wipe"),
    "forget_me": NOT_YOUR_FORGET.format(how=f"send {PRIMARY}forget_me"),
    "model": MODEL_NOT_YOURS,
}


async def press(core: Core, sender: Sender, stored: StoredMessage) -> None:
    """One stored reaction: the button it presses, if any, pressed."""
    kept = await sender.kept(stored.target)
    what = kept.pressed(stored.key) if kept is not None else None
    if kept is None or what is None:
        return
    inc, txn = stored.incoming, stored.event_id
    if isinstance(what, OnTask):
        ok, text = await core.press_reminder(inc, what.task_id, what.action)
        if ok:
            await sender.settle(stored.room_id, stored.target, kept, f"{kept.text}\n\n{text}", txn)
        else:
            await privately(sender, stored, text)
    elif isinstance(what, Confirm):
        await confirm(core, sender, stored, kept, what)
    elif isinstance(what, Allow):
        ok, text = await core.allow_mcp(inc, what.ask_id)
        if ok:
            await sender.post(stored.room_id, text, txn, reply_to=stored.target)
        else:
            await privately(sender, stored, text)


async def confirm(core: Core, sender: Sender, stored: StoredMessage, kept: Kept, what: Confirm) -> None:
    """A confirmation or a choice: its command run again for the person it was offered to; the message becomes the
    answer."""
    inc = stored.incoming
    if inc.user_id != what.owner:
        await privately(sender, stored, NOT_YOURS.get(what.command, NOT_YOUR_PRESS))
        return
    answer = await core.command(inc, what.command, dict(what.args), must_answer=True)
    if isinstance(answer, str):
        await sender.settle(stored.room_id, stored.target, kept, on_matrix(answer), stored.event_id)
    else:
        await privately(sender, stored, answer.message if isinstance(answer, Error) else core.refusal_text(inc))


async def privately(sender: Sender, stored: StoredMessage, text: str) -> None:
    """A line only the presser reads: in their direct room with the bot."""
    room = await sender.direct_room(stored.incoming.user_id)
    await sender.post(room, text, f"{stored.event_id}.private")
