"""Buttons (Show steps, a reminder's Done / Snooze, /remind's Undo, confirmations and choices, "Allow" for an MCP
call) as Slack button elements, and what a press (block_actions) does. A button carries all it needs, so it works
after a restart and in any process; every press is answered through its response_url (a refusal only the presser
sees, or the pressed message replaced by the outcome). The core decides who may press; a Confirm is the person's it
was offered to (its owner travels in the button's value, as JSON: Slack ids are not digits)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from adapters.slack.constants import COMMAND
from adapters.slack.incoming import command_incoming
from adapters.slack.limits import SLACK_BUTTON_LABEL, SLACK_TEXT_LIMIT
from adapters.slack.render import plain, render, render_parts
from adapters.slack.send import message_blocks, note, respond
from core import (
    MODEL_NOT_YOURS,
    NOT_YOUR_BUTTON,
    NOT_YOUR_FORGET,
    NOT_YOUR_PRESS,
    REMINDER_BUTTON_LABELS,
    SHOW_STEPS,
    Allow,
    Button,
    Confirm,
    Core,
    Error,
    OnTask,
    Press,
    ShowSteps,
    activity_lines,
    pack,
    summary_line,
    unpack,
)

CONFIRM_PREFIX = "confirm:"  # action ids of Confirm buttons (their value is JSON)
NOT_YOURS = {
    "memory": NOT_YOUR_BUTTON.format(how=f"use {COMMAND} memory wipe"),
    "forget_me": NOT_YOUR_FORGET.format(how=f"use {COMMAND} forget_me"),
    "model": MODEL_NOT_YOURS,
}
STYLES = {"primary": "primary", "success": "primary", "danger": "danger"}  # Slack has these two (and the default)


def element(label: str, press: Press, style: str = "secondary", index: int = 0) -> dict[str, Any]:
    """One button element."""
    if isinstance(press, Confirm):
        action_id = f"{CONFIRM_PREFIX}{index}"
        value = json.dumps({"c": press.command, "a": dict(press.args), "o": press.owner}, separators=(",", ":"))
    else:
        action_id = value = pack(press)
    out: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": label[:SLACK_BUTTON_LABEL], "emoji": True},
        "action_id": action_id,
        "value": value,
    }
    if style in STYLES:
        out["style"] = STYLES[style]
    return out


def steps_button(turn_id: int) -> dict[str, Any]:
    """Show steps of one turn."""
    return element(f"🔧 {SHOW_STEPS}", ShowSteps(turn_id))


def answer_buttons(rows: tuple[tuple[Button, ...], ...]) -> list[dict[str, Any]]:
    """A command answer's buttons, in one row."""
    return [element(b.label, b.press, b.style, i) for i, b in enumerate(b for row in rows for b in row)]


def reminder_buttons(names: Sequence[str], task_id: int) -> list[dict[str, Any]]:
    """A reminder's Done / Snooze buttons."""
    return [element(REMINDER_BUTTON_LABELS[n], OnTask(n, task_id), "success" if n == "done" else "") for n in names]


def pressed(action: dict[str, Any]) -> Press | None:
    """What a pressed button does (None: not one of this bot's)."""
    action_id, value = str(action.get("action_id", "")), str(action.get("value", ""))
    if action_id.startswith(CONFIRM_PREFIX):
        try:
            data = json.loads(value)
            return Confirm(str(data["c"]), {str(k): str(v) for k, v in data["a"].items()}, str(data["o"]))
        except (ValueError, KeyError, AttributeError, TypeError):
            return None
    return unpack(value)


async def press(core: Core, team: str, payload: dict[str, Any]) -> None:
    """A block_actions payload: each of this bot's buttons in it pressed."""
    url = str(payload.get("response_url", ""))
    for action in payload.get("actions") or []:
        what = pressed(action)
        if what is None:
            continue
        if isinstance(what, ShowSteps):
            await show_steps(core, team, payload, url, what.turn_id)
        elif isinstance(what, OnTask):
            await press_reminder(core, team, payload, url, what)
        elif isinstance(what, Confirm):
            await press_confirm(core, team, payload, url, what)
        elif isinstance(what, Allow):
            await press_allow(core, team, payload, url, what.ask_id)


async def show_steps(core: Core, team: str, payload: dict[str, Any], url: str, turn_id: int) -> None:
    """A turn's steps from PostgreSQL, only to the presser (its person, an admin, or someone in its chat: the core
    says)."""
    found = await core.turn_steps(command_incoming(team, payload), turn_id)
    if isinstance(found, Error):
        await note(url, found.message)
        return
    head = f"*Steps* — {plain(summary_line(found.steps, found.elapsed_s))}"
    lines = [f"> {plain(line)}" for line in activity_lines(found.steps)] or ["> (no tool calls)"]
    while len("\n".join([head, *lines])) > SLACK_TEXT_LIMIT and len(lines) > 1:
        lines.pop()
    await note(url, "\n".join([head, *lines]))


async def press_reminder(core: Core, team: str, payload: dict[str, Any], url: str, what: OnTask) -> None:
    """Done / Snooze / Undo: only the task's owner; the message then shows the outcome without buttons."""
    ok, text = await core.press_reminder(command_incoming(team, payload), what.task_id, what.action)
    if not ok:
        await note(url, text)
        return
    shown = f"{_message_text(payload)}\n\n{render(text)}"[:SLACK_TEXT_LIMIT]
    await respond(url, shown, message_blocks(shown), ephemeral=False, replace=True)


async def press_confirm(core: Core, team: str, payload: dict[str, Any], url: str, what: Confirm) -> None:
    """A confirmation or a choice: run its command again for the person it was offered to; the message becomes the
    answer. Anyone else is told only they see it."""
    inc = command_incoming(team, payload)
    if inc.user_id != what.owner:
        await note(url, NOT_YOURS.get(what.command, NOT_YOUR_PRESS))
        return
    answer = await core.command(inc, what.command, dict(what.args), must_answer=True)
    if not isinstance(answer, str):
        await note(url, core.refusal_text(inc))
        return
    shown = "\n".join(render_parts(answer))[:SLACK_TEXT_LIMIT]
    await respond(url, shown, message_blocks(shown), ephemeral=False, replace=True)


async def press_allow(core: Core, team: str, payload: dict[str, Any], url: str, ask_id: int) -> None:
    """ "Allow": the parked call runs for the person who was asked, once; its result goes into the chat as plain
    text (a refusal only to the presser)."""
    ok, text = await core.allow_mcp(command_incoming(team, payload), ask_id)
    if not ok:
        await note(url, text)
        return
    await respond(url, plain(text)[:SLACK_TEXT_LIMIT], ephemeral=False)


def _message_text(payload: dict[str, Any]) -> str:
    """The pressed message's text (its first section block's, else its text)."""
    message = payload.get("message") or {}
    for block in message.get("blocks") or []:
        if block.get("type") == "section":
            return str((block.get("text") or {}).get("text", ""))
    return str(message.get("text", ""))
