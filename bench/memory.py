"""Memory at scale: archival search and insert among 1,000,000 entries, conversation search over 1,000,000 messages.

Run with `uv run python -m bench.memory` (or `uv run python bench/memory.py`). PostgreSQL: DATABASE_URL (a scratch
database on it) or an embedded server in a temp dir, as in bench.turn_overhead. Filling takes a few minutes; it
drops and rebuilds the search indexes and pauses the learn-words trigger, so never point it at a live bot's database.

Data (generated in SQL with generate_series, no Python loop): 1,000 users; a vocabulary of 30,000 made-up words
(three syllables each) where 200 "common" words take 30 % of the picks and the rest are uniform. Archival memory:
1,000,000 entries of 6-17 words, 100,000 of them the measured user's. Conversations: 500,000 turns, each a user
message and the bot's answer (1,000,000 messages); the measured user has 5,000 turns in a private chat and 500
in a group of 24,500 turns by others; the other users talk in their own private chats. Indexes are built after
the fill (as a restore would), then ANALYZE.

Measured through the real tools (ToolRegistry.run with the user's ToolContext, as the agent loop calls them):
archival_memory_search over a mix of queries (a rare word, a common word, two words, a typo, a three-word
phrase, a page 2), archival_memory_insert of new entries, and conversation_search over the same mix.
Goals: search p50 ≤ 10 ms and p99 ≤ 40 ms, insert p50 ≤ 3 ms, conversation search p50 ≤ 20 ms.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg

from bench.common import bench_database, percentile, quiet_logging, server_info, verdict
from core.memory.blocks import render_prompt_section
from core.memory.tools import memory_tools
from core.storage.db import Pool, create_pool
from core.timeutil import system_clock
from core.tools.framework import ToolContext, ToolRegistry
from core.types import ChatRef, UserRef

GOAL_SEARCH_P50_MS, GOAL_SEARCH_P99_MS = 10.0, 40.0
GOAL_INSERT_P50_MS = 3.0
GOAL_CONVERSATION_P50_MS = 20.0

SYLLABLES = (
    "ka lo mi ten ros bel dan fi gu har in jo ke lun mar ne or pa qui ri sa tor u vel wi xan yo zi "
    "bra cle dro fen gli hov ist jul kor lem"
).split()

_USERS_SQL = """
INSERT INTO users (platform, platform_user_id, display_name)
SELECT 'telegram', $2 || g, 'user ' || g FROM generate_series(0, $1 - 1) g
"""
_CHATS_SQL = """
INSERT INTO chats (platform, platform_chat_id, kind, title)
SELECT 'telegram', $2 || g, 'private', '' FROM generate_series(0, $1 - 1) g
UNION ALL SELECT 'telegram', $2 || 'group', 'group', 'bench group'
"""
# n → user id and private chat id; n = -1 is the group chat.
_MAP_SQL = """
CREATE TEMP TABLE bench_map (n int PRIMARY KEY, user_id bigint, chat_id bigint);
INSERT INTO bench_map
SELECT coalesce(substr(u.platform_user_id, length($1) + 1)::int, -1), u.id, c.id
FROM chats c LEFT JOIN users u ON u.platform = 'telegram' AND u.platform_user_id = c.platform_chat_id
WHERE c.platform = 'telegram' AND c.platform_chat_id LIKE $1 || '%';
ANALYZE bench_map;
"""
# Words: i < 200 are the common ones (30 % of picks); word i is spelled from syllables of i's digits in base 40.
_WORDS = """array_to_string(ARRAY(
    SELECT $S[1 + x.i % 40] || $S[1 + (x.i / 40) % 40] || $S[1 + (x.i / 1600) % 40]
    FROM (SELECT (CASE WHEN random() < 0.3 THEN floor(random() * 200) ELSE 200 + floor(random() * 29800) END)::int
          AS i FROM generate_series(1, {count})) x), ' ')"""
_ARCHIVAL_SQL = (
    """
INSERT INTO archival_memory (user_id, content, sha256, created_at)
SELECT m.user_id, c.content, sha256(convert_to(c.content, 'UTF8')), now() - g * interval '37 seconds'
FROM generate_series(1, $1) g
JOIN bench_map m ON m.n = CASE WHEN g <= $2 THEN 0 ELSE 1 + g % ($3 - 1) END
CROSS JOIN LATERAL (SELECT """
    + _WORDS.format(count="6 + (g * 7) % 12")
    + """ || ' ' || g AS content) c
ON CONFLICT DO NOTHING
"""
).replace("$S", "($4::text[])")
# turn g: 1..5000 user 0 in private, 5001..5500 user 0 in the group, ..30000 others in the group, rest private.
_TURNS_SQL = """
INSERT INTO turns (chat_id, user_id, platform_message_id, status, started_at, finished_at)
SELECT coalesce(grp.chat_id, m.chat_id), m.user_id, $3 || g, 'done', now() - g * interval '11 seconds',
       now() - g * interval '11 seconds'
FROM generate_series(1, $1) g
JOIN bench_map m ON m.n = CASE WHEN g <= 5500 THEN 0 ELSE 1 + g % ($2 - 1) END
LEFT JOIN bench_map grp ON grp.n = -1 AND g BETWEEN 5001 AND 30000
"""
_MESSAGES_SQL = (
    """
INSERT INTO messages (chat_id, turn_id, user_id, role, content, created_at)
SELECT t.chat_id, t.id, CASE WHEN r.role = 'user' THEN t.user_id END, r.role, c.content,
       t.started_at + (r.role = 'assistant')::int * interval '2 seconds'
FROM turns t
JOIN bench_map b ON b.chat_id = t.chat_id AND (b.n = -1 OR b.user_id = t.user_id)
CROSS JOIN (VALUES ('user'), ('assistant')) r(role)
CROSS JOIN LATERAL (SELECT """
    + _WORDS.format(count="4 + (t.id * 5) % 20 + (r.role = 'assistant')::int * 10")
    + """ AS content) c
"""
).replace("$S", "($1::text[])")
_LEARN_SQL = """
INSERT INTO memory_search_words (user_id, word)
SELECT DISTINCT user_id, w FROM (
    SELECT user_id, unnest(tsvector_to_array(words)) AS w FROM archival_memory
    UNION ALL
    SELECT user_id, unnest(tsvector_to_array(to_tsvector('simple', content))) FROM messages
    WHERE role = 'user' AND content IS NOT NULL
) x WHERE length(w) BETWEEN 3 AND 32 AND w ~ '[[:alpha:]]'
ON CONFLICT DO NOTHING
"""
_INDEXES = ("archival_memory_words", "messages_search_words")


async def _index_definitions(conn: asyncpg.Connection) -> dict[str, str]:
    """The search indexes' CREATE statements (to drop them for the fill and build them afterwards)."""
    rows = await conn.fetch("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY($1::text[])", _INDEXES)
    return {r["indexname"]: r["indexdef"] for r in rows}


async def fill(dsn: str, tag: str, users: int, entries: int, own_entries: int, turns: int) -> dict[str, float]:
    """Fill the database; seconds per phase."""
    timings: dict[str, float] = {}
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET maintenance_work_mem = '512MB'; SET synchronous_commit = off")
        definitions = await _index_definitions(conn)
        for name in definitions:
            await conn.execute(f"DROP INDEX {name}")
        t0 = time.perf_counter()
        await conn.execute(_USERS_SQL, users, tag)
        await conn.execute(_CHATS_SQL, users, tag)
        await conn.execute(_MAP_SQL.replace("$1", "'" + tag.replace("'", "''") + "'"))
        await conn.execute(_ARCHIVAL_SQL, entries, own_entries, users, SYLLABLES)
        timings["archival entries"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        await conn.execute(_TURNS_SQL, turns, users, tag)
        await conn.execute("ALTER TABLE messages DISABLE TRIGGER messages_learn_words")
        try:
            await conn.execute(_MESSAGES_SQL, SYLLABLES)
        finally:
            await conn.execute("ALTER TABLE messages ENABLE TRIGGER messages_learn_words")
        timings["turns and messages"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        await conn.execute(_LEARN_SQL)
        timings["search words"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for sql in definitions.values():
            await conn.execute(sql)
        timings["search indexes"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        await conn.execute("VACUUM ANALYZE archival_memory")
        await conn.execute("VACUUM ANALYZE messages")
        await conn.execute("VACUUM ANALYZE turns")
        await conn.execute("VACUUM ANALYZE memory_search_words")
        await conn.execute("ANALYZE users; ANALYZE chats")
        timings["vacuum analyze"] = time.perf_counter() - t0
    finally:
        await conn.close()
    return timings


def _typo(word: str) -> str:
    """The word with one inner letter dropped."""
    return word[:2] + word[3:]


async def queries(pool: Pool, user_id: int, n: int, seed: int) -> list[tuple[str, int]]:
    """A mix of (query, page): words taken from the user's own entries, as a person would remember them."""
    rng = random.Random(seed)
    rows = await pool.fetch("SELECT content FROM archival_memory WHERE user_id = $1 ORDER BY id LIMIT 2000", user_id)
    texts = [r["content"].split()[:-1] for r in rows]
    out: list[tuple[str, int]] = []
    for i in range(n):
        words = rng.choice(texts)
        kind = i % 6
        if kind == 0:  # a rare word (longest words are rarely among the common 200)
            out.append((max(words, key=len), 1))
        elif kind == 1:  # any word of an entry (often a common one)
            out.append((rng.choice(words), 1))
        elif kind == 2:
            out.append((" ".join(rng.sample(words, 2)), 1))
        elif kind == 3:
            out.append((_typo(max(words, key=len)), 1))
        elif kind == 4:
            out.append((" ".join(words[:3]), 1))
        else:
            out.append((rng.choice(words), 2))
    return out


async def timed(calls: list[Callable[[], Awaitable[dict[str, Any]]]]) -> tuple[list[float], int]:
    """Run calls one by one; their durations in ms (in call order) and how many failed."""
    out, failed = [], 0
    for call in calls:
        t0 = time.perf_counter()
        env = await call()
        out.append((time.perf_counter() - t0) * 1000)
        if not env["ok"] and env["error"]["code"] != "invalid_args":  # a page past the last is a fine answer
            failed += 1
    return out, failed


def line(label: str, ms: list[float], goals: dict[int, float]) -> str:
    """`label: p50 1.2 ms (goal ≤ 10, ok), p99 …` for sorted durations."""
    parts = []
    for q in (50, 90, 99):
        value = percentile(ms, q)
        goal = goals.get(q)
        parts.append(f"p{q} {value:.2f} ms" + (f" (goal ≤ {goal:g}: {verdict(value, goal)})" if goal else ""))
    return f"{label} [{len(ms)} calls]: " + ", ".join(parts) + f", max {ms[-1]:.2f} ms"


async def bench(args: argparse.Namespace) -> int:
    """Fill, measure, print; 1 when a goal is missed."""
    async with bench_database() as db:
        info = await server_info(db.dsn)
        print(f"PostgreSQL {info.version} ({db.description}), synchronous_commit={info.sync_commit}")
        t0 = time.perf_counter()
        timings = await fill(db.dsn, db.tag, args.users, args.entries, args.own_entries, args.turns)
        print(
            f"fill: {time.perf_counter() - t0:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ")"
        )
        pool = await create_pool(db.dsn, min_size=2, max_size=4)
        try:
            return await measure(pool, db.tag, args)
        finally:
            await pool.close()


async def measure(pool: Pool, tag: str, args: argparse.Namespace) -> int:
    """The measured part, on a filled database."""
    counts = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM archival_memory) AS entries, (SELECT count(*) FROM messages) AS messages,"
        " (SELECT count(*) FROM archival_memory a JOIN users u ON u.id = a.user_id WHERE u.platform_user_id = $1)"
        " AS own, (SELECT pg_size_pretty(pg_total_relation_size('archival_memory'))) AS archival_size,"
        " (SELECT pg_size_pretty(pg_total_relation_size('messages'))) AS messages_size",
        f"{tag}0",
    )
    assert counts is not None
    print(
        f"data: {counts['entries']:,} archival entries ({counts['own']:,} of the measured user;"
        f" {counts['archival_size']} with indexes), {counts['messages']:,} messages ({counts['messages_size']})"
    )
    uid = await pool.fetchval("SELECT id FROM users WHERE platform_user_id = $1", f"{tag}0")
    user = UserRef(uid, "telegram", f"{tag}0", "user 0", "UTC")
    chat_id = await pool.fetchval("SELECT id FROM chats WHERE platform_chat_id = $1", f"{tag}0")
    ctx = ToolContext(pool, user, ChatRef(chat_id, "telegram", f"{tag}0", "", "private"), False, system_clock)
    registry = ToolRegistry(memory_tools(500))

    def call(name: str, **kw: Any) -> Callable[[], Awaitable[dict[str, Any]]]:
        return lambda: registry.run(name, json.dumps(kw), ctx, 30)

    mix = await queries(pool, uid, args.searches, seed=1)
    warm = [call("archival_memory_search", query=q, page=p) for q, p in mix[: args.searches // 10]]
    await timed(warm + [call("conversation_search", query=q, page=p) for q, p in mix[: args.searches // 10]])

    status = 0
    each, failed = await timed([call("archival_memory_search", query=q, page=p) for q, p in mix])
    ms = sorted(each)
    print(line("archival_memory_search", ms, {50: GOAL_SEARCH_P50_MS, 99: GOAL_SEARCH_P99_MS}))
    status |= percentile(ms, 50) > GOAL_SEARCH_P50_MS or percentile(ms, 99) > GOAL_SEARCH_P99_MS or failed > 0
    by_kind(each)

    stamp = datetime.now(UTC).strftime("%H%M%S%f")
    each, failed = await timed(
        [call("archival_memory_insert", content=f"bench insert {stamp} {i} lorem ipsum") for i in range(args.inserts)]
    )
    ms = sorted(each)
    print(line("archival_memory_insert", ms, {50: GOAL_INSERT_P50_MS}))
    status |= percentile(ms, 50) > GOAL_INSERT_P50_MS or failed > 0

    each, failed = await timed([call("conversation_search", query=q, page=p) for q, p in mix])
    ms = sorted(each)
    print(line("conversation_search", ms, {50: GOAL_CONVERSATION_P50_MS}))
    by_kind(each)
    status |= percentile(ms, 50) > GOAL_CONVERSATION_P50_MS or failed > 0

    await blocks_cost(pool, uid)
    await trigger_cost(pool, uid, chat_id)
    print("goals:", "all met" if not status else "MISSED (see above)")
    return int(status)


KINDS = ("a rare word", "any word", "two words", "a typo", "three words", "page 2")


def by_kind(each: list[float]) -> None:
    """p50 and p99 per kind of query of the mix (the mix cycles through KINDS)."""
    for kind, label in enumerate(KINDS):
        part = sorted(ms for i, ms in enumerate(each) if i % len(KINDS) == kind)
        print(f"  {label:12} p50 {percentile(part, 50):6.2f} ms, p99 {percentile(part, 99):6.2f} ms")


async def blocks_cost(pool: Pool, uid: int) -> None:
    """What full 500-word human and persona blocks cost to load (alone here; phase 2 folds it into begin_turn)."""
    line_ = " ".join(["word"] * 10)
    for name in ("human", "persona"):
        await pool.execute(
            "INSERT INTO memory_blocks (user_id, name, lines) VALUES ($1, $2, $3)"
            " ON CONFLICT (user_id, name) DO UPDATE SET lines = EXCLUDED.lines",
            uid,
            name,
            [line_] * 50,
        )
    n = 2000
    base, loaded, rendered = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        await pool.fetchval("SELECT 1")
        t1 = time.perf_counter()
        rows = await pool.fetchval("SELECT memory_blocks_json($1)", uid)
        t2 = time.perf_counter()
        render_prompt_section(rows, 500)
        t3 = time.perf_counter()
        base.append((t1 - t0) * 1000)
        loaded.append((t2 - t1) * 1000)
        rendered.append((t3 - t2) * 1000)
    base, loaded, rendered = sorted(base), sorted(loaded), sorted(rendered)
    print(
        f"full blocks (2 x 500 words): SELECT memory_blocks_json p50 {percentile(loaded, 50):.3f} ms"
        f" vs SELECT 1 p50 {percentile(base, 50):.3f} ms (the difference is what folding adds);"
        f" render_prompt_section p50 {percentile(rendered, 50):.3f} ms"
    )


async def trigger_cost(pool: Pool, uid: int, chat_id: int) -> None:
    """What learning a message's words costs each message insert (the trigger), on a warm 1M-message table."""
    rng = random.Random(2)
    words = [r["word"] for r in await pool.fetch("SELECT word FROM memory_search_words LIMIT 5000")]
    sql = "INSERT INTO messages (chat_id, user_id, role, content) VALUES ($1, $2, 'user', $3)"
    results = {}
    for enabled in (True, False, True, False):
        if not enabled:
            await pool.execute("ALTER TABLE messages DISABLE TRIGGER messages_learn_words")
        try:
            ms = []
            for _ in range(500):
                text = " ".join(rng.choice(words) for _ in range(15)) + f" new{rng.randrange(10**9)}"
                t0 = time.perf_counter()
                await pool.execute(sql, chat_id, uid, text)
                ms.append((time.perf_counter() - t0) * 1000)
            results[enabled] = sorted(ms)
        finally:
            await pool.execute("ALTER TABLE messages ENABLE TRIGGER messages_learn_words")
    on, off = percentile(results[True], 50), percentile(results[False], 50)
    print(f"message insert (16 words): p50 {on:.3f} ms with the learn-words trigger, {off:.3f} ms without")


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when a goal is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=1_000_000, help="archival entries in total")
    parser.add_argument("--own-entries", type=int, default=100_000, help="of the measured user")
    parser.add_argument("--turns", type=int, default=500_000, help="turns (two messages each)")
    parser.add_argument("--searches", type=int, default=600)
    parser.add_argument("--inserts", type=int, default=500)
    args = parser.parse_args(argv)
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
