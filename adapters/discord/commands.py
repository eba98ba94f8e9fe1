"""Slash commands: /ask (a full turn) and one command per entry of the core's catalogue (COMMANDS), built in a loop;
uploaded only when Discord's set differs from ours."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

import discord
from discord import app_commands

from adapters.discord.buttons import buttons_view
from adapters.discord.gateway import Client, Owner
from adapters.discord.incoming import interaction_incoming
from adapters.discord.render import split_markdown
from adapters.discord.reply import InteractionReply
from adapters.discord.send import NO_MENTIONS, note, respond_parts, send_file
from core import COMMANDS, Command, CommandArgs, Core, Error, FileAnswer, Option

log = logging.getLogger(__name__)

# the slash commands work in servers and in a user's DM with the bot, through the server install only: never in a
# group DM or another DM (a user install), where a person's private answers would be seen by others
COMMAND_CONTEXTS = app_commands.AppCommandContext(guild=True, dm_channel=True, private_channel=False)
COMMAND_INSTALLS = app_commands.AppInstallationType(guild=True, user=False)
KINDS: dict[str, type] = {"text": str, "integer": int, "flag": bool}  # a catalogue option's kind → its Discord type
ASK_DESCRIPTION, ASK_MESSAGE = "Ask the assistant something", "What you want to ask or tell me"
ALREADY_ANSWERED = "Already answered."
SlashCommand = app_commands.Command[Any, ..., None]
FILE_COMMANDS = frozenset({"export"})  # answered with a file: deferred, then followed up


async def install_commands(client: Client, owner: Owner, *, sync: bool) -> None:
    """Give the client its command tree with /ask and the catalogue's commands; `sync`: upload them if changed."""
    client.tree = tree = app_commands.CommandTree(
        client, allowed_contexts=COMMAND_CONTEXTS, allowed_installs=COMMAND_INSTALLS
    )

    async def on_error(interaction: discord.Interaction, error: app_commands.AppCommandError, /) -> None:
        await owner.fail(interaction, error)  # errors of the command tree itself: the same funnel

    tree.on_error = on_error  # type: ignore[method-assign]
    tree.add_command(_ask_command(owner))
    for command in COMMANDS:
        tree.add_command(slash_command(command, owner))
    if sync:
        await sync_commands(client)


def _ask_command(owner: Owner) -> SlashCommand:
    """/ask message: a full turn, answered in the channel like a mention."""

    @app_commands.describe(message=ASK_MESSAGE)
    async def ask(interaction: discord.Interaction, message: str) -> None:
        await owner.guard(interaction, answer_ask(owner.core, interaction, message))

    return app_commands.Command(name="ask", description=ASK_DESCRIPTION, callback=ask)


def slash_command(command: Command, owner: Owner) -> SlashCommand:
    """The slash command of one catalogue entry: its options typed, described and with their choices, all
    optional; personal answers are ephemeral."""

    async def run(interaction: discord.Interaction, **values: str | int | bool | None) -> None:
        args = command_args(values)
        await owner.guard(interaction, answer_command(owner.core, interaction, command, args))

    run.__signature__ = _signature(command.options)  # type: ignore[attr-defined]  # what discord.py reads
    callback = app_commands.describe(**{o.name: o.description for o in command.options})(run)
    choices = {o.name: [app_commands.Choice(name=c, value=c) for c in o.choices] for o in command.options if o.choices}
    if choices:
        callback = app_commands.choices(**choices)(callback)
    return app_commands.Command(name=command.name, description=_sentence(command.summary), callback=callback)


def _signature(options: Sequence[Option]) -> inspect.Signature:
    """(interaction, then each option as an optional keyword of its kind's type): how discord.py learns them."""
    first = inspect.Parameter("interaction", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=discord.Interaction)
    rest = [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=KINDS[o.kind])
        for o in options
    ]
    return inspect.Signature([first, *rest])


def _sentence(summary: str) -> str:
    """A catalogue summary as Discord shows a description: starting with a capital."""
    return summary[:1].upper() + summary[1:]


def command_args(values: Mapping[str, str | int | bool | None]) -> dict[str, str]:
    """The options given, by name, as the catalogue's text values (a flag is "true" or "false")."""
    return {name: _text(value) for name, value in values.items() if value is not None}


def _text(value: str | int | bool) -> str:
    """One option value as text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def answer_command(core: Core, interaction: discord.Interaction, command: Command, args: CommandArgs) -> None:
    """A command answered without the LLM; personal answers are ephemeral (a refusal always is); buttons go under
    the last part."""
    inc = interaction_incoming(interaction, "")
    if command.name in FILE_COMMANDS:
        await answer_file(core, interaction, command)
        return
    answer = await core.command(inc, command.name, args, must_answer=True)
    if isinstance(answer, Error | FileAnswer) or answer is None:
        await note(interaction, core.refusal_text(inc))
        return
    text, buttons = (answer, None) if isinstance(answer, str) else (answer.text, buttons_view(answer.rows))
    await respond_parts(interaction, split_markdown(text), ephemeral=command.private, buttons=buttons)


async def answer_file(core: Core, interaction: discord.Interaction, command: Command) -> None:
    """A command whose answer is a file (/export): deferred first, since building the file may take longer than the
    3 s Discord waits, then sent as a follow-up only its person sees (in a server too)."""
    await interaction.response.defer(ephemeral=True, thinking=True)
    inc = interaction_incoming(interaction, "")
    answer = await core.command(inc, command.name, {}, must_answer=True)
    if isinstance(answer, FileAnswer):
        await send_file(interaction, answer)
        return
    text = answer if isinstance(answer, str) else core.refusal_text(inc)
    await interaction.followup.send(text, ephemeral=True, allowed_mentions=NO_MENTIONS)


async def answer_ask(core: Core, interaction: discord.Interaction, text: str) -> None:
    """/ask: a full turn, answered in the channel like a mention (interactions stay out of the inbox: they must be
    answered within 3 s by the process that got them)."""
    inc = interaction_incoming(interaction, text)
    if not core.is_allowed(inc):
        await note(interaction, core.refusal_text(inc))
        return
    await interaction.response.defer(thinking=True)
    reply = InteractionReply(interaction)
    await core.answer(inc, reply)
    if not reply.answered:  # a duplicate delivery of the same interaction
        await interaction.followup.send(ALREADY_ANSWERED, ephemeral=True, allowed_mentions=NO_MENTIONS)


async def sync_commands(client: Client) -> None:
    """Upload the slash commands only when Discord's set differs from ours (not on every start/reconnect)."""
    app_id = client.application_id
    if app_id is None:
        return
    try:
        remote = await client.http.get_global_commands(app_id)
        local = [c.to_dict(client.tree) for c in client.tree.get_commands()]
        if _canonical(cast(list[dict[str, Any]], remote)) != _canonical(local):
            await client.tree.sync()
            log.info("Discord slash commands synced (%d)", len(local))
    except discord.HTTPException as e:
        log.warning("could not sync Discord slash commands (they may be out of date): %s", e)


def _canonical(commands: Sequence[dict[str, Any]]) -> list[Any]:
    """The parts of application commands that matter for deciding whether to sync."""
    return sorted(_command_key(c) for c in commands)


def _command_key(command: dict[str, Any]) -> tuple[Any, ...]:
    """One command's name, description, type, options, contexts and install types."""
    return (
        command.get("name"),
        command.get("description"),
        command.get("type", 1),
        tuple(_option_key(o) for o in command.get("options") or []),
        tuple(sorted(command.get("contexts") or ())),
        tuple(sorted(command.get("integration_types") or ())),
    )


def _option_key(option: dict[str, Any]) -> tuple[Any, ...]:
    """One option's name, description, type, whether required, and its own options."""
    return (
        option.get("name"),
        option.get("description"),
        option.get("type"),
        bool(option.get("required", False)),
        tuple(_option_key(o) for o in option.get("options") or []),
    )
