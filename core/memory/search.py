"""Archival memory and conversation search: full-text (`simple`) and trigram ranked together, paged by five."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import asyncpg

from core.constants import (
    MEMORY_ENTRY_SHOW_CHARS,
    MEMORY_PAGE_SIZE,
    MEMORY_SEARCH_MAX_PAGE,
    MEMORY_TYPO_LENGTH_SLACK,
    MEMORY_TYPO_MIN_CHARS,
    MEMORY_TYPO_QUERY_WORDS,
    MEMORY_TYPO_SIMILARITY,
    MEMORY_TYPO_WORDS,
    MEMORY_VECTOR_CANDIDATES,
    MEMORY_VECTOR_MIN_SIMILARITY,
)
from core.memory.embeddings import Embedder, embed_query, store_embedding
from core.quoting import one_line, truncate
from core.settings import Settings
from core.storage.db import Pool
from core.tools.framework import ToolError

log = logging.getLogger(__name__)

DEFAULT_ARCHIVAL_MAX: int = Settings.model_fields["ARCHIVAL_MAX_ENTRIES"].default  # a person's entries at most

# The query's words (full-text `simple`: every language's words as they are). A word the user never used (a typo,
# a partial word) also matches as a prefix and through a few of their words with the same first letter and a
# similar length that are similar (pg_trgm). Any term matches (OR); ranking decides. Only the longest few unknown
# words are widened: a prefix is looked up among every user's words in the index, so a query of a hundred short
# made-up words took ~0.3 s over 300,000 messages.
_QUERY_CTES = f"""
qk AS (SELECT w, length(w) >= {MEMORY_TYPO_MIN_CHARS} AND NOT EXISTS (
           SELECT 1 FROM memory_search_words k WHERE k.user_id = $1 AND k.word = w) AS unknown
       FROM unnest(tsvector_to_array(to_tsvector('simple', $2))) w),
qw AS (SELECT w, unknown AND row_number() OVER (PARTITION BY unknown ORDER BY length(w) DESC, w)
                             <= {MEMORY_TYPO_QUERY_WORDS} AS unknown FROM qk),
terms AS (
    SELECT quote_literal(w) || CASE WHEN unknown THEN ':*' ELSE '' END AS term FROM qw
    UNION
    SELECT quote_literal(n.word) FROM qw, LATERAL (
        SELECT word FROM memory_search_words
        WHERE qw.unknown AND user_id = $1
          AND word >= left(qw.w, 1) AND word < chr(least(ascii(qw.w) + 1, 1114111))
          AND abs(length(word) - length(qw.w)) <= {MEMORY_TYPO_LENGTH_SLACK}
          AND similarity(word, qw.w) >= {MEMORY_TYPO_SIMILARITY}
        ORDER BY similarity(word, qw.w) DESC, word LIMIT {MEMORY_TYPO_WORDS}) n
),
q AS MATERIALIZED (SELECT to_tsquery('simple', (SELECT string_agg(term, ' | ') FROM terms)) AS tsq)"""

_ARCHIVAL_TEXT_HITS = """
    SELECT a.id, ts_rank(a.words, q.tsq) AS score
    FROM archival_memory a, q
    WHERE a.user_id = $1 AND a.words @@ q.tsq"""

_ARCHIVAL_VECTOR_HITS = f"""
    UNION ALL
    SELECT v.id, v.similarity FROM (
        SELECT id, 1 - (embedding <=> $4::text::vector) AS similarity FROM archival_memory
        WHERE user_id = $1 AND embedding_model = $5
        ORDER BY embedding <=> $4::text::vector LIMIT {MEMORY_VECTOR_CANDIDATES}) v
    WHERE v.similarity >= {MEMORY_VECTOR_MIN_SIMILARITY}"""

_ARCHIVAL_PAGE = """
WITH {q}, hits AS ({hits}
), ranked AS (SELECT id, sum(score) AS score FROM hits GROUP BY id)
SELECT a.id, a.content, a.created_at, count(*) OVER () AS total
FROM ranked r JOIN archival_memory a ON a.id = r.id
ORDER BY r.score DESC, a.created_at DESC, a.id DESC LIMIT {size} OFFSET $3
"""

_ARCHIVAL_TEXT_SQL = _ARCHIVAL_PAGE.format(q=_QUERY_CTES, hits=_ARCHIVAL_TEXT_HITS, size=MEMORY_PAGE_SIZE)
_ARCHIVAL_VECTOR_SQL = _ARCHIVAL_PAGE.format(
    q=_QUERY_CTES, hits=_ARCHIVAL_TEXT_HITS + _ARCHIVAL_VECTOR_HITS, size=MEMORY_PAGE_SIZE
)

# The chats the person (any identity of their account) spoke in: their private chats whole (their messages and the
# bot's answers), their own messages in groups. Scheduled agent jobs are turns of their owner in the private chat,
# so they count too.
# Newest first: "what did I say about X" means the latest mention (and ranking would re-parse every hit).
_CONVERSATION_PAGE = f"""
WITH {_QUERY_CTES}, hits AS (
    SELECT m.id, m.role, m.content, m.created_at, m.quoted_kind, m.quoted_origin
    FROM messages m JOIN chats c ON c.id = m.chat_id, q,
        (SELECT array_agg(u.id) AS ids FROM users u WHERE u.account_id = $1) ids  -- every identity of the account
    WHERE m.chat_id = ANY(ARRAY(SELECT DISTINCT t.chat_id FROM turns t WHERE t.user_id = ANY(ids.ids)))
      AND m.role IN ('user', 'assistant') AND m.content IS NOT NULL
      AND (c.kind = 'private' OR (m.role = 'user' AND m.user_id = ANY(ids.ids)))
      AND to_tsvector('simple', m.content) @@ q.tsq
)
SELECT id, role, content, created_at, quoted_kind, quoted_origin, count(*) OVER () AS total FROM hits
ORDER BY created_at DESC, id DESC LIMIT {MEMORY_PAGE_SIZE} OFFSET $3
"""

_INSERT_SQL = "SELECT id, number, fresh, entries FROM archival_insert($1, $2, $3, $4, $5)"  # sql/015


@dataclass(frozen=True)
class Inserted:
    """An archival insert's outcome: the entry's id, its number among the user's entries (#N), whether it is new."""

    id: int
    number: int
    fresh: bool


def archival_full(entries: int, max_entries: int) -> ToolError:
    """The refusal when the user's archival memory holds its most entries (the model relays it)."""
    return ToolError(
        f"archival memory is full: {entries} of {max_entries} entries, the most one person may keep; nothing was "
        "stored (/memory shows and erases it)"
    )


async def insert_archival(
    pool: Pool,
    user_id: int,
    content: str,
    now: datetime,
    embedder: Embedder | None = None,
    *,
    max_entries: int = DEFAULT_ARCHIVAL_MAX,
    call: uuid.UUID | None = None,
) -> Inserted:
    """Store an entry once per user (sha256 of its text) while they have fewer than `max_entries`; with an
    embedder, its vector too (best effort). `call` names this tool call: an insert that an earlier attempt of it
    committed counts as fresh (run it again after a dropped connection with the same `call`)."""
    text = content.strip()
    if not text:
        raise ToolError("content is empty", code="invalid_args")
    row = await pool.fetchrow(_INSERT_SQL, user_id, text, now, call or uuid.uuid4(), max_entries)
    assert row is not None
    if row["id"] is None:
        raise archival_full(int(row["entries"]), max_entries)
    if row["fresh"] and embedder is not None:
        await store_embedding(pool, embedder, row["id"], text)
    return Inserted(row["id"], row["number"], row["fresh"])


def _shown(text: str) -> str:
    """An entry for a result, on one line, cut with a marker when very long."""
    return truncate(" ".join(text.split()), MEMORY_ENTRY_SHOW_CHARS)


def page_offset(page: int) -> int:
    """Rows to skip for a 1-based page."""
    return (page - 1) * MEMORY_PAGE_SIZE


def format_page(
    title: str, query: str, page: int, rows: Sequence[asyncpg.Record], line: Callable[[asyncpg.Record], str]
) -> str:
    """`Title for "q" (Page 1 of 3, 12 total):`, numbered entries, and `(Use page=2 for more)` when there is more."""
    if not rows:
        return f'{title} for "{query}": no matches'
    total = int(rows[0]["total"])
    pages = -(-total // MEMORY_PAGE_SIZE)
    out = [f'{title} for "{query}" (Page {page} of {pages}, {total} total):']
    out += [f"[{page_offset(page) + i}] {line(r)}" for i, r in enumerate(rows, 1)]
    if page < pages:
        out.append(f"(Use page={page + 1} for more)")
    return "\n".join(out)


def _past_last_page(page: int, total: int) -> ToolError:
    """The error for a page after the last one."""
    pages = -(-total // MEMORY_PAGE_SIZE)
    return ToolError(f"page {page} is past the last page ({pages}) of {total} results", code="invalid_args")


def _day(ts: datetime, tz: ZoneInfo) -> str:
    """`2026-11-20` in the user's zone."""
    return ts.astimezone(tz).strftime("%Y-%m-%d")


async def search_archival(
    pool: Pool, user_id: int, query: str, page: int, tz: ZoneInfo, embedder: Embedder | None = None
) -> str:
    """One page of the user's archival entries that match `query`, best first, newest first on ties."""
    sql = _ARCHIVAL_TEXT_SQL
    args: list[object] = [user_id, query, page_offset(page)]
    vector = await embed_query(embedder, query) if embedder is not None else None
    rows: list[asyncpg.Record] | None = None
    if embedder is not None and vector is not None and page <= MEMORY_SEARCH_MAX_PAGE:
        with_vectors = _ARCHIVAL_VECTOR_SQL
        try:
            rows = await pool.fetch(with_vectors, *args, vector, embedder.model)
            sql, args = with_vectors, [*args, vector, embedder.model]
        except asyncpg.PostgresError as e:  # pgvector or the column went missing: text search still answers
            log.warning("archival search without embeddings: %s", type(e).__name__)
    if rows is None:
        rows = await pool.fetch(sql, *args) if page <= MEMORY_SEARCH_MAX_PAGE else []
    if not rows and page > 1:
        first = await pool.fetch(sql, *args[:2], 0, *args[3:])
        if first:
            raise _past_last_page(page, int(first[0]["total"]))
    return format_page(
        "Archival Memory Search", query, page, rows, lambda r: f"({_day(r['created_at'], tz)}) {_shown(r['content'])}"
    )


async def search_conversation(pool: Pool, user_id: int, query: str, page: int, tz: ZoneInfo) -> str:
    """One page of the user's earlier messages and the bot's replies to them that match `query`."""
    rows = (
        await pool.fetch(_CONVERSATION_PAGE, user_id, query, page_offset(page))
        if page <= MEMORY_SEARCH_MAX_PAGE
        else []
    )
    if not rows and page > 1:
        first = await pool.fetch(_CONVERSATION_PAGE, user_id, query, 0)
        if first:
            raise _past_last_page(page, int(first[0]["total"]))

    def line(r: asyncpg.Record) -> str:
        when = r["created_at"].astimezone(tz).strftime("%Y-%m-%d %H:%M")
        who = "user" if r["role"] == "user" else "assistant"
        if r["quoted_kind"]:  # someone else's words the user brought in: never shown as theirs
            origin = one_line(r["quoted_origin"] or "someone")
            who = f"someone else's text ({r['quoted_kind']} from {origin}; quoted data, not the user's words)"
        return f"({when}) {who}: {_shown(r['content'])}"

    return format_page("Conversation Search", query, page, rows, line)
