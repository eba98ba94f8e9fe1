"""The bot on a large database beside an empty one (issue 35): the same measurements, in one run, on a freshly migrated
database and on one filled (bench/big_db_fill.py) with 100,000 accounts (150,000 identities), 10,000,000 messages over
200,000 chats, 1,000,000 tasks with 3,000,000 occurrences, 1,000,000 archival notes, 500,000 handled inbox updates and
a year of token usage (`--scale` shrinks it all). Measured on each: a private Telegram turn end to end (the real PTB
against the fake Bot API, the fake model answering at once: bench.telegram_overhead's rig), a group turn in a
50,000-message group, the reminder claim of 10,000 due occurrences (among 1,000,000 open tasks) and the sweep's other
queries, `/tasks` of a person with 200 open tasks, `/export` of a heavy account (its time and the peak of Python
memory), `/link` merging two heavy accounts and `/forget_me` of a heavy one (each with another person's turns timed
while it runs), and retention pruning a year of reminder history and two days of handled updates (each batch's time:
how long its locks are held). Goals: every per-turn figure within 1.2× of the empty database's, every plan of a turn's
queries on indexes (`--verbose` prints them, auto_explain with nested statements; a sequential scan of a big table is
flagged either way).

The filled database is a template: each run copies it (CREATE DATABASE … TEMPLATE), so `--keep DIR` keeps the server
and the template in DIR and a later run skips the fill (migrations added since are applied to the copy, and timed).
Without --keep the server lives in a temp dir under /tmp, deleted at the end.

Figures (`--scale 1`, 2-core machine shared with other jobs, load average 2.4–3.3; the fill: 305 s, 5.6 GB; more in
docs/architecture.md, "Benchmarks and figures"):

    measurement                                     empty            full                 ratio
    private turn p50 / p99 (wall)                   12.6 / 50.8 ms   19.7 / 46.5 ms       1.56× / 0.91× (1.0–1.64×)
    private turn CPU: bot / PostgreSQL              7.09 / 3.07 ms   7.10 / 2.90 ms       1.00× / 0.95×
    group turn (50,000-message group) p50 / p99     16.9 / 41.1 ms   26.0 / 63.4 ms       1.54× / 1.54×
    /tasks with 200 open tasks p50                  3.5 ms           5.7 ms               1.63× (runs: 0.82–1.63×)
    reminder claim, batch of 500 (10,000 due)       15.7 ms          36.0 ms              2.29× (runs: 0.92–2.29×)
    sweep's stale query (every 30 s)                0.33 ms          0.50 ms              (was 675–947 ms)
    sweep's full pass (start, hourly): stale/zones  0.33 / 0.31 ms   852 / 614 ms
    /export of a heavy account: time, peak memory   19 ms, 0.9 MB    1.1–1.5 s, 14.3 MB   (was 111 MB for its file)
    /link of two heavy accounts                     74 ms            136–244 ms           others' turns ≤ 46 ms
    /forget_me of a heavy account                   78 ms            2.3–3.0 s            others' turns ≤ 57 ms
    retention, a year of occurrences (2.1 M rows)   —                35–43 s; batch p50 14–16 ms, max 97–115 ms
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import re
import resource
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from adapters.telegram.config import bot_id
from bench.big_db_fill import BIG_GROUP_CHAT, BIG_TABLES, Sizes, fill
from bench.common import (
    BenchDatabase,
    CpuMeter,
    FakeLLMProcess,
    _prepare,
    load_average,
    parser,
    percentile,
    quiet_logging,
)
from bench.telegram_overhead import (
    ID_BASE,
    MESSAGE_ID_STRIDE,
    Pacing,
    Rig,
    RunResult,
    make_rig,
    measured_run,
    one_turn,
    run_turns,
)
from core.accounts.own_data import FileAnswer, forget_account
from core.constants import (
    INBOX_FORGET_BATCH,
    INBOX_KEEP_DONE_S,
    REMINDER_BATCH,
    REMINDER_STALE_OVERLAP,
    RETENTION_BATCH,
)
from core.reminders import queries
from core.storage import retention
from core.storage.embedded import start_embedded
from core.storage.inbox_table import forget_done
from core.types import Incoming
from tests.fake_telegram import TOKEN

GOAL_RATIO = 1.2
OTHER = "7005"  # the person whose turns are timed while a heavy account is merged, forgotten or pruned
ROUNDS = 4  # the per-turn figures: the databases take turns this often each
OTHER_GAP_S = 0.05  # between OTHER's turns: the adapter's send window (30 a second) never makes one wait
CLAIM_DUE = 10_000
KEEP_OCCURRENCES = timedelta(days=90)  # RETENTION_DAYS' default
SKIPPED_SQL = ("BEGIN", "COMMIT", "ROLLBACK", "SET ", "RESET ", "LISTEN", "UNLISTEN", "SELECT pg_advisory_unlock_all")


# ---------------------------------------------------------------- figures


@dataclass
class Figures:
    """One database's figures: name → (value, unit, per turn: whether the 1.2× goal applies)."""

    values: dict[str, tuple[float, str, bool]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, value: float, unit: str = "ms", *, per_turn: bool = False) -> None:
        """Record a figure (and print it)."""
        self.values[name] = (value, unit, per_turn)
        print(f"    {name:<58} {value:10.2f} {unit}", flush=True)


def ms_since(t0: float) -> float:
    """Milliseconds since a time.monotonic() mark."""
    return (time.monotonic() - t0) * 1000


def p(values: list[float], q: float) -> float:
    """The q-th percentile of unsorted values."""
    return percentile(sorted(values), q)


# ---------------------------------------------------------------- the server and its databases


def dsn_of(uri: str, name: str) -> str:
    """The server's URI pointed at database `name`."""
    parts = urlsplit(uri)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def recreate(admin: asyncpg.Connection, name: str, template: str | None = None) -> float:
    """Drop and create a database (a copy of `template`, if given); seconds."""
    t0 = time.monotonic()
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    copy = f' TEMPLATE "{template}" STRATEGY FILE_COPY' if template else ""  # WAL_LOG would write it all to the WAL
    await admin.execute(f'CREATE DATABASE "{name}"{copy}')
    return time.monotonic() - t0


async def template(admin: asyncpg.Connection, uri: str, sizes: Sizes, platform: str) -> str:
    """The filled template database at this scale (made now unless one is there): its name."""
    name = f"bigdb_template_{str(sizes.scale).replace('.', '_')}"
    have = await admin.fetchval(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1", name
    )
    if have and have.startswith("filled"):
        print(f"  the template {name} is there ({have}); no fill")
        return name
    await recreate(admin, name)
    await _prepare(dsn_of(uri, name), "template", "fill-")
    print(f"  filling {name}: {sizes.line()}", flush=True)
    conn = await asyncpg.connect(dsn_of(uri, name))
    try:
        took = await fill(conn, sizes, platform)
        size = await conn.fetchval("SELECT pg_size_pretty(pg_database_size(current_database()))")
    finally:
        await conn.close()
    await admin.execute(f"COMMENT ON DATABASE \"{name}\" IS 'filled in {took:.0f} s, {size}'")
    print(f"  filled in {took:.0f} s; {size} on disk", flush=True)
    return name


async def table_sizes(dsn: str) -> str:
    """Rows (estimated) and size of the big tables, one line."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT relname, reltuples::bigint AS n, pg_size_pretty(pg_total_relation_size(oid)) AS size"
            " FROM pg_class WHERE relname = ANY($1::text[]) AND relkind = 'r'"
            " ORDER BY pg_total_relation_size(oid) DESC",
            list(BIG_TABLES),
        )
    finally:
        await conn.close()
    return ", ".join(f"{r['relname']} {max(0, r['n']):,} ({r['size']})" for r in rows)


# ---------------------------------------------------------------- EXPLAIN of a turn's queries


@dataclass(eq=False)  # hashable: asyncpg keeps its loggers in a set
class QueryLog:
    """The statements the bot's pool ran while it was on (first arguments of each distinct text)."""

    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    elapsed: dict[str, list[float]] = field(default_factory=dict)  # ms, as the client saw each run

    def __call__(self, record: Any) -> None:
        """asyncpg's query logger callback."""
        query = str(record.query)
        if query.lstrip().upper().startswith(SKIPPED_SQL):
            return
        self.seen.setdefault(query, tuple(record.args or ()))
        self.elapsed.setdefault(query, []).append(float(record.elapsed) * 1000)


def statement_table(empty: QueryLog, full: QueryLog) -> list[str]:
    """Each statement of a turn: its median time on each database (ms, the client's view), and their ratio."""
    lines = [f"  {'statement (ms as the bot saw it: p50, p99)':<80} {'empty':>13} {'full':>13} {'p50 ratio':>9}  runs"]
    for query, times in sorted(full.elapsed.items(), key=lambda kv: -len(kv[1])):
        theirs = empty.elapsed.get(query, [float("nan")])
        head = " ".join(query.split())[:80]
        cells = f"{p(theirs, 50):6.2f} {p(theirs, 99):6.2f} {p(times, 50):6.2f} {p(times, 99):6.2f}"
        lines.append(f"  {head:<80} {cells} {p(times, 50) / p(theirs, 50):8.2f}×  {len(times)}")
    return lines


def pool_connections(rig: Rig) -> list[asyncpg.Connection]:
    """The open connections of the bot's pool (asyncpg keeps them in its holders)."""
    holders = getattr(rig.core.pool, "_holders", [])
    return [h._con for h in holders if getattr(h, "_con", None) is not None]


async def explain(dsn: str, log: QueryLog, verbose: bool) -> list[str]:
    """Run each logged statement again with auto_explain (ANALYZE, nested statements too) in a transaction rolled back;
    print the plans when `verbose`; the lines that scan a big table sequentially."""
    conn = await asyncpg.connect(dsn)
    notices: list[str] = []
    conn.add_log_listener(lambda _c, msg: notices.append(str(msg.message)))
    flagged: list[str] = []
    seq = re.compile(r"Seq Scan on (\w+)")
    try:
        await conn.execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;"
            " SET auto_explain.log_nested_statements = on; SET auto_explain.log_buffers = on;"
            " SET client_min_messages = log"
        )
        for query, args in log.seen.items():
            notices.clear()
            tr = conn.transaction()
            await tr.start()
            try:
                await conn.fetch(query, *args)
            except asyncpg.PostgresError as e:
                notices.append(f"(could not run again: {e})")
            finally:
                await tr.rollback()
            head = " ".join(query.split())[:110]
            plans = [n for n in notices if "Query Text" in n or "could not" in n]
            hits = sorted({m for n in plans for m in seq.findall(n) if m in BIG_TABLES})
            if hits:
                flagged.append(f"{head}: Seq Scan on {', '.join(hits)}")
            if verbose:
                print(f"  --- {head}")
                for n in plans:
                    print("      " + n.replace("\n", "\n      "))
    finally:
        await conn.close()
    return flagged


# ---------------------------------------------------------------- turns


async def group_turn(rig: Rig, n: int) -> float:
    """One @mention in the big group by one of the bench's people; push → sendMessage at the fake, in ms."""
    fake = rig.fake
    user = 7001 + n % 5
    update = fake.message_update(
        f"@test_bot what did we decide about the trip? (#{n})",
        message_id=ID_BASE * rig.tag + 500_000 + n * MESSAGE_ID_STRIDE,
        chat_id=int(BIG_GROUP_CHAT),
        user_id=user,
        first_name=f"U{user}",
        chat_type="group",
    )
    before = len(fake.sent)
    pushed = time.monotonic()
    rig.push(update)
    await fake.wait_sent(before + 1, timeout=30.0)
    return (fake.sent_at[before] - pushed) * 1000


async def other_turn(rig: Rig) -> float:
    """One private turn of OTHER (7005), in ms."""
    rig.turns_done += (4 - rig.turns_done % 5) % 5  # one_turn picks USERS[n % 5]: 7005
    return (await one_turn(rig, after_idle=False)).ms


async def while_running(rig: Rig, work: Awaitable[Any]) -> tuple[float, list[float], Any]:
    """Run `work` while OTHER's turns go on one after another: its ms, their ms, its result."""
    t0 = time.monotonic()
    task = asyncio.ensure_future(work)
    others: list[float] = []
    while not task.done():
        others.append(await other_turn(rig))
        await asyncio.sleep(OTHER_GAP_S)
    took = ms_since(t0)
    return took, others, task.result()


def inc(user: str, text: str) -> Incoming:
    """A private message of telegram user `user`."""
    return Incoming("telegram", user, user, text, user_name=f"U{user}")


# ---------------------------------------------------------------- one database's measurements


@dataclass
class Side:
    """One database's bot (the real adapter and core on it) and what was measured on it."""

    label: str
    db: BenchDatabase
    rig: Rig
    f: Figures = field(default_factory=Figures)
    log: QueryLog = field(default_factory=QueryLog)
    private: list[RunResult] = field(default_factory=list)
    group: list[float] = field(default_factory=list)
    tasks: list[float] = field(default_factory=list)


async def per_turn(sides: list[Side], args: argparse.Namespace) -> None:
    """The per-turn figures, the two databases taking turns in ROUNDS rounds (so a busy host weighs on both alike):
    private turns, group turns in the big group, /tasks."""
    pacing = Pacing(8, args.pause)
    for side in sides:
        rig = side.rig
        await run_turns(rig, args.warmup, pacing)
        rig.adapter.rate_limiter._group_max_rate = 0  # Telegram's 20 messages a minute per group would be measured
        for n in range(8):  # the first ones make the group in the empty database
            await group_turn(rig, n)
        await add_open_tasks(rig)
    for r in range(ROUNDS):
        for side in sides if r % 2 == 0 else sides[::-1]:
            rig = side.rig
            await asyncio.sleep(pacing.pause_s)
            for conn in pool_connections(rig):
                conn.add_query_logger(side.log)
            side.private.append(await measured_run(rig, CpuMeter(side.db.postmaster), args.turns // ROUNDS, pacing))
            for conn in pool_connections(rig):
                conn.remove_query_logger(side.log)
            for n in range(args.group_turns // ROUNDS):
                if n % pacing.burst == 0:
                    await asyncio.sleep(pacing.pause_s)
                side.group.append(await group_turn(rig, 8 + len(side.group)))
            for _ in range(10):
                t0 = time.monotonic()
                answer = await rig.core.command(inc("7001", "/tasks"), "tasks")
                side.tasks.append(ms_since(t0))
            assert isinstance(answer, str) and answer.count("\n- #") >= 40, answer
    print("\n== the statements of a private turn, side by side ==")
    print("\n".join(statement_table(sides[0].log, sides[1].log)))
    for side in sides:
        print(f"\n== {side.label} database: per-turn figures ==")
        f, runs = side.f, side.private
        warm = sorted(ms for run in runs for ms in run.ms(after_idle=False))
        turns = sum(len(run.turns) for run in runs)
        f.add("private turn p50 (back to back)", percentile(warm, 50), per_turn=True)
        f.add("private turn p99 (back to back)", percentile(warm, 99), per_turn=True)
        f.add("private turn, bot CPU", sum(run.cpu.bot_s for run in runs) * 1000 / turns, per_turn=True)
        pg = [run.cpu.postgres_s for run in runs if run.cpu.postgres_s is not None]
        if pg:
            f.add("private turn, PostgreSQL CPU", sum(pg) * 1000 / turns, per_turn=True)
        f.add("group turn p50 (50,000-message group when full)", p(side.group, 50), per_turn=True)
        f.add("group turn p99", p(side.group, 99), per_turn=True)
        f.add("/tasks with 200 open tasks p50", p(side.tasks, 50), per_turn=True)
        f.add("/tasks p99", p(side.tasks, 99))
        if args.verbose:
            print(f"  == EXPLAIN (auto_explain, ANALYZE, nested) of the {len(side.log.seen)} statements of a turn ==")
        flagged = await explain(side.db.dsn, side.log, args.verbose)
        f.notes += flagged or [f"the turn's {len(side.log.seen)} statements: no sequential scan of a big table"]
        for line in flagged:
            print(f"    SEQ SCAN: {line}")


async def one_by_one(side: Side, args: argparse.Namespace) -> None:
    """The rest, on one database: the reminder claim and sweep, /export, /link, /forget_me, retention."""
    print(f"\n== {side.label} database: the rest ({load_average()}) ==", flush=True)
    f, rig = side.f, side.rig
    await claim_figures(f, rig.core.pool)
    await export_figures(f, rig)
    await asyncio.sleep(args.pause)
    base = [await other_turn(rig) for _ in range(16)]
    f.add("other person's turn p50 (nothing else running)", p(base, 50))
    await link_figures(f, rig)
    await forget_figures(f, rig)
    await prune_figures(f, rig)


async def add_open_tasks(rig: Rig) -> None:
    """7001 gets 200 open tasks (made here in the empty database)."""
    pool = rig.core.pool
    account = await pool.fetchval(
        "SELECT account_id FROM users WHERE platform = 'telegram' AND platform_user_id = '7001'"
    )
    await pool.execute(
        "INSERT INTO tasks (user_id, chat_id, created_by, title, due_at, timezone, own_words)"
        " SELECT $1, NULL, $1, 'Open ' || g, now() + interval '1 hour' * g, 'UTC', true"
        " FROM generate_series(1, 200 - (SELECT count(*) FROM tasks WHERE user_id = $1 AND status = 'pending')) g",
        account,
    )


async def claim_figures(f: Figures, pool: Any) -> None:
    """10,000 reminders due now for one person: the claims (batches of REMINDER_BATCH) and the sweep's queries."""
    async with pool.acquire() as conn:
        account = await conn.fetchval(
            "INSERT INTO users (platform, platform_user_id, display_name) VALUES ('telegram', '8999999', 'Claims')"
            " ON CONFLICT (platform, platform_user_id) DO UPDATE SET display_name = 'Claims' RETURNING id"
        )
        chat = await conn.fetchval(
            "INSERT INTO chats (platform, platform_chat_id, kind) VALUES ('telegram', '8999999', 'private')"
            " ON CONFLICT (platform, platform_chat_id, thread_id) DO UPDATE SET title = '' RETURNING id"
        )
        await conn.execute(
            "INSERT INTO tasks (user_id, chat_id, created_by, title, due_at, timezone, own_words)"
            " SELECT $1, $2, $1, 'Due ' || g, now() - interval '1 second' * (g % 50), 'UTC', true"
            " FROM generate_series(1, $3) g",
            account,
            chat,
            CLAIM_DUE,
        )
        await conn.execute("ANALYZE tasks")
    now = await pool.fetchval("SELECT now()")
    batches: list[float] = []
    claimed = 0
    while True:
        t0 = time.monotonic()
        rows = await queries.claim(
            pool, "bench", now, batch=REMINDER_BATCH, late_after=timedelta(seconds=60),
            lease=timedelta(minutes=2), grace=timedelta(hours=24),
        )  # fmt: skip
        batches.append(ms_since(t0))
        claimed += len(rows)
        if len(rows) < REMINDER_BATCH:
            break
    f.add(f"reminder claim, per batch of {REMINDER_BATCH} (p50)", p(batches, 50), per_turn=True)
    f.add(f"reminder claim, all {CLAIM_DUE:,} due", sum(batches))
    assert claimed >= CLAIM_DUE, claimed
    grace, since = timedelta(hours=24), now - timedelta(hours=24) - REMINDER_STALE_OVERLAP - timedelta(seconds=30)
    sweep: dict[str, Callable[[], Awaitable[Any]]] = {
        "stale since the last sweep": lambda: queries.stale(pool, now, grace, REMINDER_BATCH, since),
        "expired": lambda: queries.expired(pool, now, grace, REMINDER_BATCH),
        "upcoming": lambda: queries.upcoming(pool, now, now + timedelta(minutes=10), 20000),
        "stale, hourly full pass": lambda: queries.stale(pool, now, grace, REMINDER_BATCH),
        "zones, hourly full pass": lambda: queries.replan_zones(pool, now, "UTC", None, REMINDER_BATCH),
    }
    for name, run in sweep.items():
        took = []
        for _ in range(5):
            t0 = time.monotonic()
            await run()
            took.append(ms_since(t0))
        f.add(f"reminder sweep: {name} query (p50 of 5)", p(took, 50))
    await pool.execute("DELETE FROM tasks WHERE user_id = $1", account)


async def export_figures(f: Figures, rig: Rig) -> None:
    """/export of 7001: its time, its file, the growth of the process's peak RSS, and (again) its Python memory peak."""
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    answer = await rig.core.command(inc("7001", "/export"), "export")
    took = ms_since(t0)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert isinstance(answer, FileAnswer)
    size = len(answer.data)
    del answer
    tracemalloc.start()
    answer = await rig.core.command(inc("7001", "/export"), "export")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del answer
    f.add("/export of the heavy account", took)
    f.add("/export: file size", size / 1e6, "MB")
    f.add("/export: Python memory peak (tracemalloc)", peak / 1e6, "MB")
    f.add("/export: peak RSS growth", (rss1 - rss0) / 1e3, "MB")


async def link_figures(f: Figures, rig: Rig) -> None:
    """/link: 7003 makes a code, 7002 sends it (7002's account merges into 7003's); OTHER's turns meanwhile."""
    text = await rig.core.command(inc("7003", "/link"), "link")
    code = re.search(r"\*\*([0-9A-Z]{4}-[0-9A-Z]{4})\*\*", str(text))
    assert code is not None, text
    took, others, answer = await while_running(rig, rig.core.command(inc("7002", f"/link {code[1]}"), "link", code[1]))
    assert "merged" in str(answer) or "linked" in str(answer).lower(), answer
    f.add("/link merging two heavy accounts", took)
    f.add("/link: other person's turns meanwhile, max", max(others))


async def forget_figures(f: Figures, rig: Rig) -> None:
    """/forget_me of 7004; OTHER's turns meanwhile."""
    took, others, gone = await while_running(rig, forget_account(rig.core.pool, "telegram", "7004"))
    assert gone is not None
    f.add("/forget_me of a heavy account", took)
    f.add("/forget_me: other person's turns meanwhile, max", max(others))
    f.notes.append(f"/forget_me deleted {gone.messages:,} messages, {gone.tasks} tasks, {gone.archival} notes")


async def prune_figures(f: Figures, rig: Rig) -> None:
    """Retention: a whole pass over ended occurrences older than 90 days and over handled updates older than two days,
    batch by batch as the prunes run them (each batch one statement: how long its locks are held; the bot's prunes
    run RETENTION_ROUNDS of them every RETENTION_EVERY_S); OTHER's turns meanwhile."""
    pool = rig.core.pool
    cutoff = await pool.fetchval("SELECT now()") - KEEP_OCCURRENCES
    cursor = retention.PruneCursor()

    async def occurrences() -> tuple[int, bool]:
        deleted = await retention._prune_occurrences(pool, cutoff, RETENTION_BATCH, 1, cursor)
        return deleted, cursor.after == retention._START

    async def updates() -> tuple[int, bool]:
        deleted = await forget_done(pool, INBOX_KEEP_DONE_S, INBOX_FORGET_BATCH)
        return deleted, deleted < INBOX_FORGET_BATCH

    for name, step in (("occurrences", occurrences), ("handled updates", updates)):

        async def run(step: Callable[[], Awaitable[tuple[int, bool]]] = step) -> tuple[list[float], int]:
            took, total = [], 0
            while True:
                t0 = time.monotonic()
                deleted, done = await step()
                took.append(ms_since(t0))
                total += deleted
                if done:
                    return took, total

        wall, others, (batches, total) = await while_running(rig, run())
        f.add(f"prune {name}: the whole pass", wall)
        f.add(f"prune {name}: one batch p50", p(batches, 50))
        f.add(f"prune {name}: one batch max (locks held)", max(batches))
        f.add(f"prune {name}: other person's turns meanwhile, max", max(others))
        f.notes.append(f"pruned {total:,} {name} in {len(batches):,} batches")


# ---------------------------------------------------------------- the run


def table(empty: Figures, full: Figures) -> list[str]:
    """The figures side by side with their ratio (the 1.2× goal on per-turn ones)."""
    lines = [f"  {'':58} {'empty':>10} {'full':>10} {'ratio':>7}"]
    for name, (full_v, unit, per_turn) in full.values.items():
        empty_v = empty.values.get(name, (float("nan"), unit, per_turn))[0]
        ratio = full_v / empty_v if empty_v else float("nan")
        goal = ("  ok" if ratio <= GOAL_RATIO else "  MISSED") if per_turn else ""
        lines.append(f"  {name:<58} {empty_v:10.2f} {full_v:10.2f} {ratio:6.2f}×{goal}  {unit}")
    return lines


async def bench(args: argparse.Namespace) -> int:
    """Fill (or reuse) the template, copy it, migrate both databases, measure both, print the table."""
    sizes = Sizes.at(args.scale)
    keep = Path(args.keep).resolve() if args.keep else None
    root = keep or Path(tempfile.mkdtemp(prefix="bench-bigdb-", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free / 1e9
    print(f"PostgreSQL data in {root / 'pg'} ({'kept' if keep else 'deleted afterwards'}); {free:.0f} GB free")
    server = await asyncio.to_thread(start_embedded, root, delete_on_stop=False)
    status = 0
    try:
        admin = await asyncpg.connect(server.uri)
        try:
            await admin.execute("ALTER SYSTEM SET max_wal_size = '8GB'")
            await admin.execute("SELECT pg_reload_conf()")
            name = await template(admin, server.uri, sizes, f"telegram:{bot_id(TOKEN)}")
            copy_s = await recreate(admin, "bigdb_full", name)
            await recreate(admin, "bigdb_empty")
        finally:
            await admin.close()
        print(f"  copied the template in {copy_s:.0f} s")
        empty = await _prepare(dsn_of(server.uri, "bigdb_empty"), "empty", "e-")
        t0 = time.monotonic()
        full = await _prepare(dsn_of(server.uri, "bigdb_full"), "full", "f-")
        print(f"  migrated the copy in {time.monotonic() - t0:.1f} s (migrations added since the fill)")
        conn = await asyncpg.connect(full.dsn)
        try:
            await conn.execute("CHECKPOINT")  # the copy's writes out of the way of the measurements
        finally:
            await conn.close()
        print(f"  {full.describe()}")
        print(f"  full: {await table_sizes(full.dsn)}")
        print(f"  {load_average()}")
        async with (
            FakeLLMProcess(0.0) as llm,
            make_rig(empty, llm, 1) as empty_rig,
            make_rig(full, llm, 2) as full_rig,
        ):
            sides = [Side("empty", empty, empty_rig), Side("full", full, full_rig)]
            await per_turn(sides, args)
            for side in sides:
                await one_by_one(side, args)
        figures = {side.label: side.f for side in sides}
        print(f"\n== side by side (goal: per-turn figures within {GOAL_RATIO}× of the empty database's) ==")
        lines = table(figures["empty"], figures["full"])
        print("\n".join(lines))
        for label, fig in figures.items():
            for note in fig.notes:
                print(f"  {label}: {note}")
        status = int(any("MISSED" in line for line in lines) or any("Seq Scan" in n for n in figures["full"].notes))
    finally:
        await asyncio.to_thread(server.stop)
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when a goal is missed."""
    ap = parser("big_db", __doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="the fill's size against the issue's (1.0)")
    ap.add_argument("--keep", metavar="DIR", help="keep the server and the filled template in DIR (reused next time)")
    ap.add_argument("--turns", type=int, default=300, help="measured private turns per database (300)")
    ap.add_argument("--group-turns", type=int, default=120, help="group turns per database (120)")
    ap.add_argument("--warmup", type=int, default=30, help="warm-up turns (30)")
    ap.add_argument("--pause", type=float, default=0.5, help="seconds of pause after each burst of 8 turns (0.5)")
    ap.add_argument("--verbose", action="store_true", help="print the plans of a turn's statements")
    args = ap.parse_args(argv)
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
