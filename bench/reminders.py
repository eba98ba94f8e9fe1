"""Reminders at scale, on the real clock (about two minutes), with scheduler processes each wired as in production
(create_pool defaults, ReminderEngine defaults, ReminderScheduler with its 30 s sweep) and a fake outbox that
records what it receives. Part 1: 10,000 one-shot reminders due within one minute, two processes (goals: every one
delivered exactly once, lateness p99 <= 1 s). Part 2: start-up of one fresh process with 100,000 reminders pending
over 30 days (goals: <= 5 s to a started scheduler, RSS <= 150 MB). Part 3: part 1 again with every send failing for
the middle 30 s (goals: 0 lost, 0 duplicated; the figure in docs/architecture.md: the ones held up arrive p50 ~8 s /
p99 ~20 s after the outage ends, the retry backoff). `python -m bench.reminders --worker` is one scheduler process
(its DSN in BENCH_REMINDERS_DSN): one JSON line once started, then it runs until its standard input ends, writes
what it received to `--out` and prints a second JSON line. PostgreSQL: DATABASE_URL (a scratch database on it) or an
embedded server.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import logging
import os
import resource
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from bench.common import (
    REPO_ROOT,
    BenchDatabase,
    bench_database,
    goal_line,
    parse,
    parser,
    percentile,
    quiet_logging,
    spread,
)
from core.reminders.engine import ReminderEngine
from core.reminders.scheduler import ReminderScheduler
from core.storage.db import create_pool
from core.timeutil import system_clock

GOAL_P99_S = 1.0
GOAL_START_S = 5.0
GOAL_RSS_MB = 150.0
DSN_ENV = "BENCH_REMINDERS_DSN"

_INSERT_SQL = """
INSERT INTO tasks (user_id, chat_id, title, due_at, timezone)
SELECT $1, $2, 'bench ' || i, $3::timestamptz + make_interval(secs => i * $4::float8), 'UTC'
FROM generate_series(0, $5 - 1) AS i
"""
_UNDELIVERED_SQL = """
SELECT count(*) FROM tasks t WHERE t.user_id = $1
AND NOT EXISTS (SELECT 1 FROM occurrences o WHERE o.task_id = t.id AND o.status = 'delivered')
"""
_STATUS_SQL = """
SELECT o.status, count(*) AS n, max(o.attempts) AS attempts FROM occurrences o JOIN tasks t ON t.id = o.task_id
WHERE t.user_id = $1 GROUP BY o.status
"""


# ---------------------------------------------------------------- the worker (one scheduler process)


class RecordingOutbox:
    """A platform that takes every reminder at once and notes when it arrived; during an outage (epoch seconds
    [start, end)) it raises a transient error instead, as a network failure would."""

    def __init__(self, outage: tuple[float, float] | None = None) -> None:
        """Start with nothing received."""
        self.records: list[tuple[int, float, float]] = []  # (task id, scheduled_at, received), epoch seconds
        self.outage = outage
        self.failed = 0

    async def send_reminder(self, msg: Any) -> str | None:
        """Record the reminder (its message id is the record's index), or fail during the outage."""
        now = time.time()
        if self.outage is not None and self.outage[0] <= now < self.outage[1]:
            self.failed += 1
            raise ConnectionError("platform unreachable (bench outage)")
        self.records.append((msg.task_id, msg.scheduled_at.timestamp(), now))
        return str(len(self.records))


async def worker(args: argparse.Namespace) -> int:
    """One scheduler process: start, report, run until stdin ends, stop, write the records."""
    t_imports = time.time()
    pool = await create_pool(os.environ[DSN_ENV])
    t_pool = time.time()
    outbox = RecordingOutbox((args.outage_start, args.outage_end) if args.outage_end else None)
    engine = ReminderEngine(pool, {"telegram": outbox}, system_clock)
    sched = ReminderScheduler(engine, sweep_s=args.sweep)
    await sched.start()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    ready = {"imports_done": t_imports, "pool": t_pool, "started": time.time(), "rss_mb": rss_mb}
    print(json.dumps(ready), flush=True)
    await asyncio.to_thread(sys.stdin.buffer.read)  # until the parent closes our stdin
    await sched.stop()
    await pool.close()
    if args.out:
        Path(args.out).write_text(json.dumps(outbox.records))
    print(json.dumps({"received": len(outbox.records), "send_failures": outbox.failed}), flush=True)
    return 0


# ---------------------------------------------------------------- the parent


@dataclass
class Worker:
    """A running scheduler process as the parent sees it."""

    proc: asyncio.subprocess.Process
    spawned: float  # time.time() just before the exec
    out: Path | None
    ready: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)

    def records(self) -> list[tuple[int, float, float]]:
        """What its outbox received."""
        if self.out is None or not self.out.exists():
            return []
        return [(int(a), float(b), float(c)) for a, b, c in json.loads(self.out.read_text())]


async def spawn(dsn: str, *, out: Path | None, sweep: float, extra: Sequence[str] = ()) -> Worker:
    """Start `python -m bench.reminders --worker` (the same interpreter, no uv in between) and wait until it started."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "bench.reminders", "--worker", "--sweep", repr(sweep), *extra]
    cmd += ["--out", str(out)] if out is not None else []
    spawned = time.time()
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=str(REPO_ROOT),
        env={**os.environ, "PYTHONPATH": path, DSN_ENV: dsn},
    )
    w = Worker(proc, spawned, out)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if not line:
        raise RuntimeError(f"worker {proc.pid} exited before its scheduler started (status {await proc.wait()})")
    w.ready = json.loads(line)
    return w


async def finish(workers: Sequence[Worker], timeout: float = 60.0) -> None:
    """Close each worker's stdin (it stops), read its counters and wait for it to exit; kill what lingers."""
    for w in workers:
        assert w.proc.stdin is not None and w.proc.stdout is not None
        w.proc.stdin.close()
        with suppress(TimeoutError):
            line = await asyncio.wait_for(w.proc.stdout.readline(), timeout)
            w.final = json.loads(line) if line else {}
            await asyncio.wait_for(w.proc.wait(), timeout)
        if w.proc.returncode is None:
            with suppress(ProcessLookupError):
                w.proc.kill()
            await w.proc.wait()


async def owner(db: BenchDatabase, name: str) -> tuple[int, int]:
    """A Telegram user and their private chat (the bench's earlier users and their tasks deleted first)."""
    conn = await asyncpg.connect(db.dsn)
    try:
        await conn.execute(
            "DELETE FROM accounts WHERE id IN (SELECT account_id FROM users WHERE platform_user_id LIKE $1)",
            f"{db.tag}%",
        )
        user_id = await conn.fetchval(
            "INSERT INTO users (platform, platform_user_id, display_name) VALUES ('telegram', $1, $2) RETURNING id",
            f"{db.tag}{name}",
            f"Bench {name}",
        )
        chat_id = await conn.fetchval(
            "INSERT INTO chats (platform, platform_chat_id, kind) VALUES ('telegram', $1, 'private') RETURNING id",
            f"{db.tag}{name}",
        )
        return int(user_id), int(chat_id)
    finally:
        await conn.close()


async def add_tasks(db: BenchDatabase, user_chat: tuple[int, int], first: datetime, step_s: float, n: int) -> None:
    """`n` one-shot reminders due every `step_s` from `first`."""
    conn = await asyncpg.connect(db.dsn)
    try:
        await conn.execute(_INSERT_SQL, *user_chat, first, step_s, n)
        await conn.execute("ANALYZE tasks")
    finally:
        await conn.close()


@dataclass
class DueRun:
    """What a run of due reminders left: the stopped workers, what their outboxes received, the outage's end."""

    workers: list[Worker]
    records: list[tuple[int, float, float]]
    outage_end: float


async def run_due(db: BenchDatabase, args: argparse.Namespace, name: str, outage_s: float = 0.0) -> DueRun:
    """`--reminders` due within `--spread` s from `--lead` s on (sends failing for `outage_s` in the middle),
    `--workers` processes until every one was delivered (or the longest retry backoff passed), then `--tail` s more for
    a late duplicate."""
    user_chat = await owner(db, name)
    base = datetime.now(UTC) + timedelta(seconds=args.lead)
    await add_tasks(db, user_chat, base, args.spread / args.reminders, args.reminders)
    down = base.timestamp() + (args.spread - outage_s) / 2
    extra = ["--outage-start", repr(down), "--outage-end", repr(down + outage_s)] if outage_s else []
    workers: list[Worker] = []
    with tempfile.TemporaryDirectory(prefix="bench-reminders-") as tmp:
        try:
            for i in range(args.workers):
                workers.append(await spawn(db.dsn, out=Path(tmp) / f"w{i}.json", sweep=args.sweep, extra=extra))
            await asyncio.sleep(max(0.0, base.timestamp() + args.spread - time.time()))
            conn = await asyncpg.connect(db.dsn)
            try:
                deadline = time.time() + 330  # the longest backoff (5 min) and then some
                while time.time() < deadline:
                    if not await conn.fetchval(_UNDELIVERED_SQL, user_chat[0]):
                        break
                    await asyncio.sleep(0.5)
                await asyncio.sleep(args.tail)
                statuses = await conn.fetch(_STATUS_SQL, user_chat[0])
            finally:
                await conn.close()
        finally:
            await finish(workers)
        per_worker = [w.records() for w in workers]
    in_db = ", ".join(f"{r['status']} {r['n']} (most attempts {r['attempts']})" for r in statuses)
    print(f"  in the database: {in_db or 'nothing'}")
    print(f"  received per process: {' + '.join(str(len(r)) for r in per_worker)}")
    return DueRun(workers, [r for records in per_worker for r in records], down + outage_s)


def exactly_once(records: Sequence[tuple[int, float, float]], n: int) -> bool:
    """Print and judge lost and duplicated deliveries."""
    counts = Counter(task_id for task_id, _, _ in records)
    lost, duplicated = n - len(counts), sum(c - 1 for c in counts.values())
    ok = lost == 0 and duplicated == 0
    verdict = "ok" if ok else "MISSED"
    print(f"  delivered {len(records)}: lost {lost}, duplicated {duplicated}   goal 0 and 0   {verdict}")
    return ok


async def part_burst(db: BenchDatabase, args: argparse.Namespace) -> int:
    """Part 1: reminders due within one minute, several scheduler processes on the real clock."""
    print(f"== 1. {args.reminders} reminders due within {args.spread:g} s, {args.workers} scheduler processes ==")
    records = (await run_due(db, args, "burst")).records
    late = sorted(received - due for _, due, received in records)
    print(f"  lateness (received - due), seconds: {spread(late).replace(' ms', ' s')}")
    print(f"  [HEADLINE] lateness {goal_line('p99', percentile(late, 99), GOAL_P99_S, 's')}")
    ok = exactly_once(records, args.reminders)
    print()
    return int(not ok or not percentile(late, 99) <= GOAL_P99_S)


async def part_startup(db: BenchDatabase, args: argparse.Namespace) -> int:
    """Part 2: start-up of one fresh scheduler process with many reminders pending over the next days."""
    n = args.pending
    print(f"== 2. Start-up with {n} pending reminders over the next {args.days:g} days: one fresh process ==")
    user_chat = await owner(db, "pending")
    await add_tasks(db, user_chat, datetime.now(UTC) + timedelta(minutes=5), args.days * 86400 / n, n)
    w = await spawn(db.dsn, out=None, sweep=args.sweep)
    await finish([w])
    r = w.ready
    took = r["started"] - w.spawned
    print(f"  [HEADLINE] start-up (launch → scheduler started) {goal_line('', took, GOAL_START_S, 's')}")
    print(f"             peak RSS after start {goal_line('', r['rss_mb'], GOAL_RSS_MB, 'MB')}")
    print(
        f"    of which interpreter + imports {r['imports_done'] - w.spawned:.2f} s, create_pool "
        f"{r['pool'] - r['imports_done']:.2f} s, start() (catch-up sweep + planning) {r['started'] - r['pool']:.2f} s"
    )
    print()
    return int(took > GOAL_START_S or r["rss_mb"] > GOAL_RSS_MB)


async def part_outage(db: BenchDatabase, args: argparse.Namespace) -> int:
    """Part 3: part 1's reminders with the platform unreachable for the middle `--outage` seconds."""
    print(
        f"== 3. {args.reminders} reminders due within {args.spread:g} s, {args.workers} scheduler processes, every "
        f"send failing (ConnectionError) for {args.outage:g} s in the middle =="
    )
    run = await run_due(db, args, "outage", args.outage)
    records, up = run.records, run.outage_end
    print(f"  send attempts that failed: {sum(int(w.final.get('send_failures', 0)) for w in run.workers)} (retried)")
    ok = exactly_once(records, args.reminders)
    held = sorted((received - up) * 1000 for _, due, received in records if due < up <= received)
    print(f"  [HEADLINE] held up by the outage, received after its end: {spread(held)}")
    on_time = sorted((received - due) * 1000 for _, due, received in records if due >= up)
    print(f"  due after the outage, received after due:             {spread(on_time)}")
    print()
    return int(not ok)


async def bench(args: argparse.Namespace) -> int:
    """Run the selected parts; 1 when a goal is missed."""
    status = 0
    async with bench_database() as db:
        print()
        if not args.skip_burst:
            status |= await part_burst(db, args)
        if not args.skip_startup:
            status |= await part_startup(db, args)
        if not args.skip_outage:
            status |= await part_outage(db, args)
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the benchmark (or one worker); exit status 1 when a goal is missed."""
    p = parser("reminders", __doc__)
    p.add_argument("--reminders", type=int, default=10_000, help="reminders due within the spread (10000)")
    p.add_argument("--spread", type=float, default=60.0, help="seconds they are spread over (60)")
    p.add_argument("--lead", type=float, default=25.0, help="seconds from launch to the first due time (25)")
    p.add_argument("--workers", type=int, default=2, help="scheduler processes in parts 1 and 3 (2)")
    p.add_argument("--tail", type=float, default=3.0, help="seconds to wait after all were delivered (3)")
    p.add_argument("--pending", type=int, default=100_000, help="pending reminders in part 2 (100000)")
    p.add_argument("--days", type=float, default=30.0, help="days they are spread over (30)")
    p.add_argument("--sweep", type=float, default=30.0, help="the scheduler's sweep interval, seconds (30)")
    p.add_argument("--outage", type=float, default=30.0, help="part 3: seconds the sends fail (30)")
    p.add_argument("--skip-burst", action="store_true", help="skip part 1")
    p.add_argument("--skip-startup", action="store_true", help="skip part 2")
    p.add_argument("--skip-outage", action="store_true", help="skip part 3")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--outage-start", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--outage-end", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    quick = {"reminders": 500, "spread": 10.0, "lead": 8.0, "pending": 5000, "outage": 4.0, "tail": 1.0}
    args = parse(p, argv, quick)
    quiet_logging()
    if args.worker:  # cancelled lock waiters at stop() log tracebacks
        logging.getLogger("apscheduler").setLevel(logging.CRITICAL)
        return asyncio.run(worker(args))
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
