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
    FORGET_LABEL,
    FORGET_ME_CONFIRM,
    HIDE_STEPS,
    MEMORY_WIPE_CONFIRM,
    MODEL_NOT_YOURS,
    NOT_YOUR_BUTTON,
    NOT_YOUR_FORGET,
    REMINDER_BUTTON_LABELS,
    SHOW_STEPS,
    WIPE_LABEL,
    CommandArgs,
    CommandName,
    Core,
    Error,
    summary_line,
)

WIPE_HOW = "use /memory action:wipe"  # how a person asks for their own wipe on Discord
FORGET_HOW = "use /forget_me"  # how a person asks to delete their own data on Discord


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
                custom_id=f"steps:{turn_id}{':shown' if shown else ''}",
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
        super().__init__(discord.ui.Button(label=label, style=style, custom_id=f"rem:{action}:{task_id}"))
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


class WipeButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"mem:wipe:(?P<owner>\d+)"):
    """The wipe confirmation under /memory action:wipe; the custom id names who it was offered to (a press by
    anyone else does nothing: the core always acts on the presser's own memory)."""

    def __init__(self, owner_id: int) -> None:
        """The button for one person."""
        super().__init__(
            discord.ui.Button(label=WIPE_LABEL, style=discord.ButtonStyle.danger, custom_id=f"mem:wipe:{owner_id}")
        )
        self.owner_id = owner_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> WipeButton:
        """Rebuild the button from a pressed custom id."""
        return cls(int(match["owner"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Wipe the presser's memory when it is theirs to wipe."""
        owner = _owner(interaction)
        await owner.guard(interaction, press_wipe(owner.core, interaction, self.owner_id))


class ModelButton(
    discord.ui.DynamicItem[discord.ui.Button[Any]],
    template=r"model:(?P<choice>\d+:[0-9a-f]{8}):(?P<owner>\d+)",
):
    """One model under /model; the custom id carries the choice (its place in the list and a check of its name) and
    who it was offered to (a press by anyone else does nothing)."""

    def __init__(self, label: str, choice: str, owner_id: int) -> None:
        """The button of one model for one person."""
        super().__init__(
            discord.ui.Button(
                label=label[:DISCORD_BUTTON_LABEL],
                style=discord.ButtonStyle.secondary,
                custom_id=f"model:{choice}:{owner_id}",
            )
        )
        self.choice, self.owner_id = choice, owner_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ModelButton:
        """Rebuild the button from a pressed custom id."""
        return cls(getattr(item, "label", None) or "", match["choice"], int(match["owner"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Switch the presser's model when the button is theirs."""
        owner = _owner(interaction)
        await owner.guard(interaction, press_model(owner.core, interaction, self.choice, self.owner_id))


class ForgetButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"forget:(?P<owner>\d+)"):
    """The confirmation under /forget_me; like the wipe's, the custom id names who it was offered to (a press by
    anyone else does nothing: the core always deletes the presser's own account)."""

    def __init__(self, owner_id: int) -> None:
        """The button for one person."""
        super().__init__(
            discord.ui.Button(label=FORGET_LABEL, style=discord.ButtonStyle.danger, custom_id=f"forget:{owner_id}")
        )
        self.owner_id = owner_id

    @classmethod
    async def from_custom_id(
        cls, interaction: discord.Interaction, item: discord.ui.Item[Any], match: re.Match[str], /
    ) -> ForgetButton:
        """Rebuild the button from a pressed custom id."""
        return cls(int(match["owner"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        """Delete the presser's account when the button is theirs."""
        owner = _owner(interaction)
        await owner.guard(interaction, press_forget(owner.core, interaction, self.owner_id))


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
                custom_id=f"mcp:ok:{ask_id}",
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


BUTTONS = (StepsButton, ReminderButton, WipeButton, ModelButton, ForgetButton, AllowButton)  # known custom ids


def model_view(core: Core, owner_id: int) -> discord.ui.View | None:
    """The buttons under /model's list for one person (None when only the default is on offer)."""
    buttons = [ModelButton(name, choice, owner_id) for name, choice in core.model_menu()]
    return view(*buttons) if buttons else None


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


async def press_wipe(core: Core, interaction: discord.Interaction, owner_id: int) -> None:
    """A press of the wipe confirmation: only by the person it was offered to; the message shows what went."""
    await _confirmed(core, interaction, owner_id, NOT_YOUR_BUTTON.format(how=WIPE_HOW), "memory", MEMORY_WIPE_CONFIRM)


async def press_forget(core: Core, interaction: discord.Interaction, owner_id: int) -> None:
    """A press of the /forget_me confirmation: only by the person it was offered to; the message says it is done."""
    await _confirmed(
        core, interaction, owner_id, NOT_YOUR_FORGET.format(how=FORGET_HOW), "forget_me", FORGET_ME_CONFIRM
    )


async def press_model(core: Core, interaction: discord.Interaction, choice: str, owner_id: int) -> None:
    """A press of a model button: only by the person it was offered to; the message then says which model answers."""
    await _confirmed(core, interaction, owner_id, MODEL_NOT_YOURS, "model", {"choice": choice})


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
