"""The HTTP API's sessions in SQL (sql/026): chats of platform `api`, owned by the identity that made one and seen by
every identity of its account; their messages as parts (read back from the turn journal), whole tool results as
artifacts, reminders delivered into a session and buttons pressed under its messages."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime
from typing import Any

from core.accounts import api_tokens
from core.api.parts import (
    REMINDER_PREFIX,
    REPLY,
    SESSION_PREFIX,
    ErrorPart,
    Message,
    Page,
    Part,
    Session,
    Status,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    artifact_id,
    clean_title,
    new_session_id,
    reminder_buttons,
    shown_result,
    tool_arguments,
)
from core.constants import (
    API_SESSION_ID_BYTES,
    API_TITLE_FROM_MESSAGE_CHARS,
    API_TOKEN_TOUCH_EVERY,
)
from core.storage.db import Pool
from core.textsafe import NUL
from core.types import Bearer

_OWNED = "c.platform = 'api' AND c.owner_id IN (SELECT id FROM users WHERE account_id = $1)"
_SESSION_COLUMNS = (
    "c.id AS chat_id, c.platform_chat_id, c.title, c.created_at,"
    " (SELECT max(t.started_at) FROM turns t WHERE t.chat_id = c.id) AS last_active_at"
)


# The session $4 of the account `f.account_id` as a lateral join: `caller` authenticates and finds it at once.
_SESSION_OF_CALLER = f"""
LEFT JOIN LATERAL (
    SELECT {_SESSION_COLUMNS} FROM chats c
    WHERE {_OWNED.replace("$1", "f.account_id")} AND c.platform_chat_id = $4
) s ON $4::text IS NOT NULL"""


_CALLER_SQL = api_tokens.AUTHENTICATE_SQL + _SESSION_OF_CALLER


async def caller(
    pool: Pool, secret: str, now: datetime, session_id: str | None
) -> tuple[Bearer, Session | None] | None:
    """Whom a bearer token acts as (api_tokens.authenticate), and in the same round trip the account's session
    `session_id` (None: not theirs, or none)."""
    if not api_tokens.well_formed(secret):
        return None
    row = await pool.fetchrow(_CALLER_SQL, api_tokens.secret_hash(secret), now, now - API_TOKEN_TOUCH_EVERY, session_id)
    if row is None:
        return None
    return api_tokens.bearer_of(row), session_of(row)


def session_of(row: Any) -> Session | None:
    """The session a row joined with _SESSION_OF_CALLER found, if any."""
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
                parts.append(
                    ToolCallPart(call.get("id", ""), fn.get("name", "?"), tool_arguments(fn.get("arguments")), at)
                )
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
