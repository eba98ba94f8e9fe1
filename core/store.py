"""Users, chats, turns and conversation messages in PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from core.db import Pool
from core.tools import ChatRef, UserRef
from core.types import Incoming

_IDENTITY_SQL = """
WITH u AS (
    INSERT INTO users (platform, platform_user_id, display_name) VALUES ($1, $2, $3)
    ON CONFLICT (platform, platform_user_id) DO UPDATE SET display_name = EXCLUDED.display_name
    RETURNING id, timezone
), c AS (
    INSERT INTO chats (platform, platform_chat_id, thread_id, kind, title) VALUES ($1, $4, $5, $6, $7)
    ON CONFLICT (platform, platform_chat_id, thread_id) DO UPDATE SET title = EXCLUDED.title
    RETURNING id, history_floor
)
SELECT u.id AS user_id, u.timezone, c.id AS chat_id, c.history_floor FROM u, c
"""

_START_TURN_SQL = """
WITH t AS (
    INSERT INTO turns (chat_id, user_id, platform_message_id) VALUES ($1, $2, $3)
    ON CONFLICT (chat_id, platform_message_id) WHERE platform_message_id IS NOT NULL DO NOTHING
    RETURNING id
)
INSERT INTO messages (chat_id, turn_id, user_id, role, content, author_name, platform_message_id)
SELECT $1, t.id, $2, 'user', $4, $5, $3 FROM t
RETURNING turn_id
"""

_HISTORY_SQL = """
SELECT id, role, content, author_name, tool_calls, tool_call_id FROM (
    SELECT id, role, content, author_name, tool_calls, tool_call_id FROM messages
    WHERE chat_id = $1 AND id > $2 ORDER BY id DESC LIMIT $3
) m ORDER BY id
"""


async def identify(pool: Pool, inc: Incoming, default_tz: str) -> tuple[UserRef, ChatRef]:
    """Upsert the speaking user and the chat (one round trip) and return their references."""
    row = await pool.fetchrow(
        _IDENTITY_SQL,
        inc.platform,
        inc.user_id,
        inc.user_name,
        inc.chat_id,
        inc.thread_id,
        inc.chat_kind,
        inc.chat_title,
    )
    assert row is not None
    user = UserRef(row["user_id"], inc.platform, inc.user_id, inc.user_name, row["timezone"] or default_tz)
    chat = ChatRef(row["chat_id"], inc.platform, inc.chat_id, inc.thread_id, inc.chat_kind, row["history_floor"])
    return user, chat


async def start_turn(pool: Pool, chat: ChatRef, user: UserRef, inc: Incoming) -> int | None:
    """Store the user's message and open a turn; None when this platform message was seen before."""
    turn_id: int | None = await pool.fetchval(
        _START_TURN_SQL, chat.id, user.id, inc.message_id, inc.text, inc.user_name
    )
    return turn_id


async def load_history(pool: Pool, chat: ChatRef, limit: int) -> list[asyncpg.Record]:
    """The last `limit` stored messages of the chat since its last reset, oldest first."""
    return await pool.fetch(_HISTORY_SQL, chat.id, chat.history_floor, limit)


async def add_assistant(
    pool: Pool, chat: ChatRef, turn_id: int, content: str | None, tool_calls: list[dict[str, Any]] | None
) -> None:
    """Store an assistant message (text and/or tool calls)."""
    await pool.execute(
        "INSERT INTO messages (chat_id, turn_id, role, content, tool_calls) VALUES ($1, $2, 'assistant', $3, $4)",
        chat.id,
        turn_id,
        content,
        tool_calls,
    )


async def add_tool_result(
    pool: Pool, chat: ChatRef, turn_id: int, call_id: str, name: str, envelope: dict[str, Any], duration_ms: int
) -> None:
    """Store a tool result in full (the prompt gets a truncated copy)."""
    await pool.execute(
        "INSERT INTO messages (chat_id, turn_id, role, content, tool_call_id, tool_name, tool_ok, duration_ms)"
        " VALUES ($1, $2, 'tool', $3, $4, $5, $6, $7)",
        chat.id,
        turn_id,
        json.dumps(envelope, ensure_ascii=False, default=str),
        call_id,
        name,
        bool(envelope.get("ok")),
        duration_ms,
    )


async def finish_turn(pool: Pool, turn_id: int, status: str, steps: int) -> None:
    """Record how the turn ended."""
    await pool.execute(
        "UPDATE turns SET status = $2, steps = $3, finished_at = now() WHERE id = $1", turn_id, status, steps
    )


async def finish_turn_with_answer(pool: Pool, chat: ChatRef, turn_id: int, text: str, status: str, steps: int) -> None:
    """Store the final answer and close the turn in one round trip."""
    await pool.execute(
        "WITH m AS (INSERT INTO messages (chat_id, turn_id, role, content) VALUES ($1, $2, 'assistant', $3))"
        " UPDATE turns SET status = $4, steps = $5, finished_at = now() WHERE id = $2",
        chat.id,
        turn_id,
        text,
        status,
        steps,
    )


async def reset_conversation(pool: Pool, chat: ChatRef) -> None:
    """Stop replaying the chat's earlier messages (they stay stored)."""
    await pool.execute(
        "UPDATE chats SET history_floor = COALESCE((SELECT max(id) FROM messages WHERE chat_id = $1), 0) WHERE id = $1",
        chat.id,
    )


async def set_timezone(pool: Pool, user: UserRef, tz_name: str) -> None:
    """Store the user's IANA time zone."""
    await pool.execute("UPDATE users SET timezone = $2 WHERE id = $1", user.id, tz_name)
