"""The persistent buttons (Show steps, a reminder's Done / Snooze, the memory wipe and /forget_me confirmations, the
models of /model, "Allow" for an MCP call waiting for the person's OK) and what a press does. Their custom ids carry
all they need, so they keep working after a restart and in any process."""

from __future__ import annotations

import re
from typing import Any, cast

import discord

from adapters.discord.gateway import Client, Owner
from adapters.discord.incoming import interaction_incoming, private_interaction
from adapters.discord.limits import DISCORD_BUTTON_LABEL, DISCORD_MESSAGE_LIMIT
from adapters.discord.render import steps_text, with_steps, without_steps
from adapters.discord.send import NO_MENTIONS, note, view
from core import (
    CONFIRM_IDS,
    HIDE_STEPS,
    MODEL_NOT_YOURS,
    NOT_YOUR_BUTTON,
    NOT_YOUR_FORGET,
    NOT_YOUR_PRESS,
    REMINDER_BUTTON_LABELS,
    SHOW_STEPS,
    Allow,
    Button,
    ButtonStyle,
    CommandArgs,
    CommandName,
    Confirm,
    Core,
    Error,
    OnTask,
    ShowSteps,
    pack,
    summary_line,
    unpack,
)

WIPE_HOW = "use /memory action:wipe"  # how a person asks for their own wipe on Discord
FORGET_HOW = "use /forget_me"  # how a person asks to delete their own data on Discord
NOT_YOURS = {  # what someone else pressing a person's confirmation or choice is told
    "memory": NOT_YOUR_BUTTON.format(how=WIPE_HOW),
    "forget_me": NOT_YOUR_FORGET.format(how=FORGET_HOW),
    "model": MODEL_NOT_YOURS,
}
STYLES = {
    "primary": discord.ButtonStyle.primary,
    "secondary": discord.ButtonStyle.secondary,
    "success": discord.ButtonStyle.success,
    "danger": discord.ButtonStyle.danger,
}


def _owner(interaction: discord.Interaction) -> Owner:
    """The adapter behind the client that received the interaction."""
    return cast(Client, interaction.client).owner


class StepsButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"steps:(?P<turn>\d+)(?P<shown>:shown)?"):
    """The "Show steps" button; its custom id carries the turn id (and, in a DM, whether the steps are shown)."""

    def __init__(self, turn_id: int, shown: bool = False) -> None:
        """A Show (or, when shown, Hide) button for one turn."""
        super().__init__(
            discord.ui.Button(
                label=HIDE_STEPS if shown else SHOW_STEPS,
                emoji="🔧",
                style=discord.ButtonStyle.secondary,
                custom_id=pack(ShowSteps(turn_id, shown)),
            )
        )
        self.turn_id, self.shown = turn_id, shown

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> StepsButton:
        """Rebuild the button from a pressed custom id (works after restarts)."""
        return cls(int(match["turn"]), bool(match["shown"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Show the steps (ephemeral in servers, toggled in place in DMs)."""
        owner = _owner(interaction)
        await owner.guard(interaction, show_steps(owner.core, interaction, self.turn_id, self.shown))


class ReminderButton(
    discord.ui.DynamicItem[discord.ui.Button[Any]],
    template=r"rem:(?P<action>done|snooze10|snooze60|undo):(?P<task>\d+)",
):
    """Done / Snooze on a reminder, Undo under /remind's answer; the custom id carries the action and the task id."""

    def __init__(self, action: str, task_id: int) -> None:
        """The Done or Snooze button of one task."""
        style = discord.ButtonStyle.success if action == "done" else discord.ButtonStyle.secondary
        label = REMINDER_BUTTON_LABELS[action]
        super().__init__(discord.ui.Button(label=label, style=style, custom_id=pack(OnTask(action, task_id))))
        self.action, self.task_id = action, task_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ReminderButton:
        """Rebuild the button from a pressed custom id."""
        return cls(match["action"], int(match["task"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Only the owner may press; the reminder is edited to show what happened."""
        owner = _owner(interaction)
        await owner.guard(interaction, press_reminder(owner.core, interaction, self.action, self.task_id))


class ConfirmButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=CONFIRM_IDS):
    """A confirmation or a choice under a command's answer (wipe my memory, delete everything, a model): the custom
    id carries the command, its options and who it was offered to (a press by anyone else does nothing)."""

    def __init__(self, label: str, press: Confirm, style: ButtonStyle = "secondary") -> None:
        """The button for one person."""
        super().__init__(
            discord.ui.Button(label=label[:DISCORD_BUTTON_LABEL], style=STYLES[style], custom_id=pack(press))
        )
        self.press = press

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ConfirmButton:
        """Rebuild the button from a pressed custom id."""
        press = unpack(match[0])
        assert isinstance(press, Confirm)  # the template only matches a Confirm's forms
        return cls(getattr(item, "label", None) or "", press)

    async def callback(self, interaction: discord.Interaction) -> None:
        """Run the command again with the button's options when its person pressed it."""
        owner = _owner(interaction)
        await owner.guard(interaction, press_confirm(owner.core, interaction, self.press))


class AllowButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"mcp:ok:(?P<ask>\d{1,18})"):
    """ "Allow mail: send_email" under an answer: a call of an untrusted MCP server parked for the person's OK; the
    custom id carries its id (the core runs it only for the person who was asked, once)."""

    def __init__(self, ask_id: int, label: str) -> None:
        """The button of one parked call."""
        super().__init__(
            discord.ui.Button(
                label=label[:DISCORD_BUTTON_LABEL],
                emoji="✅",
                style=discord.ButtonStyle.success,
                custom_id=pack(Allow(ask_id)),
            )
        )
        self.ask_id = ask_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> AllowButton:
        """Rebuild the button from a pressed custom id."""
        return cls(int(match["ask"]), getattr(item, "label", None) or "Allow")

    async def callback(self, interaction: discord.Interaction) -> None:
        """Run the parked call when the presser is the person who was asked."""
        owner = _owner(interaction)
        await owner.guard(interaction, press_allow(owner.core, interaction, self.ask_id))


BUTTONS = (StepsButton, ReminderButton, ConfirmButton, AllowButton)  # known custom ids


def buttons_view(rows: tuple[tuple[Button, ...], ...]) -> discord.ui.View | None:
    """An answer's buttons as a view of persistent buttons (None when it has none)."""
    items: list[discord.ui.DynamicItem[discord.ui.Button[Any]]] = []
    for row in rows:
        for b in row:
            if isinstance(b.press, OnTask):
                items.append(ReminderButton(b.press.action, b.press.task_id))
            elif isinstance(b.press, Confirm):
                items.append(ConfirmButton(b.label, b.press, b.style))
    return view(*items) if items else None


async def show_steps(core: Core, interaction: discord.Interaction, turn_id: int, shown: bool) -> None:
    """Load a turn's steps from PostgreSQL; ephemeral in servers, toggled in place in DMs."""
    found = await core.turn_steps(interaction_incoming(interaction, ""), turn_id)
    if isinstance(found, Error):  # gone, not theirs, or not allowed
        await note(interaction, found.message)
        return
    message = interaction.message
    if private_interaction(interaction) and message is not None:
        content = without_steps(message.content) if shown else with_steps(message.content, found.steps)
        toggled = view(StepsButton(turn_id, shown=not shown))
        await interaction.response.edit_message(content=content, view=toggled, allowed_mentions=NO_MENTIONS)
        return
    head = f"**Steps** — {summary_line(found.steps, found.elapsed_s)}\n"
    await note(interaction, head + steps_text(found.steps, DISCORD_MESSAGE_LIMIT - len(head)))


async def press_reminder(core: Core, interaction: discord.Interaction, action: str, task_id: int) -> None:
    """Done / Snooze: only the owner; the reminder message shows the outcome and loses its buttons."""
    ok, text = await core.press_reminder(interaction_incoming(interaction, ""), task_id, action)
    if not ok or interaction.message is None:
        await note(interaction, text)
        return
    content = f"{interaction.message.content}\n\n{text}"[:DISCORD_MESSAGE_LIMIT]
    await interaction.response.edit_message(content=content, view=None, allowed_mentions=NO_MENTIONS)


async def press_allow(core: Core, interaction: discord.Interaction, ask_id: int) -> None:
    """ "Allow" pressed: the call runs (only for the person who was asked, once; it may take longer than Discord's 3 s,
    so the press is deferred) and its result comes as a message of its own, as plain text; anyone else, a second or a
    late press gets a note only they see."""
    await interaction.response.defer()
    ok, text = await core.allow_mcp(interaction_incoming(interaction, ""), ask_id)
    shown = text if not ok else discord.utils.escape_markdown(text)[:DISCORD_MESSAGE_LIMIT]
    await interaction.followup.send(shown, ephemeral=not ok, allowed_mentions=NO_MENTIONS)


async def press_confirm(core: Core, interaction: discord.Interaction, press: Confirm) -> None:
    """A confirmation or a choice pressed: only by the person it was offered to; the message then shows the answer."""
    not_yours = NOT_YOURS.get(press.command, NOT_YOUR_PRESS)
    await _confirmed(core, interaction, int(press.owner), not_yours, press.command, press.args)


async def _confirmed(
    core: Core, interaction: discord.Interaction, owner_id: int, not_yours: str, name: CommandName, args: CommandArgs
) -> None:
    """Run the command a button stands for when its owner pressed it, and show its answer in place of the message
    (anyone else, or an answer that is not text, gets a note only they see)."""
    if interaction.user.id != owner_id:
        await note(interaction, not_yours)
        return
    inc = interaction_incoming(interaction, "")
    answer = await core.command(inc, name, args, must_answer=True)
    if not isinstance(answer, str):
        await note(interaction, core.refusal_text(inc))
        return
    await interaction.response.edit_message(content=answer, view=None, allowed_mentions=NO_MENTIONS)
