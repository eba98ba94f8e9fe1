"""Users, chats, turns and conversation messages in PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from asyncpg import Record

from core.activity import heard_step, make_step
from core.storage.db import Pool, affected, retry_dropped
from core.timeutil import valid_zone
from core.types import JOB_MESSAGE_PREFIX, ChatRef, Error, Incoming, Step, TurnSteps, UserRef

# {counted}: whether this message counts towards the person's message rate (sql/018; a SQL boolean expression)
_UPSERT_TEMPLATE = """
WITH u AS (
    INSERT INTO users (platform, platform_user_id, display_name, rate_window_start, rate_count)
    VALUES ($1, $2, $3, now(), CASE WHEN {counted} THEN 1 ELSE 0 END)
    ON CONFLICT (platform, platform_user_id) DO UPDATE SET display_name = EXCLUDED.display_name,
        rate_count = CASE WHEN NOT {counted} THEN users.rate_count
                          WHEN users.rate_window_start > now() - interval '1 minute' THEN users.rate_count + 1
                          ELSE 1 END,
        rate_window_start = CASE WHEN NOT {counted} OR users.rate_window_start > now() - interval '1 minute'
                                 THEN users.rate_window_start ELSE now() END
    RETURNING id, account_id, rate_count
), c AS (
    INSERT INTO chats (platform, platform_chat_id, thread_id, kind, title) VALUES ({chat_platform}, $4, $5, $6, $7)
    ON CONFLICT (platform, platform_chat_id, thread_id) DO UPDATE  -- an API session keeps its own title (sql/026)
    SET title = CASE WHEN chats.owner_id IS NULL THEN EXCLUDED.title ELSE chats.title END
    RETURNING id, history_floor
)"""
_UPSERT_CTES = _UPSERT_TEMPLATE.format(
    counted="(coalesce($8, '') NOT LIKE $20)", chat_platform="$28"
)  # a turn's start: jobs aside
_IDENTIFY_SQL = (
    _UPSERT_TEMPLATE.format(counted="false", chat_platform="$8")
    + "\nSELECT u.id AS user_id, u.account_id, acc.timezone, acc.model, c.id AS chat_id, c.history_floor"
    + " FROM u LEFT JOIN accounts acc ON acc.id = u.account_id, c"
)
_BEGIN_SQL = (
    _UPSERT_CTES
    + """, t AS (
    INSERT INTO turns (chat_id, user_id, platform_message_id) SELECT c.id, u.id, $8 FROM u, c WHERE $10
    ON CONFLICT (chat_id, platform_message_id) WHERE platform_message_id IS NOT NULL
    DO UPDATE SET user_id = EXCLUDED.user_id, status = 'running', finished_at = NULL
    WHERE turns.user_id = EXCLUDED.user_id AND (
        -- a retried statement ($11 = 1) takes back our own unanswered turn
        ($11 = 1 AND turns.status = 'running'
            AND NOT EXISTS (SELECT 1 FROM messages x WHERE x.turn_id = turns.id AND x.role <> 'user'))
        -- a redelivered update ($11 = 2: its first handler died or was cut) runs again unless an answer was stored
        OR ($11 = 2 AND turns.error_message IS NULL AND NOT EXISTS (  -- an error answer is an answer too
            SELECT 1 FROM messages x WHERE x.turn_id = turns.id AND x.role = 'assistant' AND x.tool_calls IS NULL)))
    RETURNING id, chat_id, user_id, xmax = 0 AS fresh
), gone AS (  -- the half-done steps of a redelivered turn: it starts over
    DELETE FROM messages WHERE $11 = 2 AND turn_id = (SELECT id FROM t WHERE NOT t.fresh) AND role <> 'user'
), m AS (  -- others' text that came with the message first (marked with its kind and origin), then the speaker's own
    INSERT INTO messages (chat_id, turn_id, user_id, role, content, author_name, platform_message_id, quoted_kind,
                          quoted_origin)
    SELECT t.chat_id, t.id, t.user_id, 'user', q.body, $3, $8, q.kind, q.origin
    FROM t, (SELECT * FROM unnest($17::text[], $18::text[], $19::text[]) WITH ORDINALITY AS q(kind, origin, body, n)
             UNION ALL SELECT NULL, NULL, $9, NULL) q
    WHERE t.fresh AND q.body <> ''
    ORDER BY q.n NULLS LAST
    RETURNING turn_id
)
-- the account's time zone and /model choice (sql/020, 023); a new identity's account row is made at the statement's
-- end (a trigger), so it is not there yet: the defaults
SELECT u.id AS user_id, u.account_id, acc.timezone, acc.model,
       c.id AS chat_id, c.history_floor, (SELECT id FROM t) AS turn_id
FROM u LEFT JOIN accounts acc ON acc.id = u.account_id, c
"""
)

# A turn's start in one round trip: _BEGIN_SQL plus the replay window and the due-soon tasks. The subqueries
# see the snapshot from before this statement, so the new message is not among them (the caller appends it);
# a retried start that took back its own turn leaves that turn's message out for the same reason. With $16
# (a personal turn: not in a group) it also loads the speaker's core memory blocks.
_BEGIN_WITH_CONTEXT_SQL = (
    _BEGIN_SQL.rstrip().removesuffix("FROM u LEFT JOIN accounts acc ON acc.id = u.account_id, c").rstrip()
    + """,
    (SELECT coalesce(json_agg(h ORDER BY h.id), '[]') FROM (
        SELECT m.id, m.role, m.content, m.author_name, m.tool_calls, m.tool_call_id, m.quoted_kind, m.quoted_origin,
               CASE WHEN $15 THEN m.platform_message_id END AS platform_message_id,
               CASE WHEN $15 THEN (  -- who started the message's turn (groups: whose words the context holds)
                   SELECT a.platform_user_id FROM users a
                   WHERE a.id = coalesce(m.user_id, (SELECT x.user_id FROM turns x WHERE x.id = m.turn_id))
               ) END AS author_id
        FROM messages m
        WHERE m.chat_id = c.id AND m.id > c.history_floor AND m.turn_id IS DISTINCT FROM (SELECT id FROM t)
          AND m.role <> 'reminder'  -- a reminder shown in an API session (sql/026) is not the conversation
        ORDER BY m.id DESC LIMIT $12) h) AS history,
    (SELECT coalesce(json_agg(d ORDER BY d.due_at), '[]') FROM (
        SELECT id, title, due_at, own_words FROM tasks
        WHERE user_id = u.account_id AND status IN ('pending', 'in_progress') AND due_at < $13
        ORDER BY due_at LIMIT $14) d) AS due,
    CASE WHEN $16 THEN memory_blocks_json(u.account_id) END AS memory,  -- the account's core memory (sql/006, 020)
    -- message rates: the speaker's messages before this one in their current one-minute window (sql/018), and the
    -- turns started in this chat in the last minute (one chat's turns run one at a time); scheduled jobs aside
    greatest(u.rate_count - 1, 0) AS user_recent,
    (SELECT count(*) FROM turns r WHERE r.chat_id = c.id AND r.started_at > now() - interval '1 minute'
        AND r.id IS DISTINCT FROM (SELECT id FROM t)
        AND coalesce(r.platform_message_id, '') NOT LIKE $20) AS chat_recent,
    -- the budget check of the turn's first model call, and its admission (sql/022; NULL: no budget applies)
    CASE WHEN $21::timestamptz IS NOT NULL AND (SELECT id FROM t) IS NOT NULL
         THEN usage_admit(u.account_id, $21, $22::text, $23::bigint, $24::bigint, $25::bigint, $26::bigint,
                          $27::interval) END AS budget,
    -- $29: the update is stored in the inbox (committed to disk), so this commit need not wait for the disk itself
    -- (for this statement's transaction alone): lost in a server crash, the inbox hands the update out again and the
    -- turn starts over, as after any crash before its answer; its answer's commit flushes this one along
    set_config('synchronous_commit', CASE WHEN $29 THEN 'off' ELSE current_setting('synchronous_commit') END, true)
        AS commit_mode
FROM u LEFT JOIN accounts acc ON acc.id = u.account_id, c
"""
)

_NO_BUDGET = (None, None, None, None, None, None, None)  # $21-$27 of a start without the budget check

_ADD_ASSISTANT_ONCE_SQL = """
INSERT INTO messages (chat_id, turn_id, role, content, tool_calls) SELECT $1, $2, 'assistant', $3, $4
WHERE NOT EXISTS (SELECT 1 FROM messages WHERE turn_id = $2 AND role = 'assistant' AND tool_calls = $4::jsonb)
"""
_ADD_TOOL_SQL = """
INSERT INTO messages (chat_id, turn_id, role, content, tool_call_id, tool_name, tool_ok, duration_ms, quoted_kind)
VALUES ($1, $2, 'tool', $3, $4, $5, $6, $7, $8)
"""
_ADD_TOOL_ONCE_SQL = """
INSERT INTO messages (chat_id, turn_id, role, content, tool_call_id, tool_name, tool_ok, duration_ms, quoted_kind)
SELECT $1, $2, 'tool', $3, $4, $5, $6, $7, $8
WHERE NOT EXISTS (SELECT 1 FROM messages WHERE turn_id = $2 AND role = 'tool' AND tool_call_id = $4)
"""
# The answer, the turn closed, and (when $6 is not null) the usage of the turn's last model call (sql/022's
# usage_record, its arguments $6-$13), in one round trip.
_FINISH_SQL = """
WITH m AS (INSERT INTO messages (chat_id, turn_id, role, content) VALUES ($1, $2, 'assistant', $3)),
t AS (UPDATE turns SET status = $4, steps = $5, finished_at = now() WHERE id = $2)
SELECT usage_record($6, $7, $8, $9, $10, $11, $12, $13) WHERE $6::bigint IS NOT NULL
"""
# A retry after a dropped connection: the answer and the usage only when an earlier attempt did not commit them (the
# subqueries see the turn as it was before this statement).
_FINISH_ONCE_SQL = """
WITH m AS (
    INSERT INTO messages (chat_id, turn_id, role, content) SELECT $1, $2, 'assistant', $3
    WHERE EXISTS (SELECT 1 FROM turns WHERE id = $2 AND status = 'running')
), t AS (UPDATE turns SET status = $4, steps = $5, finished_at = now() WHERE id = $2)
SELECT usage_record($6, $7, $8, $9, $10, $11, $12, $13)
WHERE $6::bigint IS NOT NULL AND EXISTS (SELECT 1 FROM turns WHERE id = $2 AND status = 'running')
"""
_NO_USAGE = (None, None, None, None, None, None, None, None)  # $6-$13 of an answer without a usage to write


def _upserted(inc: Incoming) -> tuple[str, str, str, str, str, str, str]:
    """$1-$7 of _UPSERT_TEMPLATE: the speaking user and the chat (its platform is passed apart: $8 or $28)."""
    return inc.platform, inc.user_id, inc.user_name, inc.chat_id, inc.thread_id, inc.chat_kind, inc.chat_title


def _refs(row: Record, inc: Incoming, default_tz: str) -> tuple[UserRef, ChatRef]:
    """The user and chat references from an upsert's row."""
    user = UserRef(
        row["account_id"],
        row["user_id"],
        inc.platform,
        inc.user_id,
        inc.user_name,
        row["timezone"] or valid_zone(inc.zone) or default_tz,  # the platform's zone until one is set
        row["model"],
    )
    chat = ChatRef(row["chat_id"], inc.chat_platform, inc.chat_id, inc.thread_id, inc.chat_kind, row["history_floor"])
    return user, chat


@dataclass(frozen=True)
class TurnStart:
    """A stored message's turn with what its prompt needs: replay rows (oldest first, ending with the
    message itself), the speaker's open tasks due soon and, in a personal turn, their core memory block rows
    (`[{"name", "lines"}]`, else None); `turn_id` is None for a message seen before."""

    user: UserRef
    chat: ChatRef
    turn_id: int | None
    history: list[dict[str, Any]]
    due: list[dict[str, Any]]
    memory: list[dict[str, Any]] | None = None
    user_recent: int = 0  # turns the speaker started in the minute before this one (scheduled jobs aside)
    chat_recent: int = 0  # turns started in this chat in that minute
    budget: Any = None  # usage_admit's verdict on its first model call (core/accounts/usage.py); None: no budget


async def begin_turn(
    pool: Pool,
    inc: Incoming,
    default_tz: str,
    history: int,
    due_before: datetime,
    due_limit: int,
    *,
    authors: bool = False,
    memory: bool = False,
    redelivered: bool = False,
    budget: Sequence[Any] | None = None,
    inboxed: bool = False,
) -> TurnStart:
    """Identify, store the message, open its turn and load its context, in one round trip before the LLM.

    With `authors`, each history row carries `author_id` (the platform id of the user whose turn it is) and
    `platform_message_id`; without, both are null. With `memory`, the speaker's core memory blocks come along
    (only for turns where personal memory applies: never in groups). Retried on a dropped connection; a retry takes back
    the turn an earlier attempt may have committed (same platform message id, still running, unanswered). A
    redelivered message (its first handler died) takes its turn back and starts it over unless an answer was stored.
    With `budget` (usage_admit's arguments after the account, core/accounts/usage.py), a fresh turn's first model call
    is checked against the budgets and admitted in the same round trip. `inboxed`: the message's update is stored in
    the inbox, which keeps it through a server crash, so this commit does not wait for the disk.
    """

    kinds, origins, texts = [q.kind for q in inc.quoted], [q.origin for q in inc.quoted], [q.text for q in inc.quoted]

    def attempt(retry: bool) -> Awaitable[Record | None]:
        mode = 2 if redelivered else 1 if retry else 0  # $11: see _BEGIN_SQL
        return pool.fetchrow(
            _BEGIN_WITH_CONTEXT_SQL,
            *_upserted(inc),
            inc.message_id,
            inc.text,
            True,
            mode,
            max(0, history - 1 - len(inc.quoted)),
            due_before,
            due_limit,
            authors,
            memory,
            kinds,
            origins,
            texts,
            f"{JOB_MESSAGE_PREFIX}%",
            *(budget or _NO_BUDGET),
            inc.chat_platform,
            inboxed,
        )

    row = await retry_dropped(lambda: attempt(False), "storing a message", pool=pool, again=lambda: attempt(True))
    assert row is not None
    user, chat = _refs(row, inc, default_tz)
    await _adopt_zone(pool, row, inc)
    mid, author = (inc.message_id, inc.user_id) if authors else (None, None)
    new_rows = [*zip(kinds, origins, texts, strict=True), (None, None, inc.text)]
    own = [_new_row(text, inc.user_name, kind, origin, mid, author) for kind, origin, text in new_rows if text]
    due = [dict(d, due_at=datetime.fromisoformat(d["due_at"])) for d in row["due"]]
    return TurnStart(
        user,
        chat,
        row["turn_id"],
        [*row["history"], *own],
        due,
        row["memory"],
        row["user_recent"],
        row["chat_recent"],
        row["budget"],
    )


def _new_row(
    text: str, name: str, kind: str | None, origin: str | None, mid: str | None, author: str | None
) -> dict[str, Any]:
    """A message stored by this turn's start, as a history row (the history query cannot see it yet)."""
    return {
        "id": None,
        "role": "user",
        "content": text,
        "author_name": name,
        "tool_calls": None,
        "tool_call_id": None,
        "quoted_kind": kind,
        "quoted_origin": origin,
        "platform_message_id": mid,
        "author_id": author,
    }


async def recent_messages(pool: Pool, identity_id: int) -> int:
    """The messages an identity sent in its current one-minute window (sql/018; what the per-person rate counts)."""
    n = await pool.fetchval(
        "SELECT CASE WHEN rate_window_start > now() - interval '1 minute' THEN rate_count ELSE 0 END"
        " FROM users WHERE id = $1",
        identity_id,
    )
    return int(n or 0)


async def identify(pool: Pool, inc: Incoming, default_tz: str) -> tuple[UserRef, ChatRef]:
    """Upsert the speaking user and the chat and return their references (no turn is opened)."""
    args = (*_upserted(inc), inc.chat_platform)
    row = await retry_dropped(
        lambda: pool.fetchrow(_IDENTIFY_SQL, *args),
        "identifying a user",
        pool=pool,
    )
    assert row is not None
    await _adopt_zone(pool, row, inc)
    return _refs(row, inc, default_tz)


async def _adopt_zone(pool: Pool, row: Record, inc: Incoming) -> None:
    """A person who never set a time zone takes the real one their platform tells (Slack's profile), once: theirs
    from then on, as if set with /timezone (reminders and budgets use it too)."""
    if row["timezone"] is None and (name := valid_zone(inc.zone)) is not None:
        sql = "UPDATE accounts SET timezone = $2 WHERE id = $1 AND timezone IS NULL"
        await pool.execute(sql, row["account_id"], name)


async def add_assistant(
    pool: Pool, chat: ChatRef, turn_id: int, content: str | None, tool_calls: list[dict[str, Any]] | None
) -> None:
    """Store an assistant message (text and/or tool calls); a retry does not store it twice."""
    sql = "INSERT INTO messages (chat_id, turn_id, role, content, tool_calls) VALUES ($1, $2, 'assistant', $3, $4)"
    await retry_dropped(
        lambda: pool.execute(sql, chat.id, turn_id, content, tool_calls),
        "storing the model's tool calls",
        pool=pool,
        again=lambda: pool.execute(_ADD_ASSISTANT_ONCE_SQL, chat.id, turn_id, content, tool_calls),
    )


async def add_tool_result(
    pool: Pool,
    chat: ChatRef,
    turn_id: int,
    call_id: str,
    name: str,
    envelope: dict[str, Any],
    duration_ms: int,
    *,
    foreign: bool = False,
) -> None:
    """Store a tool result in full (the prompt gets a truncated copy); a retry does not store it twice. `foreign`: it
    carries someone else's text (a job written in a group), so a turn that replays it holds others' words."""
    args = (
        chat.id,
        turn_id,
        json.dumps(envelope, ensure_ascii=False, default=str),
        call_id,
        name,
        bool(envelope.get("ok")),
        duration_ms,
        "job" if foreign else None,
    )
    await retry_dropped(
        lambda: pool.execute(_ADD_TOOL_SQL, *args),
        "storing a tool result",
        pool=pool,
        again=lambda: pool.execute(_ADD_TOOL_ONCE_SQL, *args),
    )


async def finish_turn(pool: Pool, turn_id: int, status: str, steps: int, *, error: Error | None = None) -> None:
    """Record how the turn ended; `error`: the error answer the user gets, stored as the turn's answer (a redelivered
    update sends it again instead of asking the model; it is not a message, so never replayed to the model)."""
    sql = (
        "UPDATE turns SET status = $2, steps = $3, finished_at = now(), error_code = $4, error_message = $5"
        " WHERE id = $1"
    )
    code, message = (error.code, error.message) if error is not None else (None, None)
    await retry_dropped(lambda: pool.execute(sql, turn_id, status, steps, code, message), "closing a turn", pool=pool)


async def finish_turn_with_answer(
    pool: Pool,
    chat: ChatRef,
    turn_id: int,
    text: str,
    status: str,
    steps: int,
    usage: Sequence[Any] | None = None,
) -> None:
    """Store the final answer and close the turn in one round trip, with `usage` (usage_record's arguments,
    core/accounts/usage.py) the usage of its last model call too; a retry stores neither twice."""
    args = (chat.id, turn_id, text, status, steps, *(usage or _NO_USAGE))
    await retry_dropped(
        lambda: pool.execute(_FINISH_SQL, *args),
        "storing the answer",
        pool=pool,
        again=lambda: pool.execute(_FINISH_ONCE_SQL, *args),
    )


_STORED_ANSWER_SQL = """
SELECT t.id, coalesce(m.content, t.error_message) AS content, CASE WHEN m.id IS NULL THEN t.error_code END AS code,
       t.sent_parts
FROM chats c
JOIN turns t ON t.chat_id = c.id AND t.platform_message_id = $4
LEFT JOIN LATERAL (
    SELECT x.id, x.content FROM messages x WHERE x.turn_id = t.id AND x.role = 'assistant' AND x.tool_calls IS NULL
    ORDER BY x.id DESC LIMIT 1) m ON true
WHERE c.platform = $1 AND c.platform_chat_id = $2 AND c.thread_id = $3
    AND (m.id IS NOT NULL OR t.error_message IS NOT NULL)
"""


@dataclass(frozen=True)
class StoredAnswer:
    """A final answer stored for a platform message, and how many of its parts the platform already has; with
    `error_code`, an error answer (`text` is its message)."""

    turn_id: int
    text: str
    sent_parts: int
    error_code: str | None = None


async def stored_answer(pool: Pool, inc: Incoming) -> StoredAnswer | None:
    """The final answer stored for this platform message, if its turn got that far (retried on a dropped connection,
    like the turn's start before it)."""
    row = await retry_dropped(
        lambda: pool.fetchrow(_STORED_ANSWER_SQL, inc.platform, inc.chat_id, inc.thread_id, inc.message_id),
        "loading a stored answer",
        pool=pool,
    )
    return None if row is None else StoredAnswer(row["id"], row["content"] or "", row["sent_parts"], row["code"])


async def mark_sent(pool: Pool, turn_id: int, parts: int) -> None:
    """Record that the platform accepted the first `parts` parts of the turn's answer."""
    sql = "UPDATE turns SET sent_parts = greatest(sent_parts, $2) WHERE id = $1"
    await retry_dropped(lambda: pool.execute(sql, turn_id, parts), "recording a sent answer", pool=pool)


async def close_abandoned_turns(pool: Pool, older_than: timedelta) -> int:
    """Close turns left `running` by a dead process (started longer ago than `older_than`) as cut short."""
    status = await pool.execute(
        "UPDATE turns SET status = 'cut_short', finished_at = now()"
        " WHERE status = 'running' AND started_at < now() - $1::interval",
        older_than,
    )
    return affected(status)


async def reset_conversation(pool: Pool, chat: ChatRef) -> None:
    """Stop replaying the chat's earlier messages (they stay stored)."""
    await pool.execute(
        "UPDATE chats SET history_floor = COALESCE((SELECT max(id) FROM messages WHERE chat_id = $1), 0) WHERE id = $1",
        chat.id,
    )


async def set_timezone(pool: Pool, user: UserRef, tz_name: str) -> None:
    """Store the person's IANA time zone (their account's: every linked identity shares it)."""
    await pool.execute("UPDATE accounts SET timezone = $2 WHERE id = $1", user.account_id, tz_name)


async def set_model(pool: Pool, user: UserRef, name: str | None) -> None:
    """Store the person's model choice (their account's; None: the default)."""
    await pool.execute("UPDATE accounts SET model = $2 WHERE id = $1", user.account_id, name)


_STEPS_SQL = """
SELECT c.platform, c.platform_chat_id, c.thread_id, u.platform_user_id,
       extract(epoch FROM coalesce(t.finished_at, t.started_at) - t.started_at)::float8 AS elapsed,
       (SELECT coalesce(json_agg(m ORDER BY m.id), '[]') FROM (
           SELECT id, role, tool_calls, tool_call_id, tool_name, content, duration_ms FROM messages
           WHERE turn_id = t.id AND (role = 'tool' OR tool_calls IS NOT NULL)) m) AS rows,
       -- what the turn's voice notes were heard as (sql/028), shown before its tool calls
       (SELECT coalesce(json_agg(a.pages[1] ORDER BY a.id), '[]') FROM attachments a
        WHERE a.turn_id = t.id AND a.kind IN ('voice', 'audio') AND a.pages IS NOT NULL) AS heard
FROM turns t JOIN chats c ON c.id = t.chat_id LEFT JOIN users u ON u.id = t.user_id
WHERE t.id = $1
"""


async def turn_steps(pool: Pool, turn_id: int) -> TurnSteps | None:
    """The tool calls of a stored turn and their outcomes (None when the turn no longer exists)."""
    row = await pool.fetchrow(_STEPS_SQL, turn_id)
    if row is None:
        return None
    calls: dict[str, tuple[str, str]] = {}
    steps: list[Step] = [heard_step(text) for text in row["heard"]]
    for m in row["rows"]:
        if m["role"] == "assistant":
            for call in m["tool_calls"] or []:
                fn = call.get("function") or {}
                calls[call.get("id", "")] = (fn.get("name", "?"), fn.get("arguments") or "")
            continue
        name, raw_args = calls.get(m["tool_call_id"] or "", (m["tool_name"] or "?", ""))
        try:
            envelope = json.loads(m["content"] or "{}")
        except json.JSONDecodeError:
            envelope = {"ok": False, "error": {"code": "tool_error"}}
        steps.append(make_step(m["tool_name"] or name, raw_args, envelope, (m["duration_ms"] or 0) / 1000))
    return TurnSteps(
        turn_id,
        row["platform"],
        row["platform_user_id"] or "",
        row["platform_chat_id"],
        row["thread_id"],
        tuple(steps),
        row["elapsed"] or 0.0,
    )
