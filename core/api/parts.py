"""What the HTTP API says a session holds, the same for its SQL (core/api/sessions.py) and its live feeds
(core/api/feed.py): sessions, messages and their parts, the buttons under them, and the ids they are known by."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from core.buttons import Button as Choice
from core.constants import API_MESSAGE_ID_BYTES, API_RESULT_SHOWN, API_SESSION_ID_BYTES, API_SESSION_TITLE_CHARS
from core.reminders.buttons import BUTTONS
from core.texts import REMINDER_BUTTON_LABELS
from core.textsafe import strip_nul

SESSION_PREFIX = "ses_"
MESSAGE_PREFIX = "msg_"  # the platform message id of an API turn (its user message's id); the answer's adds REPLY
REPLY = "-reply"
REMINDER_PREFIX = "reminder:"  # the platform message id of a reminder delivered into a session


@dataclass(frozen=True)
class Session:
    """One API conversation."""

    id: str
    title: str
    created_at: datetime
    last_active_at: datetime | None


@dataclass(frozen=True)
class TextPart:
    """Text of the answer (or of the user's message)."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True)
class ToolCallPart:
    """A tool the model called, with its arguments."""

    call_id: str
    name: str
    args: dict[str, Any]
    started_at: datetime
    type: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True)
class ToolResultPart:
    """A tool call's outcome; a long result is cut here and whole at `artifact`."""

    call_id: str
    name: str
    ok: bool
    result: str
    finished_at: datetime
    artifact: str | None = None  # the artifact id of the whole result when `result` is cut
    type: Literal["tool_result"] = "tool_result"


@dataclass(frozen=True)
class ErrorPart:
    """Why the answer stopped (the same text the chats show)."""

    code: str
    message: str
    type: Literal["error"] = "error"


Part = TextPart | ToolCallPart | ToolResultPart | ErrorPart
Role = Literal["user", "assistant", "reminder"]
Status = Literal["running", "done", "cut_short", "failed"]


@dataclass(frozen=True)
class Button:
    """A button under a message that presses a task's button (`Core.press_reminder`): Done or Snooze under a
    reminder, Undo under /remind's answer."""

    action: str
    task_id: int

    @property
    def label(self) -> str:
        """What the button says (the chats' own labels)."""
        return REMINDER_BUTTON_LABELS[self.action]


@dataclass(frozen=True)
class Message:
    """A message of a session with its parts: the user's, the answer to it, or a reminder."""

    id: str
    role: Role
    created_at: datetime
    parts: tuple[Part, ...]
    status: Status = "done"
    buttons: tuple[Button, ...] = ()
    choices: tuple[Choice, ...] = ()  # a command's confirmation or choice: its buttons, each pressing a `Confirm`


@dataclass(frozen=True)
class Page:
    """Messages of a session, oldest first; `before`: the cursor of the page before it (None: this is the first)."""

    messages: tuple[Message, ...]
    before: str | None


def new_session_id() -> str:
    """A fresh, unguessable session id."""
    return SESSION_PREFIX + secrets.token_urlsafe(API_SESSION_ID_BYTES)


def message_key(idempotency_key: str | None) -> str:
    """The platform message id of a new API turn: from the client's Idempotency-Key (a retry is the same turn, answered
    once), else fresh."""
    if idempotency_key:
        digest = hashlib.sha256(idempotency_key.encode()).digest()[:API_MESSAGE_ID_BYTES]
        return MESSAGE_PREFIX + digest.hex()
    return MESSAGE_PREFIX + secrets.token_hex(API_MESSAGE_ID_BYTES)


def clean_title(title: str | None) -> str:
    """A session title on one line (without NUL, which PostgreSQL refuses), cut to API_SESSION_TITLE_CHARS."""
    return " ".join(strip_nul(title or "").split())[:API_SESSION_TITLE_CHARS]


def reminder_buttons(message_id: str) -> tuple[Button, ...]:
    """Done and Snooze under a stored reminder, by its message id (`reminder:<task>:<time>`; a notice has task 0)."""
    task = message_id.removeprefix(REMINDER_PREFIX).partition(":")[0]
    return tuple(Button(b, int(task)) for b in BUTTONS) if task.isdecimal() and int(task) > 0 else ()


def shown_result(envelope_json: str) -> tuple[str, bool]:
    """A tool result as a message part shows it: whole, or cut (True) to API_RESULT_SHOWN characters."""
    if len(envelope_json) <= API_RESULT_SHOWN:
        return envelope_json, False
    return envelope_json[:API_RESULT_SHOWN] + "…", True


def artifact_id(session_id: str, message_id: str, index: int) -> str:
    """The id of the `index`-th tool result (from 0) of a turn's answer."""
    return f"{session_id}.{message_id}.{index}"


def tool_arguments(raw: str | None) -> dict[str, Any]:
    """A tool call's arguments as an object ({} when the model sent no valid JSON object)."""
    try:
        parsed = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
