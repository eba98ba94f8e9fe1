"""The one slash command, `/assistant <command> <options>`, for every command of the core's catalogue (COMMANDS):
Slack names slash commands workspace-wide, several of ours are Slack's own (/remind, /status) and each must be set
up in the app, so one command with the catalogue's names as its first word keeps them all and never collides.
Answers go through the command's response_url: a personal command's only to its person (ephemeral), others into
the channel; /export's file goes into the person's DM."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from adapters.base import renamed
from adapters.slack.buttons import answer_buttons
from adapters.slack.constants import COMMAND
from adapters.slack.incoming import command_incoming
from adapters.slack.render import render_parts
from adapters.slack.send import message_blocks, note, patiently, respond
from core import COMMANDS, Core, Error, FileAnswer

log = logging.getLogger(__name__)

HELP = "help"
BY_NAME = {name: c for c in COMMANDS for name in (c.name, *c.aliases)}


def on_slack(text: str) -> str:
    """A command answer's `/tasks`, `/remind …` as Slack runs them: `/assistant tasks`, `/assistant remind …`."""
    return renamed(text, lambda name: f"{COMMAND} {name}")


def parse(text: str) -> tuple[str, str]:
    """(the command's name, the text after it) from what followed /assistant (nothing: help)."""
    word, _, rest = text.strip().partition(" ")
    return (word.lstrip("/").lower() or HELP), rest.strip()


async def run(core: Core, web: AsyncWebClient, team: str, payload: dict[str, Any], zone: str = "") -> None:
    """Answer one slash command without the model (`zone`: its person's, from their Slack profile)."""
    url = str(payload.get("response_url", ""))
    name, rest = parse(str(payload.get("text", "")))
    inc = replace(command_incoming(team, payload), zone=zone)
    command = BY_NAME.get(name)
    answer = await core.command(inc, command.name if command else name, rest, must_answer=True)
    if answer is None or isinstance(answer, Error):
        await note(url, on_slack(answer.message) if isinstance(answer, Error) else core.refusal_text(inc))
        return
    if isinstance(answer, FileAnswer):
        await send_file(web, str(payload.get("user_id")), answer)
        await note(url, "\n".join(render_parts(on_slack(answer.text))))
        return
    private = command is None or command.private
    text, buttons = (answer, []) if isinstance(answer, str) else (answer.text, answer_buttons(answer.rows))
    parts = render_parts(on_slack(text))
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        await respond(url, part, message_blocks(part, buttons=buttons if last else ()), ephemeral=private)


async def send_file(web: AsyncWebClient, user: str, answer: FileAnswer) -> None:
    """A command's file, into its person's DM with the bot (files upload v2)."""
    opened = await patiently(lambda: web.conversations_open(users=user))
    channel = str(opened["channel"]["id"])
    await patiently(
        lambda: web.files_upload_v2(
            channel=channel, filename=answer.filename, content=answer.data, initial_comment=answer.text[:3000]
        )
    )
