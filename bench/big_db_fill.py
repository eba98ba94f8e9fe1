"""The large database of bench.big_db, filled in SQL (generate_series, INSERT … SELECT) after the migrations: accounts
and identities, chats with turns and messages over a year, tasks with their reminders' occurrences, archival notes,
core memory and search words, handled inbox updates and a year of token usage. The indexes the migrations made on the
big tables are dropped for the fill and made again after it (then ANALYZE); triggers and foreign-key checks are off
while it runs (`session_replication_role = replica`), so what a trigger would have made is filled by hand.

Who is who (identity `telegram:<7000 + n>` is account n, its private chat is chat n): 7001 the heavy account (/tasks
with 200 open tasks, /export), 7002 and 7003 two heavy accounts /link merges, 7004 the heavy account /forget_me
deletes, 7005 the other person whose turns are timed meanwhile. Telegram group -1000001 holds 50,000 messages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import asyncpg

HEAVY = (1, 2, 3, 4)  # the heavy accounts (their telegram ids 7001..7004)
TELEGRAM_BASE = 7000  # identity n speaks as telegram user 7000 + n
DISCORD_BASE = 900_000_000
BIG_GROUP_CHAT = "-1000001"  # the 50,000-message group
GROUP_BASE = 1_000_000  # group j is telegram chat -(GROUP_BASE + j)
INBOX_UPDATE_BASE = 10**12  # the fill's update ids, far from any a bench pushes
WORDS = (
    "milk bread dentist invoice meeting garden flight hotel birthday gift report deadline budget tickets concert "
    "recipe train station doctor pharmacy laundry groceries password backup laptop printer paint window kitchen "
    "bicycle tyres football practice homework library museum weekend holiday passport insurance taxes bank loan "
    "coffee lunch dinner salad pizza pasta soup"
).split()
BIG_TABLES = (
    "users",
    "accounts",
    "chats",
    "turns",
    "messages",
    "tasks",
    "occurrences",
    "archival_memory",
    "memory_blocks",
    "memory_search_words",
    "inbox",
    "token_usage",
)


@dataclass(frozen=True)
class Sizes:
    """How many rows of each kind a fill at `scale` makes (1.0: the issue's sizes)."""

    scale: float
    accounts: int
    identities: int
    chats: int
    messages: int
    big_group: int  # messages in the big group
    heavy_messages: int  # messages in each heavy account's private chat
    tasks: int
    archival: int
    heavy_archival: int
    inbox: int  # handled updates kept (the last two days)
    inbox_old: int  # handled updates past their two days, for the inbox's pruning

    @classmethod
    def at(cls, scale: float) -> Sizes:
        """The sizes at `scale` (at least a few rows of each)."""

        def n(full: int, least: int = 10) -> int:
            return max(least, round(full * scale))

        accounts = n(100_000, 20)
        messages = n(10_000_000, 20_000)
        return cls(
            scale,
            accounts,
            accounts + accounts // 2,
            max(n(200_000, 40), accounts + accounts // 2 + 2),
            messages,
            min(50_000, messages // 4) // 2 * 2,
            min(n(50_000, 1_000), messages // 10) // 2 * 2,
            n(1_000_000, 100),
            n(1_000_000, 100),
            min(2_000, n(2_000_000, 50)),
            n(500_000, 100),
            n(50_000, 10),
        )

    def line(self) -> str:
        """One line of what the fill holds."""
        return (
            f"{self.accounts:,} accounts ({self.identities:,} identities), {self.messages:,} messages over "
            f"{self.chats:,} chats (a {self.big_group:,}-message group; heavy accounts {self.heavy_messages:,} "
            f"messages each), {self.tasks:,} tasks, {self.archival:,} archival notes, {self.inbox:,} handled inbox "
            f"updates (+{self.inbox_old:,} past their time), a year of token usage"
        )


def _statements(z: Sizes, inbox_platform: str) -> list[tuple[str, str, tuple[object, ...]]]:
    """The fill, as (what, SQL, parameters) in order."""
    a, half = z.accounts, z.accounts // 2
    privates = a + half  # chats 1..a telegram private, a+1..a+half discord DMs, then groups
    groups = z.chats - privates
    heavy_turns = z.heavy_messages // 2
    group_turns = z.big_group // 2
    rest_chats = z.chats - len(HEAVY) - 1
    rest_turns = max(1, (z.messages - z.big_group - len(HEAVY) * z.heavy_messages) // 2 // rest_chats)
    words = list(WORDS)
    return [
        (
            "accounts",
            "INSERT INTO accounts (id, created_at) SELECT g, now() - interval '400 days' FROM generate_series(1, $1) g",
            (a,),
        ),
        (
            "identities",
            """INSERT INTO users (id, platform, platform_user_id, display_name, account_id, created_at)
               SELECT g, 'telegram', ($2 + g)::text, 'User ' || g, g, now() - interval '400 days'
               FROM generate_series(1, $1) g
               UNION ALL
               SELECT $1 + g, 'discord', ($3 + g)::text, 'User ' || g, g, now() - interval '300 days'
               FROM generate_series(1, $4) g""",
            (a, TELEGRAM_BASE, DISCORD_BASE, half),
        ),
        (
            "chats",
            """INSERT INTO chats (id, platform, platform_chat_id, kind, title, created_at)
               SELECT g, 'telegram', ($2 + g)::text, 'private', '', now() - interval '400 days'
               FROM generate_series(1, $1) g
               UNION ALL
               SELECT $1 + g, 'discord', ($3 + g)::text, 'private', '', now() - interval '300 days'
               FROM generate_series(1, $4) g
               UNION ALL
               SELECT $1 + $4 + g, 'telegram', (-($5 + g))::text, 'group', 'Group ' || g, now() - interval '400 days'
               FROM generate_series(1, $6) g""",
            (a, TELEGRAM_BASE, DISCORD_BASE + 10_000_000, half, GROUP_BASE, groups),
        ),
        # turns: the big group's first, then each heavy account's private chat, then every other chat alike; a
        # chat's n-th turn is n/k of the way through the year. Speakers: a private chat's identity; in groups,
        # accounts spread over everyone (the big group: accounts 1..50, the heavy ones among them).
        (
            "turns",
            """CREATE TEMP TABLE fill_chats AS
               SELECT c.id, c.kind, row_number() OVER (ORDER BY c.id) - 1 AS rk FROM chats c
               WHERE c.id <> ALL($1::bigint[]) AND c.id <> $2""",
            (list(HEAVY), privates + 1),
        ),
        (
            "turns",
            """INSERT INTO turns (id, chat_id, user_id, platform_message_id, status, steps, started_at, finished_at)
               SELECT n, $1, 1 + (n * 7) % 50, n::text, 'done', 1, s, s + interval '2 seconds'
               FROM generate_series(1, $2) n,
                    LATERAL (SELECT now() - interval '365 days' * (1 - n::float8 / $2) AS s) t""",
            (privates + 1, group_turns),
        ),
        (
            "turns",
            """INSERT INTO turns (id, chat_id, user_id, platform_message_id, status, steps, started_at, finished_at)
               SELECT $1 + (h - 1) * $2 + n, h, h, n::text, 'done', 1, s, s + interval '2 seconds'
               FROM unnest($3::bigint[]) h, generate_series(1, $2) n,
                    LATERAL (SELECT now() - interval '365 days' * (1 - n::float8 / $2) AS s) t""",
            (group_turns, heavy_turns, list(HEAVY)),
        ),
        (
            "turns",
            """INSERT INTO turns (id, chat_id, user_id, platform_message_id, status, steps, started_at, finished_at)
               SELECT $1 + c.rk * $2 + n, c.id,
                      CASE WHEN c.id <= $3 THEN c.id WHEN c.id <= $3 + $4 THEN c.id ELSE 1 + (c.id * 7 + n) % $3 END,
                      n::text, 'done', 1, s, s + interval '2 seconds'
               FROM fill_chats c, generate_series(1, $2) n,
                    LATERAL (SELECT now() - interval '365 days' * (1 - (n::float8 + c.rk % 7) / ($2 + 7)) AS s) t""",
            (group_turns + len(HEAVY) * heavy_turns, rest_turns, a, half),
        ),
        # messages: each turn's user message (id 2t - 1) and the answer (2t)
        (
            "messages",
            """INSERT INTO messages (id, chat_id, turn_id, user_id, role, content, author_name, platform_message_id,
                                     created_at)
               SELECT 2 * t.id - 1 + r.k, t.chat_id, t.id, CASE WHEN r.k = 0 THEN t.user_id END,
                      CASE WHEN r.k = 0 THEN 'user' ELSE 'assistant' END,
                      CASE WHEN r.k = 0
                           THEN 'please remind me about the ' || w1 || ' and the ' || w2 || ' before ' || w3
                           ELSE 'Sure: I will remind you about the ' || w1 || ' and the ' || w2 || '. Anything else '
                                || 'about the ' || w3 || '?' END,
                      CASE WHEN r.k = 0 THEN 'User ' || t.user_id ELSE '' END,
                      CASE WHEN r.k = 0 THEN t.platform_message_id END,
                      t.started_at + r.k * interval '1 second'
               FROM turns t, (VALUES (0), (1)) r(k),
                    LATERAL (SELECT ($1::text[])[1 + (t.id * 7919) % 50] AS w1,
                                    ($1::text[])[1 + (t.id * 104729) % 50] AS w2,
                                    ($1::text[])[1 + (t.id * 31) % 50] AS w3) w""",
            (words,),
        ),
        # tasks: the heavy accounts 200 open and 300 done each; the others round robin, by i % 20: 0 done (one
        # delivered occurrence), 1-6 open daily at 09:00 (9 delivered occurrences over the year), 7-14 open one-shot
        # in the next 60 days, 15-19 open one-shot past due, delivered, never marked done (its occurrence stays)
        (
            "tasks",
            """INSERT INTO tasks (id, user_id, chat_id, created_by, title, status, due_at, recurrence, timezone, kind,
                                  own_words, created_at, updated_at)
               SELECT i, u, u, u, 'Task ' || i || ': the ' || ($3::text[])[1 + i % 50],
                      CASE WHEN k = 0 THEN 'done' ELSE 'pending' END,
                      CASE WHEN k BETWEEN 1 AND 6 THEN date_trunc('day', now()) + interval '1 day 9 hours'
                           WHEN k BETWEEN 7 AND 14 THEN now() + interval '60 days' * ((i * 7919) % 1000 + 1) / 1000
                           ELSE now() - interval '360 days' * ((i * 7919) % 1000 + 5) / 1005 END,
                      CASE WHEN k BETWEEN 1 AND 6 THEN '{"kind": "cron", "time": "09:00"}'::jsonb END,
                      'UTC', 'reminder', true, now() - interval '370 days', now() - interval '1 day'
               FROM generate_series(1, $1::bigint) i, LATERAL (SELECT i % 20 AS k, 1 + $4 + i % ($2 - $4) AS u) x""",
            (z.tasks, a, words, len(HEAVY)),
        ),
        (
            "tasks",
            """INSERT INTO tasks (id, user_id, chat_id, created_by, title, status, due_at, timezone, kind, own_words,
                                  created_at, updated_at)
               SELECT $1 + (h - 1) * 500 + n, h, h, h, 'Heavy task ' || n,
                      CASE WHEN n <= 200 THEN 'pending' ELSE 'done' END,
                      CASE WHEN n <= 200 THEN now() + interval '1 hour' * n
                           ELSE now() - interval '1 day' * (n - 200) END,
                      'UTC', 'reminder', true, now() - interval '300 days', now()
               FROM unnest($2::bigint[]) h, generate_series(1, 500) n""",
            (z.tasks, list(HEAVY)),
        ),
        (
            "occurrences",
            """INSERT INTO occurrences (task_id, scheduled_at, status, claimed_by, attempts, ran_at, delivered_at,
                                        platform_message_id)
               SELECT t.id, o.at, 'delivered', 'fill', 1, o.at, o.at + interval '1 second', '1'
               FROM tasks t, LATERAL (
                   SELECT t.due_at - interval '40 days' * g AS at FROM generate_series(1, 9) g
                   WHERE t.recurrence IS NOT NULL
                   UNION ALL SELECT t.due_at WHERE t.recurrence IS NULL AND t.due_at < now()) o""",
            (),
        ),
        (
            "archival notes",
            """INSERT INTO archival_memory (id, user_id, content, sha256, number, created_at)
               SELECT i, u, c, sha256(convert_to(c, 'UTF8')), nr, now() - interval '360 days' * (i % 1000) / 1000
               FROM generate_series(1, $1::bigint) i,
                    LATERAL (SELECT 1 + $3 + i % ($2 - $3) AS u, 1 + i / ($2 - $3) AS nr) x,
                    LATERAL (SELECT 'Note ' || i || ': likes ' || ($4::text[])[1 + i % 50] || ' and '
                                    || ($4::text[])[1 + (i * 13) % 50] || ', not ' || ($4::text[])[1 + (i * 29) % 50]
                                    AS c) y""",
            (z.archival, a, len(HEAVY), words),
        ),
        (
            "archival notes",
            """INSERT INTO archival_memory (id, user_id, content, sha256, number, created_at)
               SELECT $1 + (h - 1) * $2 + n, h, c, sha256(convert_to(c, 'UTF8')), n, now() - interval '1 hour' * n
               FROM unnest($3::bigint[]) h, generate_series(1, $2) n,
                    LATERAL (SELECT 'Heavy note ' || n || ' of ' || h || ': ' || ($4::text[])[1 + n % 50] AS c) y""",
            (z.archival, z.heavy_archival, list(HEAVY), words),
        ),
        (
            "core memory",
            """INSERT INTO memory_blocks (user_id, name, lines, created_at, updated_at)
               SELECT g, b.name,
                      ARRAY['Name: User ' || g, 'Likes ' || ($2::text[])[1 + g % 50], 'Lives near a station'],
                      now() - interval '300 days', now() - interval '3 days'
               FROM generate_series(1, $1) g, (VALUES ('human'), ('persona')) b(name) WHERE g % 2 = 1 OR g <= 4""",
            (a, words),
        ),
        (
            "search words",
            """INSERT INTO memory_search_words (user_id, word)
               SELECT g, ($2::text[])[1 + (g + k) % 50] FROM generate_series(1, $1) g, generate_series(0, 19) k""",
            (a, words),
        ),
        # the handled updates of the last two days (what the inbox's pruning leaves), and some past their time
        (
            "inbox",
            """INSERT INTO inbox (platform, update_id, chat_key, payload, received_at, attempts, owner, lease_until,
                                  done_at)
               SELECT $3::text, $4::bigint + i, 'telegram:' || (7000 + u),
                      jsonb_build_object('update_id', $4 + i, 'message',
                          jsonb_build_object('message_id', i, 'date', 1700000000 + i, 'text', 'remind me about the '
                                                 || ($5::text[])[1 + i % 50],
                                             'from', jsonb_build_object('id', 7000 + u, 'is_bot', false,
                                                                        'first_name', 'User ' || u),
                                             'chat', jsonb_build_object('id', 7000 + u, 'type', 'private',
                                                                        'first_name', 'User ' || u))),
                      d, 1, 'fill', d + interval '30 seconds', d + interval '1 second'
               FROM generate_series(1, $1::bigint + $2::bigint) i,
                    LATERAL (SELECT 1 + (i * 7919) % $6 AS u,
                                    CASE WHEN i <= $1 THEN now() - interval '47 hours' * i / $1
                                         ELSE now() - interval '2 days' - interval '2 days' * (i - $1) / $2
                                    END AS d) x""",
            (z.inbox, z.inbox_old, inbox_platform, INBOX_UPDATE_BASE, words, a),
        ),
        # a year of token usage: every account on one day in twelve, the heavy accounts every day
        (
            "token usage",
            """INSERT INTO token_usage (account_id, day, model, prompt_tokens, completion_tokens, cached_tokens, calls)
               SELECT g, current_date - d, 'fake-model', 1500 * (1 + g % 7), 200 * (1 + d % 5), 0, 1 + g % 7
               FROM generate_series(1, $1) g, generate_series(0, 364) d
               WHERE (g + d) % 12 = 0 OR g <= $2""",
            (a, len(HEAVY)),
        ),
        (
            "token usage",
            """INSERT INTO token_usage_bot (day, prompt_tokens, completion_tokens, cached_tokens, calls)
               SELECT current_date - d, 10000000, 1000000, 0, 5000 FROM generate_series(0, 364) d""",
            (),
        ),
    ]


_SEQUENCES = (
    ("users_id_seq", "SELECT max(id) FROM users"),
    ("chats_id_seq", "SELECT max(id) FROM chats"),
    ("turns_id_seq", "SELECT max(id) FROM turns"),
    ("messages_id_seq", "SELECT max(id) FROM messages"),
    ("tasks_id_seq", "SELECT max(id) FROM tasks"),
    ("archival_memory_id_seq", "SELECT max(id) FROM archival_memory"),
)

# Indexes on the big tables that no constraint owns: dropped for the fill, made again after it.
_INDEXES_SQL = """
SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS def
FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
WHERE t.relname = ANY($1::text[]) AND t.relnamespace = 'public'::regnamespace
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
"""


async def fill(conn: asyncpg.Connection, z: Sizes, inbox_platform: str, say: bool = True) -> float:
    """Fill a migrated, empty database to `z`; the seconds it took (printed step by step when `say`)."""
    t0 = time.monotonic()

    def step(what: str, since: float) -> None:
        if say:
            print(f"    {what:<16} {time.monotonic() - since:7.1f} s", flush=True)

    await conn.execute("SET maintenance_work_mem = '512MB'")
    await conn.execute("SET work_mem = '256MB'")
    await conn.execute("SET synchronous_commit = off")
    await conn.execute("SET session_replication_role = replica")  # no triggers, no foreign-key checks
    indexes = await conn.fetch(_INDEXES_SQL, list(BIG_TABLES))
    for r in indexes:
        await conn.execute(f"DROP INDEX {r['name']}")
    for what, sql, args in _statements(z, inbox_platform):
        t = time.monotonic()
        await conn.execute(sql, *args)
        step(what, t)
    for seq, top in _SEQUENCES:
        await conn.execute("SELECT setval($1, coalesce((" + top + "), 0) + 1)", seq)
    await conn.execute("SELECT setval(pg_get_serial_sequence('token_usage', 'id'), (SELECT max(id) FROM token_usage))")
    await conn.execute("SET session_replication_role = DEFAULT")
    t = time.monotonic()
    for r in indexes:
        await conn.execute(r["def"])
    step(f"{len(indexes)} indexes", t)
    t = time.monotonic()
    await conn.execute("VACUUM (ANALYZE)")
    step("vacuum, analyze", t)
    return time.monotonic() - t0
