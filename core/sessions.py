"""The HTTP API's sessions (sql/026): chats of platform `api`, owned by the identity that made one and seen by every
identity of its account; their messages as parts (read back from the turn journal), whole tool results as artifacts,
and the live feed of a running answer (numbered events, so a client that reconnects reads on from where it was)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from core.constants import (
    API_FEED_KEEP_S,
    API_FEEDS_KEPT,
    API_MESSAGE_ID_BYTES,
    API_RESULT_SHOWN,
    API_SESSION_ID_BYTES,
    API_SESSION_TITLE_CHARS,
    API_TITLE_FROM_MESSAGE_CHARS,
)
from core.reminders.buttons import BUTTONS
from core.storage.db import Pool
from core.texts import REMINDER_BUTTON_LABELS
from core.textsafe import NUL, strip_nul
from core.timeutil import Clock
from core.types import Assistant, AssistantDelta, Error, Event, ToolCall, ToolResult

API = "api"  # the platform (chats.platform) of the API's sessions
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


# ---- storage ------------------------------------------------------------------------------------------------------

_OWNED = "c.platform = 'api' AND c.owner_id IN (SELECT id FROM users WHERE account_id = $1)"
_SESSION_COLUMNS = (
    "c.id AS chat_id, c.platform_chat_id, c.title, c.created_at,"
    " (SELECT max(t.started_at) FROM turns t WHERE t.chat_id = c.id) AS last_active_at"
)


# The session $4 of the account `f.account_id` as a lateral join (api_tokens authenticates and finds it at once).
SESSION_OF_CALLER = f"""
LEFT JOIN LATERAL (
    SELECT {_SESSION_COLUMNS} FROM chats c
    WHERE {_OWNED.replace("$1", "f.account_id")} AND c.platform_chat_id = $4
) s ON $4::text IS NOT NULL"""


def session_of(row: Any) -> Session | None:
    """The session a row joined with SESSION_OF_CALLER found, if any."""
    return None if row["chat_id"] is None else _session(row)


def _session(row: Any) -> Session:
    """A Session from a row of _SESSION_COLUMNS."""
    return Session(row["platform_chat_id"], row["title"], row["created_at"], row["last_active_at"])


async def create(pool: Pool, identity_id: int, title: str | None, session_id: str | None = None) -> Session | None:
    """A new empty session of an identity (None: `session_id` is taken)."""
    row = await pool.fetchrow(
        "INSERT INTO chats (platform, platform_chat_id, kind, title, owner_id) VALUES ('api', $1, 'private', $2, $3)"
        " ON CONFLICT DO NOTHING"
        " RETURNING id AS chat_id, platform_chat_id, title, created_at, NULL::timestamptz AS last_active_at",
        session_id or new_session_id(),
        clean_title(title),
        identity_id,
    )
    return None if row is None else _session(row)


def client_session_id(identity_id: int, client_key: str) -> str:
    """The session id a client's own conversation id maps to for an identity (Open WebUI's chat id)."""
    digest = hashlib.sha256(f"{identity_id}\0{client_key}".encode()).digest()[:API_SESSION_ID_BYTES]
    return SESSION_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


async def listed(pool: Pool, account_id: int, limit: int) -> list[Session]:
    """The account's sessions, the most recently used first."""
    rows = await pool.fetch(
        f"SELECT {_SESSION_COLUMNS} FROM chats c WHERE {_OWNED} ORDER BY coalesce("
        "(SELECT max(t.started_at) FROM turns t WHERE t.chat_id = c.id), c.created_at) DESC, c.id DESC LIMIT $2",
        account_id,
        limit,
    )
    return [_session(r) for r in rows]


async def find(pool: Pool, account_id: int, session_id: str) -> tuple[int, Session] | None:
    """The account's session of that id with its chat row id; None for another account's or none (no difference)."""
    if NUL in session_id:  # no session has it (ids come from a request's path)
        return None
    row = await pool.fetchrow(
        f"SELECT {_SESSION_COLUMNS} FROM chats c WHERE {_OWNED} AND c.platform_chat_id = $2",
        account_id,
        session_id,
    )
    return None if row is None else (row["chat_id"], _session(row))


async def exists(pool: Pool, session_id: str) -> bool:
    """Whether a session of that id exists (anyone's)."""
    if NUL in session_id:
        return False
    return bool(await pool.fetchval("SELECT 1 FROM chats WHERE platform = 'api' AND platform_chat_id = $1", session_id))


async def delete(pool: Pool, account_id: int, session_id: str) -> bool:
    """Delete the account's session with its turns, messages and the tasks' link to it (False: none such)."""
    if NUL in session_id:
        return False
    status = await pool.execute(
        f"DELETE FROM chats c WHERE {_OWNED} AND c.platform_chat_id = $2", account_id, session_id
    )
    return status != "DELETE 0"


_MESSAGES_SQL = """
SELECT t.id, t.platform_message_id, t.status, t.started_at, t.error_code, t.error_message,
       (SELECT coalesce(json_agg(json_build_object(
            'id', m.id, 'role', m.role, 'content', m.content, 'tool_calls', m.tool_calls,
            'tool_call_id', m.tool_call_id, 'tool_name', m.tool_name, 'tool_ok', m.tool_ok,
            'created_at', m.created_at) ORDER BY m.id), '[]')
        FROM messages m WHERE m.turn_id = t.id) AS rows
FROM turns t
WHERE t.chat_id = $1 AND t.id < $2 {pmid}
ORDER BY t.id DESC LIMIT $3
"""


async def page(pool: Pool, chat_id: int, session_id: str, before: int | None, limit: int) -> Page:
    """A page of a session's messages: the `limit` turns before turn `before` (None: the latest), oldest first."""
    rows = await pool.fetch(_MESSAGES_SQL.format(pmid=""), chat_id, before or 2**62, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    messages = [m for r in reversed(rows) for m in turn_messages(r, session_id)]
    return Page(tuple(messages), str(rows[-1]["id"]) if more and rows else None)


_TURN_SQL = _MESSAGES_SQL.format(pmid="AND t.platform_message_id = $4").replace(
    "WHERE t.chat_id = $1 AND",
    f"WHERE t.chat_id = (SELECT c.id FROM chats c WHERE {_OWNED} AND c.platform_chat_id = $5) AND",
)


async def turn_of(pool: Pool, account_id: int, session_id: str, message_id: str) -> tuple[Message, ...] | None:
    """The messages of the turn whose platform message id is `message_id` in the account's session (None: no such
    turn, or not the account's), in one round trip."""
    if NUL in session_id + message_id:
        return None
    rows = await pool.fetch(_TURN_SQL, account_id, 2**62, 1, message_id, session_id)
    return tuple(turn_messages(rows[0], session_id)) if rows else None


def turn_messages(turn: Any, session_id: str) -> list[Message]:
    """A stored turn as the API shows it: the user's message, then the answer with its parts (or a reminder)."""
    pmid = turn["platform_message_id"] or f"turn-{turn['id']}"
    rows = turn["rows"]
    if isinstance(rows, str):
        rows = json.loads(rows)
    if pmid.startswith(REMINDER_PREFIX):  # the reminder, then what a press of its buttons did (no buttons then)
        texts = [r["content"] or "" for r in rows if r["role"] == "reminder"]
        buttons = reminder_buttons(pmid) if len(texts) == 1 else ()
        return [Message(pmid, "reminder", turn["started_at"], (TextPart("\n\n".join(texts)),), buttons=buttons)]
    said = [TextPart(r["content"]) for r in rows if r["role"] == "user" and r["content"]]
    out = [Message(pmid, "user", turn["started_at"], tuple(said))] if said else []
    parts: list[Part] = []
    calls: dict[str, str] = {}
    results = 0
    for r in rows:
        at = datetime.fromisoformat(r["created_at"])
        if r["role"] == "assistant":
            if r["content"]:
                parts.append(TextPart(r["content"]))
            for call in r["tool_calls"] or []:
                fn = call.get("function") or {}
                calls[call.get("id", "")] = fn.get("name", "?")
                parts.append(ToolCallPart(call.get("id", ""), fn.get("name", "?"), _args(fn.get("arguments")), at))
        elif r["role"] == "tool":
            shown, cut = shown_result(r["content"] or "")
            name = r["tool_name"] or calls.get(r["tool_call_id"] or "", "?")
            artifact = artifact_id(session_id, pmid, results) if cut else None
            parts.append(ToolResultPart(r["tool_call_id"] or "", name, bool(r["tool_ok"]), shown, at, artifact))
            results += 1
    if turn["error_message"]:
        parts.append(ErrorPart(turn["error_code"] or "error", turn["error_message"]))
    status: Status = turn["status"]
    if parts or status == "running":
        out.append(Message(pmid + REPLY, "assistant", turn["started_at"], tuple(parts), status))
    return out


def _args(raw: str | None) -> dict[str, Any]:
    """A tool call's arguments as an object ({} when the model sent no valid JSON object)."""
    try:
        parsed = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


async def artifact(pool: Pool, account_id: int, artifact: str) -> tuple[str, str] | None:
    """A whole tool result by its artifact id: (the tool's name, the result JSON); None when not the account's."""
    session_id, _, rest = artifact.partition(".")
    message_id, _, index = rest.rpartition(".")
    if not index.isdecimal() or len(index) > 6 or NUL in artifact:
        return None
    row = await pool.fetchrow(
        f"SELECT m.tool_name, m.content FROM chats c JOIN turns t ON t.chat_id = c.id"
        f" JOIN messages m ON m.turn_id = t.id AND m.role = 'tool'"
        f" WHERE {_OWNED} AND c.platform_chat_id = $2 AND t.platform_message_id = $3"
        f" ORDER BY m.id OFFSET $4 LIMIT 1",
        account_id,
        session_id,
        message_id,
        int(index),
    )
    return None if row is None else (row["tool_name"] or "?", row["content"] or "")


async def store_reminder(pool: Pool, session_id: str, key: str, text: str) -> bool:
    """A reminder delivered into a session: stored as its own turn (False: the session is gone)."""
    row = await pool.fetchval(
        "WITH c AS (SELECT id FROM chats WHERE platform = 'api' AND platform_chat_id = $1),"
        " t AS (INSERT INTO turns (chat_id, platform_message_id, status, finished_at)"
        "       SELECT id, $2, 'done', now() FROM c ON CONFLICT DO NOTHING RETURNING id, chat_id),"
        " m AS (INSERT INTO messages (chat_id, turn_id, role, content) SELECT chat_id, id, 'reminder', $3 FROM t)"
        " SELECT count(*) FROM c",
        session_id,
        REMINDER_PREFIX + key,
        text,
    )
    return bool(row)


async def title_untitled(pool: Pool, session_id: str, said: str) -> None:
    """Title a session made without a title with the start of its first message (no other session changes)."""
    title = clean_title(said[:API_TITLE_FROM_MESSAGE_CHARS])
    if title:
        await pool.execute(
            "UPDATE chats SET title = $2 WHERE platform = 'api' AND platform_chat_id = $1 AND title = ''",
            session_id,
            title,
        )


async def note_pressed(pool: Pool, account_id: int, session_id: str, message_id: str, task_id: int, said: str) -> None:
    """Keep what a press of a reminder's button did under that reminder of the account's session (its buttons go);
    nothing for a message that is no reminder of that task (a command's answer is not stored)."""
    if NUL in session_id + message_id or not message_id.startswith(f"{REMINDER_PREFIX}{task_id}:"):
        return
    await pool.execute(
        f"INSERT INTO messages (chat_id, turn_id, role, content) SELECT c.id, t.id, 'reminder', $4 FROM chats c"
        f" JOIN turns t ON t.chat_id = c.id AND t.platform_message_id = $3"
        f" WHERE {_OWNED} AND c.platform_chat_id = $2",
        account_id,
        session_id,
        message_id,
        said,
    )


# ---- live feeds -----------------------------------------------------------------------------------------------------


@dataclass
class Feed:
    """The events of one API answer as they happen, numbered from 1; listeners read on from any number."""

    session_id: str
    message_id: str  # the user message's id (the turn's platform message id)
    text: str  # what the user said
    clock: Clock
    started_at: datetime
    events: list[Event] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)  # when each event came
    done: bool = False
    ended_at: float | None = None  # time.monotonic() when it finished
    buttons: tuple[Button, ...] = ()  # under the answer (a command's: Undo under /remind's)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, event: Event) -> None:
        """Add an event and wake the listeners."""
        self.times.append(self.clock())
        self.events.append(event)
        self._wake()

    def finish(self) -> None:
        """No more events."""
        self.done, self.ended_at = True, time.monotonic()
        self._wake()

    def _wake(self) -> None:
        """Wake everyone waiting for the next event."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(self, after: int, idle_s: float) -> AsyncIterator[tuple[int, Event] | None]:
        """The events numbered after `after`, as they come, until the feed ends; None after `idle_s` without one."""
        n = max(0, after)
        while True:
            while n < len(self.events):
                n += 1
                yield n, self.events[n - 1]
            if self.done:
                return
            changed = self._changed
            try:
                async with asyncio.timeout(idle_s):  # not wait_for: that makes a task for every event
                    await changed.wait()
            except TimeoutError:
                yield None

    @property
    def answer(self) -> Assistant | Error | None:
        """The final event, once there is one."""
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Assistant | Error) else None


class Feeds:
    """This process's feeds: the running answers, and the finished ones for API_FEED_KEEP_S (to resume)."""

    def __init__(self) -> None:
        """No feeds yet."""
        self._by_message: dict[str, Feed] = {}  # in the order they began
        self._pruned = 0.0  # time.monotonic() of the last pruning

    def add(self, feed: Feed) -> None:
        """Keep a new feed (and let old finished ones go)."""
        self._prune()
        self._by_message[f"{feed.session_id}/{feed.message_id}"] = feed

    def get(self, session_id: str, message_id: str) -> Feed | None:
        """The feed of a turn, by its user message's id."""
        return self._by_message.get(f"{session_id}/{message_id}")

    def latest(self, session_id: str) -> Feed | None:
        """The session's newest feed in this process."""
        found = [f for f in self._by_message.values() if f.session_id == session_id]
        return found[-1] if found else None

    def _prune(self) -> None:
        """Forget feeds finished more than API_FEED_KEEP_S ago, and the oldest finished past API_FEEDS_KEPT (looked
        at once a second, or when past the cap: not on every answer)."""
        now = time.monotonic()
        if now - self._pruned < 1.0 and len(self._by_message) <= API_FEEDS_KEPT:
            return
        self._pruned = now
        for key, feed in list(self._by_message.items()):
            if feed.ended_at is not None and (
                now - feed.ended_at > API_FEED_KEEP_S or len(self._by_message) > API_FEEDS_KEPT
            ):
                del self._by_message[key]


ProgressKind = Literal["delta", "tool_call", "tool_result", "error", "done"]


@dataclass(frozen=True)
class Progress:
    """One step of a live answer as the API streams it: event `number` of the feed changed part `part` of the answer
    (a piece of text, a new tool call or result part, the error part), or ended it ("done")."""

    number: int
    part: int
    kind: ProgressKind
    delta: str = ""
    new: Part | None = None


async def progress(feed: Feed, after: int, idle_s: float) -> AsyncIterator[Progress | None]:
    """The answer's steps after event number `after` (parts numbered as GET …/messages numbers them), as they come;
    None after `idle_s` without one."""
    index, text_part, results, streamed = -1, -1, 0, ""
    async for item in feed.follow(0, idle_s):
        if item is None:
            yield None
            continue
        n, event = item
        at = feed.times[n - 1]
        step: Progress | None = None
        if isinstance(event, AssistantDelta):
            if text_part < 0:
                index = text_part = index + 1
            streamed += event.text
            step = Progress(n, text_part, "delta", delta=event.text)
        elif isinstance(event, ToolCall):
            index, text_part, streamed = index + 1, -1, ""
            step = Progress(
                n, index, "tool_call", new=ToolCallPart(event.call_id, event.name, _args(event.arguments), at)
            )
        elif isinstance(event, ToolResult):
            index, text_part, streamed = index + 1, -1, ""
            shown, cut = shown_result(json.dumps(event.envelope, ensure_ascii=False, default=str))
            art = artifact_id(feed.session_id, feed.message_id, results) if cut else None
            results += 1
            step = Progress(
                n,
                index,
                "tool_result",
                new=ToolResultPart(event.call_id, event.step.name, event.step.ok, shown, at, art),
            )
        elif isinstance(event, Error):
            index += 1
            step = Progress(n, index, "error", new=ErrorPart(event.code, event.message))
        elif isinstance(event, Assistant):  # what the model did not stream (a line added after it) comes as a delta
            rest = unstreamed(event.text, streamed)
            if rest and text_part < 0:
                index = text_part = index + 1
            step = Progress(n, text_part, "delta", delta=rest) if rest else Progress(n, index, "done")
        if step is not None and n > after:
            yield step


def unstreamed(final: str, streamed: str) -> str:
    """The end of an answer's final text its streamed text lacks ("" when there is none, or the final text does not
    go on from the streamed one)."""
    if final.startswith(streamed):
        return final[len(streamed) :]
    kept = streamed.rstrip()  # the final text is often the streamed one stripped, then more
    rest = final[len(kept) :] if final.startswith(kept) else ""
    return rest if rest.strip() else ""
