"""A person's own data: `/export` (everything the bot keeps about their account, as one JSON file) and `/forget_me`
(all of it deleted, every identity with it). Both cover the same rows, so what an export shows is what a forget
deletes: the account, its identities, tasks and their reminders' history, memory, token usage, and the stored
conversation: their private chats whole (the bot's answers and steps too) and, in groups, their own messages and
the turns they started (the bot's answers to them), never other members' messages. A forget also deletes what adapters
kept about them (platform_state rows they own: their Matrix direct room), which is no content of theirs to export."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.constants import EXPORT_PREFETCH
from core.storage.db import Conn, Pool
from core.texts import EXPORT_TOO_LARGE

EXPORT_FORMAT, EXPORT_VERSION = "assistant-bot-export", 1  # the file's top-level `format` and `version`

# The account's rows in the conversation tables, as CTEs on $1 (the account id). Their private chats are the private
# chats where one of their identities spoke (or whose chat id is the identity's own, as Telegram's are) and nobody
# else did; in every other chat, the turns they started with all of their messages, and their own messages.
_THEIRS = """
WITH ident AS (SELECT id, platform, platform_user_id FROM users WHERE account_id = $1),
spoke AS (SELECT t.id, t.chat_id FROM turns t WHERE t.user_id IN (SELECT id FROM ident)),
own_chats AS (
    SELECT c.id FROM chats c
    WHERE c.kind = 'private'
      AND c.id IN (SELECT chat_id FROM spoke
                   UNION SELECT x.id FROM chats x JOIN ident i
                         ON x.platform = i.platform AND x.platform_chat_id = i.platform_user_id
                   UNION SELECT x.id FROM chats x WHERE x.owner_id IN (SELECT id FROM ident))  -- API sessions
      AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.chat_id = c.id AND t.user_id NOT IN (SELECT id FROM ident))
),
own_turns AS (SELECT id FROM spoke WHERE chat_id NOT IN (SELECT id FROM own_chats)),
own_messages AS (
    SELECT m.id FROM messages m WHERE m.chat_id IN (SELECT id FROM own_chats)
    UNION SELECT m.id FROM messages m WHERE m.turn_id IN (SELECT id FROM own_turns)
    UNION SELECT m.id FROM messages m
          WHERE m.chat_id IN (SELECT chat_id FROM spoke) AND m.user_id IN (SELECT id FROM ident)
)"""

_SUMMARY_SQL = (
    _THEIRS
    + """
SELECT (SELECT coalesce(array_agg(platform || ':' || platform_user_id ORDER BY id), '{}') FROM ident) AS identities,
       (SELECT count(*) FROM own_messages) AS messages,
       (SELECT count(*) FROM tasks WHERE user_id = $1) AS tasks,
       (SELECT coalesce(sum(cardinality(lines)), 0) FROM memory_blocks WHERE user_id = $1) AS lines,
       (SELECT count(*) FROM archival_memory WHERE user_id = $1) AS archival
"""
)

# The export but for its chats' messages, as JSON text (`chats` is filled in by export_account, streamed).
_HEAD_SQL = """
SELECT json_build_object(
    'format', $2::text, 'version', $3::int, 'exported_at', now(),
    'account', (SELECT to_json(a) FROM accounts a WHERE a.id = $1),
    'identities', (SELECT coalesce(json_agg(json_build_object(
            'id', u.id, 'platform', u.platform, 'platform_user_id', u.platform_user_id,
            'display_name', u.display_name, 'created_at', u.created_at,
            'api_tokens', (SELECT coalesce(json_agg(json_build_object(  -- their names and times, never a hash
                    'name', k.name, 'created_at', k.created_at, 'last_used_at', k.last_used_at,
                    'revoked_at', k.revoked_at) ORDER BY k.id), '[]')
                FROM api_tokens k WHERE k.identity_id = u.id),
            'web_sign_ins', (SELECT coalesce(json_agg(json_build_object(  -- their times, never a hash or token
                    'created_at', w.created_at, 'expires_at', w.expires_at, 'signed_out_at', w.signed_out_at)
                    ORDER BY w.id), '[]')
                FROM web_signins w WHERE w.identity_id = u.id),
            'web_links', (SELECT coalesce(json_agg(json_build_object(
                    'created_at', l.created_at, 'expires_at', l.expires_at, 'used_at', l.used_at) ORDER BY l.id), '[]')
                FROM web_links l WHERE l.identity_id = u.id)) ORDER BY u.id), '[]')
        FROM users u WHERE u.account_id = $1),
    'tasks', (SELECT coalesce(json_agg(json_build_object(
            'id', t.id, 'title', t.title, 'details', t.details, 'kind', t.kind, 'agent_prompt', t.agent_prompt,
            'status', t.status, 'due_at', t.due_at, 'recurrence', t.recurrence, 'timezone', t.timezone,
            'created_at', t.created_at, 'updated_at', t.updated_at,
            'watch', (SELECT json_build_object('url', w.url, 'title', w.title, 'checked_at', w.checked_at,
                                               'failures', w.failures, 'last_error', w.last_error)
                      FROM watches w WHERE w.task_id = t.id),
            'created_by', (SELECT u.platform || ':' || u.platform_user_id FROM users u WHERE u.id = t.created_by),
            'chat', (SELECT json_build_object('platform', c.platform, 'chat_id', c.platform_chat_id,
                                              'thread_id', c.thread_id, 'kind', c.kind)
                     FROM chats c WHERE c.id = t.chat_id),
            'occurrences', (SELECT coalesce(json_agg(json_build_object(
                    'scheduled_at', o.scheduled_at, 'status', o.status, 'late', o.late, 'attempts', o.attempts,
                    'ran_at', o.ran_at, 'delivered_at', o.delivered_at, 'error', o.error, 'sent_text', o.sent_text)
                    ORDER BY o.scheduled_at), '[]')
                FROM occurrences o WHERE o.task_id = t.id)) ORDER BY t.id), '[]')
        FROM tasks t WHERE t.user_id = $1),
    'memory', json_build_object(
        'blocks', (SELECT coalesce(json_agg(json_build_object(
                'name', b.name, 'lines', b.lines, 'created_at', b.created_at, 'updated_at', b.updated_at)
                ORDER BY b.name <> 'human', b.name <> 'persona', b.created_at, b.name), '[]')
            FROM memory_blocks b WHERE b.user_id = $1),
        'archival', (SELECT coalesce(json_agg(json_build_object(
                'number', r.number, 'content', r.content, 'created_at', r.created_at) ORDER BY r.number), '[]')
            FROM archival_memory r WHERE r.user_id = $1)),
    'chats', '[]'::json,
    'usage', (SELECT coalesce(json_agg(json_build_object(  -- one row per day and model (a merge or a flush may split)
            'day', u.day, 'model', u.model, 'prompt_tokens', u.prompt_tokens, 'completion_tokens', u.completion_tokens,
            'cached_tokens', u.cached_tokens, 'calls', u.calls) ORDER BY u.day, u.model), '[]')
        FROM (SELECT day, model, sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
                     sum(cached_tokens) AS cached_tokens, sum(calls) AS calls
              FROM token_usage WHERE account_id = $1 GROUP BY day, model) u),
    'attachments', (SELECT coalesce(json_agg(json_build_object(  -- what was kept of files sent (sql/028)
            'id', a.id, 'kind', a.kind, 'name', a.name, 'mime', a.mime, 'size_bytes', a.size_bytes,
            'created_at', a.created_at, 'pages', a.pages,
            'image_base64', CASE WHEN a.data IS NOT NULL THEN encode(a.data, 'base64') END) ORDER BY a.id), '[]')
        FROM attachments a WHERE a.account_id = $1),
    'mcp_accounts', (SELECT coalesce(json_agg(json_build_object(  -- tool servers connected (sql/033): never a token
            'server', m.server, 'connected_at', m.connected_at, 'updated_at', m.updated_at) ORDER BY m.server), '[]')
        FROM mcp_credentials m WHERE m.account_id = $1 AND m.tokens IS NOT NULL)
)::text
"""

# The export's chats, one row per message (its chat's fields alongside), chat by chat in order: read through a cursor
# and written out as they come, so the export's memory does not grow with the account's conversation.
_MESSAGES_SQL = (
    _THEIRS
    + """
SELECT c.id AS chat, c.platform, c.platform_chat_id AS chat_id, c.thread_id, c.kind, c.title,
       json_strip_nulls(json_build_object(
           'id', m.id, 'created_at', m.created_at, 'role', m.role,
           'identity', (SELECT u.platform || ':' || u.platform_user_id FROM users u WHERE u.id = m.user_id),
           'author_name', nullif(m.author_name, ''), 'content', m.content,
           'quoted_kind', m.quoted_kind, 'quoted_origin', m.quoted_origin, 'tool_calls', m.tool_calls,
           'tool_call_id', m.tool_call_id, 'tool_name', m.tool_name, 'tool_ok', m.tool_ok))::text AS message
FROM messages m JOIN chats c ON c.id = m.chat_id
WHERE m.id IN (SELECT id FROM own_messages)
ORDER BY c.id, m.id
"""
)

# The private chat a forget was confirmed in, when nobody ever wrote there (else it is in `own_chats`, or not theirs).
_SILENT_CHAT_SQL = """
DELETE FROM chats c WHERE c.platform = $1 AND c.platform_chat_id = $2 AND c.kind = 'private'
  AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.chat_id = c.id)
"""

# Everything of the account in the conversation tables, found before anything is deleted.
_FIND_SQL = (
    _THEIRS
    + """
SELECT array(SELECT id FROM own_chats) AS chats, array(SELECT id FROM own_turns) AS turns,
       array(SELECT id FROM own_messages) AS messages,
       array(SELECT c.platform || ':' || c.platform_chat_id || ':' || c.thread_id FROM chats c
             WHERE c.id IN (SELECT id FROM own_chats)
             UNION SELECT platform || ':' || platform_user_id || ':' FROM ident) AS chat_keys,
       array(SELECT platform FROM ident ORDER BY id) AS platforms,
       array(SELECT platform_user_id FROM ident ORDER BY id) AS platform_ids
"""
)

# Handled (or being handled: the press of the confirmation itself) inbox updates that carry one of the identities keep
# their row, so a redelivery is still recognised and answered once, but lose their payload (the platform's update:
# the message's text, the person's name and ids) and their chat key (a private chat's holds the person's id; a
# handled update needs none, and the one being handled is the last of the forget). A person appears in a stored
# update as an `id` (Telegram's `from`, `chat`, a replied-to message's author) or a `user_id` (the Discord adapter's
# stored Incoming). Updates still waiting are new messages sent after the forget: handled as usual, afresh.
_SCRUB_INBOX_SQL = """
UPDATE inbox i SET payload = '{}'::jsonb, chat_key = 'forgotten:' || i.update_id
FROM unnest($1::text[], $2::jsonb[]) AS who(platform, vars)
WHERE split_part(i.platform, ':', 1) = who.platform
  AND (i.done_at IS NOT NULL OR i.owner IS NOT NULL) AND i.payload <> '{}'::jsonb
  AND (jsonb_path_exists(i.payload, '$.**.id ? (@ == $s || @ == $n)', who.vars)
       OR jsonb_path_exists(i.payload, '$.**.user_id ? (@ == $s || @ == $n)', who.vars))
"""

_LOCK_TRIES_SQL = """
SELECT 1 FROM link_tries WHERE user_id IN (SELECT id FROM users WHERE account_id = $1) ORDER BY user_id FOR UPDATE
"""


@dataclass(frozen=True)
class FileAnswer:
    """A command's answer that is a file (/export): `text` (Markdown) goes with it; it is always the person's own,
    so front ends send it privately (a group only sees a note)."""

    text: str
    filename: str
    data: bytes


@dataclass(frozen=True)
class Summary:
    """How much an account holds: its identities (`platform:id`), stored messages, tasks, memory lines, notes."""

    identities: tuple[str, ...]
    messages: int
    tasks: int
    lines: int
    archival: int


async def summary(pool: Pool | Conn, account_id: int) -> Summary:
    """What /export sends and /forget_me deletes, counted."""
    row = await pool.fetchrow(_SUMMARY_SQL, account_id)
    assert row is not None
    return Summary(
        tuple(row["identities"]), int(row["messages"]), int(row["tasks"]), int(row["lines"]), int(row["archival"])
    )


async def export_account(pool: Pool, account_id: int, now: datetime) -> tuple[str, bytes]:
    """The account's data as a JSON file: its name and its bytes (UTF-8, indented; a message per line). Written as it
    is read, in one snapshot: the small parts as one object, the messages through a cursor, EXPORT_PREFETCH at a time,
    so the memory it takes is the file's size whatever the conversation holds."""
    out = io.BytesIO()
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        head: dict[str, Any] = json.loads(await conn.fetchval(_HEAD_SQL, account_id, EXPORT_FORMAT, EXPORT_VERSION))
        out.write(b"{")
        for n, (key, value) in enumerate(head.items()):
            out.write(b"\n " + _dump(key) + b": ")
            if key == "chats":
                await _write_chats(conn, account_id, out)
            else:
                out.write(_dump(value, depth=1))
            if n < len(head) - 1:
                out.write(b",")
        out.write(b"\n}\n")
    return f"export-{now:%Y-%m-%d-%H%M%S}.json", out.getvalue()


def _dump(value: Any, *, depth: int = 0) -> bytes:
    """JSON of a value, indented one space a level, as it reads at `depth` levels in."""
    text = json.dumps(value, ensure_ascii=False, indent=1)
    return text.replace("\n", "\n" + " " * depth).encode()  # JSON strings hold no raw newline


async def _write_chats(conn: Conn, account_id: int, out: io.BytesIO) -> None:
    """The `chats` list: each chat's fields and its messages, one message a line, as the cursor reads them."""
    chat: int | None = None
    out.write(b"[")
    async for row in conn.cursor(_MESSAGES_SQL, account_id, prefetch=EXPORT_PREFETCH):
        if row["chat"] != chat:
            fields = {k: row[k] for k in ("platform", "chat_id", "thread_id", "kind", "title")}
            out.write(
                (b"\n  ]}," if chat is not None else b"")
                + b"\n  "
                + json.dumps(fields, ensure_ascii=False).encode()[:-1]
                + b', "messages": ['
            )
            out.write(b"\n   " + row["message"].encode())
            chat = row["chat"]
        else:
            out.write(b",\n   " + row["message"].encode())
    out.write(b"\n  ]}\n ]" if chat is not None else b"]")


async def forget_account(
    pool: Pool, platform: str, platform_user_id: str, private_chat: str | None = None
) -> Summary | None:
    """Delete the account of this identity and everything in it (see the module's docstring), every identity of it
    too, in one transaction; returns what was deleted (None: nothing is stored for the identity). `private_chat`: the
    private chat the forget was confirmed in, deleted too when nobody wrote there (a Discord DM used only for slash
    commands, whose chat id is not the person's)."""
    async with pool.acquire() as conn, conn.transaction():
        account_id = await _lock_account(conn, platform, platform_user_id)
        if account_id is None:
            return None
        gone = await summary(conn, account_id)
        found = await conn.fetchrow(_FIND_SQL, account_id)
        assert found is not None
        await conn.execute("DELETE FROM messages WHERE id = ANY($1::bigint[])", found["messages"])
        await conn.execute("DELETE FROM turns WHERE id = ANY($1::bigint[])", found["turns"])
        await conn.execute("DELETE FROM chats WHERE id = ANY($1::bigint[])", found["chats"])  # their private chats
        await conn.execute(_SILENT_CHAT_SQL, platform, private_chat)
        await conn.execute("DELETE FROM refusal_notices WHERE chat_key = ANY($1::text[])", found["chat_keys"])
        await conn.execute(_SCRUB_INBOX_SQL, found["platforms"], [_id_vars(i) for i in found["platform_ids"]])
        identities = [f"{p}:{i}" for p, i in zip(found["platforms"], found["platform_ids"], strict=True)]
        await conn.execute("DELETE FROM platform_state WHERE owner = ANY($1::text[])", identities)  # sql/039
        # the account goes with what it owns (ON DELETE CASCADE): its identities, tasks and their occurrences,
        # memory blocks, archival notes, search words, and whatever later tables hang on the account
        await conn.execute("DELETE FROM users WHERE account_id = $1", account_id)
        await conn.execute("DELETE FROM accounts WHERE id = $1", account_id)
    return gone


async def _lock_account(conn: Conn, platform: str, platform_user_id: str) -> int | None:
    """The identity's account, locked for this transaction (a link moving the identity meanwhile is waited for): in
    the order linking takes them (core/accounts/linking.py), the identities' wrong-code rows, the identities, then the
    account, so a link and a forget of the same person wait for each other and never deadlock."""
    for _ in range(3):
        account_id: int | None = await conn.fetchval(
            "SELECT account_id FROM users WHERE platform = $1 AND platform_user_id = $2", platform, platform_user_id
        )
        if account_id is None:
            return None
        await conn.execute(_LOCK_TRIES_SQL, account_id)
        await conn.execute("SELECT 1 FROM users WHERE account_id = $1 ORDER BY id FOR UPDATE", account_id)
        await conn.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
        again = await conn.fetchval(
            "SELECT account_id FROM users WHERE platform = $1 AND platform_user_id = $2", platform, platform_user_id
        )
        if again == account_id:
            return account_id
    raise RuntimeError("the identity kept moving between accounts")


def _id_vars(platform_user_id: str) -> dict[str, Any]:
    """The jsonpath variables that match an identity's id in a stored update: as text, and as a number if it is one."""
    number: Any = int(platform_user_id) if platform_user_id.isdecimal() else platform_user_id
    return {"s": platform_user_id, "n": number}


def file_too_large(size: int, limit: int) -> str:
    """The one line a person gets when their export is larger than the platform lets a bot send."""
    return EXPORT_TOO_LARGE.format(size=f"{size / 1e6:.1f} MB", limit=f"{limit / 1e6:.1f} MB")
