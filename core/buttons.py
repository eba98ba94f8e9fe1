"""Buttons under an answer, for every front end alike: what a press does (a `Press`) and the one codec that packs it
into the few bytes a platform carries (Telegram's callback data ≤ 64, Discord's custom id ≤ 100) and back. The
packed forms of the buttons sent before this codec are kept, so those keep working after an update."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, urlencode

Style = Literal["primary", "secondary", "success", "danger"]


@dataclass(frozen=True)
class Confirm:
    """Run `command` again with `args` for the person it was offered to (`owner`: their platform user id): a
    confirmation (wipe my memory) or a choice (this model)."""

    command: str
    args: Mapping[str, str]
    owner: str


@dataclass(frozen=True)
class OnTask:
    """A reminder's Done / Snooze, or Undo under /remind's answer: only the task's owner may press it."""

    action: str
    task_id: int


@dataclass(frozen=True)
class ShowSteps:
    """Show (or hide) a turn's steps, loaded from the database."""

    turn_id: int
    shown: bool = False


@dataclass(frozen=True)
class Allow:
    """Run an MCP call parked for the person's OK."""

    ask_id: int


Press = Confirm | OnTask | ShowSteps | Allow


@dataclass(frozen=True)
class Button:
    """One button: its label, what a press does, and how it looks where a platform has styles."""

    label: str
    press: Press
    style: Style = "secondary"


@dataclass(frozen=True)
class Buttons:
    """An answer with buttons under it (a confirmation, a choice): its Markdown and the buttons, by row."""

    text: str
    rows: tuple[tuple[Button, ...], ...] = field(default=())


# the packed forms of the buttons before the codec: a wipe's and a /forget_me's confirmation, a model
_WIPE = re.compile(r"mem:wipe:(\d+)")
_FORGET = re.compile(r"forget:(\d+)")
_MODEL = re.compile(r"model:(\d+:[0-9a-f]{8}):(\d+)")
_CONFIRM = re.compile(r"cmd:(\w+):(\w+):(.*)")  # any other command's: cmd:<command>:<owner>:<args as a query>
_TASK = re.compile(r"rem:(\w+):(\d{1,18})")
_STEPS = re.compile(r"steps:(\d{1,18})(:shown)?")
_ALLOW = re.compile(r"mcp:ok:(\d{1,18})")
WIPE_ARGS = {"action": "wipe", "confirm": "true"}
FORGET_ARGS = {"confirm": "true"}


def pack(press: Press) -> str:
    """The press as a button carries it."""
    if isinstance(press, OnTask):
        return f"rem:{press.action}:{press.task_id}"
    if isinstance(press, ShowSteps):
        return f"steps:{press.turn_id}{':shown' if press.shown else ''}"
    if isinstance(press, Allow):
        return f"mcp:ok:{press.ask_id}"
    args = dict(press.args)
    if press.command == "memory" and args == WIPE_ARGS:
        return f"mem:wipe:{press.owner}"
    if press.command == "forget_me" and args == FORGET_ARGS:
        return f"forget:{press.owner}"
    if press.command == "model" and list(args) == ["choice"]:
        return f"model:{args['choice']}:{press.owner}"
    return f"cmd:{press.command}:{press.owner}:{urlencode(args)}"


def unpack(data: str) -> Press | None:
    """What a pressed button does (None: not a button of this bot's)."""
    if m := _TASK.fullmatch(data):
        return OnTask(m[1], int(m[2]))
    if m := _STEPS.fullmatch(data):
        return ShowSteps(int(m[1]), bool(m[2]))
    if m := _ALLOW.fullmatch(data):
        return Allow(int(m[1]))
    if m := _WIPE.fullmatch(data):
        return Confirm("memory", WIPE_ARGS, m[1])
    if m := _FORGET.fullmatch(data):
        return Confirm("forget_me", FORGET_ARGS, m[1])
    if m := _MODEL.fullmatch(data):
        return Confirm("model", {"choice": m[1]}, m[2])
    if m := _CONFIRM.fullmatch(data):
        return Confirm(m[1], dict(parse_qsl(m[3], keep_blank_values=True)), m[2])
    return None


CONFIRM_IDS = r"(?:mem:wipe:\d+|forget:\d+|model:\d+:[0-9a-f]{8}:\d+|cmd:\w+:\w+:.*)"  # the packed Confirms' forms
