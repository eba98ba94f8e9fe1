"""The Telegram inbox as a job queue: procrastinate, PgQueuer and the bot's hand-written inbox (core.inbox on the inbox
table) get the same fake updates and a handler that records when it starts and ends, one worker each in this process
(`--concurrency` jobs at a time, a pool of `--pool` connections). 1. Latency: 1,000 updates over 500 chats at a
steady 100/s: the enqueue (the webhook's 200 waits for it) and enqueue → handler start, p50 and p99. 2. Burst: 3,000
updates, 3 per chat over 1,000 chats, the handler taking `--work-ms`: wall time, updates/s, lost and duplicated
runs, and chats run out of order or overlapping. 3. Dedupe: one update enqueued twice while queued, while running
and after it ran. 4. Crash: a child worker takes message 1 of a chat (message 2 queued behind it), hangs and is
SIGKILLed; a fresh worker (2 s heartbeat/lease) must run 1 again and then 2. The goal, for the choice of queue in
docs/architecture.md: no loss, no duplicate in any of these, one update per chat at a time in order, and a killed
worker's update redone within its lease. Run with `uv run --with procrastinate --with pgqueuer python
bench/inbox_queues.py` (about 70 s); a queue whose library is not installed is skipped. PostgreSQL: DATABASE_URL (a
scratch database on it) or an embedded server. `python bench/inbox_queues.py --crash-worker NAME --dsn DSN` is the
child of part 4.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import itertools
import json
import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg

from bench.common import bench_database, parse, parser, percentile, quiet_logging
from core.inbox import Delivery, Inbox
from core.metrics import Metrics
from core.storage.db import create_pool

LATENCY_RATE = 100.0  # messages per second (procrastinate's backlog grew at 250/s on 2 loaded cores)
LATENCY_PER_CHAT = 2  # each chat gets two messages, chats / 100 s apart
BURST_PER_CHAT = 3
BURST_SENDERS = 20  # chats enqueued side by side in the burst
DONE_TIMEOUT_S = 60.0  # a phase gives up waiting for its handlers after this
CRASH_WAIT_S = 20.0  # part 4 gives up waiting for the re-run after this
CRASH_TIMEOUT_S = 2.0  # heartbeat timeout / lease used in part 4 (both sides)
CRASH_WORK_S = 0.05  # handler time in part 4, so that message 2 running alongside the re-run would show
CRASH_TICK_S = 0.5  # heartbeat, lease renewal, polling and stalled-job sweep interval in part 4
UPDATE_TEXT = "x" * 200  # the message text inside each fake update
PLATFORM = "telegram"

_update_ids = itertools.count(int(time.time()) * 1000)  # unique across runs on a shared DATABASE_URL


@dataclass(frozen=True)
class Message:
    """One fake Telegram update."""

    key: int  # update_id
    chat: str
    seq: int  # position within its chat

    def payload(self) -> dict[str, Any]:
        """The update as it would be stored."""
        return {"update_id": self.key, "message": {"chat": {"id": self.chat}, "seq": self.seq, "text": UPDATE_TEXT}}


def new_messages(chats: int, per_chat: int, tag: str) -> list[list[Message]]:
    """Per chat, its messages in order (fresh update ids)."""
    return [[Message(next(_update_ids), f"{tag}-{c}", s) for s in range(per_chat)] for c in range(chats)]


# ---------------------------------------------------------------- what the handler saw


@dataclass
class Run:
    """One handler run."""

    msg: Message
    start: float
    end: float = float("nan")


@dataclass
class Recorder:
    """The handler every queue calls: records runs, waits `work_s`, or holds chosen keys until released."""

    work_s: float = 0.0
    runs: list[Run] = field(default_factory=list)
    sent_at: dict[int, float] = field(default_factory=dict)  # key -> time its enqueue started
    held: dict[int, asyncio.Event] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, key: int, chat: str, seq: int) -> None:
        """Run one message."""
        run = Run(Message(key, chat, seq), time.monotonic())
        self.runs.append(run)
        self.changed.set()
        try:
            if key in self.held:
                await self.held[key].wait()
            elif self.work_s:
                await asyncio.sleep(self.work_s)
        finally:
            run.end = time.monotonic()
            self.changed.set()

    def count(self, key: int) -> int:
        """How many runs `key` had."""
        return sum(1 for r in self.runs if r.msg.key == key)

    async def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until `done()` holds after some run started or ended; False on timeout."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return True


Handler = Callable[[int, str, int], Awaitable[None]]


# ---------------------------------------------------------------- procrastinate


class Procrastinate:
    """procrastinate: one task, `lock` = chat (one job per chat at a time, in order), `queueing_lock` = update_id."""

    name = "procrastinate"

    def __init__(self, dsn: str, pool_size: int, poll_s: float | None = None) -> None:
        """Build the app on psycopg 3 (procrastinate has no asyncpg connector); `poll_s` overrides its 5 s poll."""
        self.lib: Any = importlib.import_module("procrastinate")
        self.version = importlib.metadata.version("procrastinate")
        self.app: Any = self.lib.App(
            connector=self.lib.PsycopgConnector(conninfo=dsn, min_size=pool_size, max_size=pool_size)
        )
        self.poll_s = poll_s
        self.handler: Handler | None = None
        self.task: Any = None
        self.worker: asyncio.Task[None] | None = None
        self.sweeper: asyncio.Task[None] | None = None

    async def open(self, install: bool) -> None:
        """Open the pool; install the schema (tables, functions, triggers) when asked."""
        await self.app.open_async()
        if install:
            await self.app.schema_manager.apply_schema_async()

        async def inbox(key: int, chat: str, seq: int, update: dict[str, Any]) -> None:
            assert self.handler is not None
            await self.handler(key, chat, seq)

        self.task = self.app.task(name="inbox")(inbox)

    async def enqueue(self, msg: Message) -> bool:
        """Defer with lock=chat and queueing_lock=update_id; AlreadyEnqueued means a duplicate."""
        deferrer = self.task.configure(lock=msg.chat, queueing_lock=f"{PLATFORM}:{msg.key}")
        try:
            await deferrer.defer_async(key=msg.key, chat=msg.chat, seq=msg.seq, update=msg.payload())
        except self.lib.exceptions.AlreadyEnqueued:
            return False
        return True

    async def start(self, handler: Handler, concurrency: int, *, fast_recovery: bool = False) -> None:
        """run_worker_async with library defaults (fetch polling 5 s, heartbeat 10 s) unless fast_recovery."""
        self.handler = handler
        options: dict[str, Any] = {"concurrency": concurrency, "install_signal_handlers": False}
        if self.poll_s is not None:
            options["fetch_job_polling_interval"] = self.poll_s
        if fast_recovery:
            options |= {"update_heartbeat_interval": CRASH_TICK_S, "fetch_job_polling_interval": CRASH_TICK_S}
            self.sweeper = asyncio.create_task(self._retry_stalled())
        self.worker = asyncio.create_task(self.app.run_worker_async(**options))

    async def _retry_stalled(self) -> None:
        """The docs' "retry stalled jobs" recipe as a loop: nothing in the worker retries a killed worker's jobs."""
        while True:
            await asyncio.sleep(CRASH_TICK_S)
            for job in await self.app.job_manager.get_stalled_jobs(seconds_since_heartbeat=CRASH_TIMEOUT_S):
                await self.app.job_manager.retry_job(job)

    async def stop(self) -> None:
        """Cancelling run_worker_async stops it gracefully (running jobs finish)."""
        for task in (self.sweeper, self.worker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.sweeper = self.worker = None

    async def open_jobs(self) -> int:
        """Jobs in todo or doing."""
        row = await self.app.connector.execute_query_one_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
        )
        return int(row["n"])

    async def close(self) -> None:
        """Close the pool."""
        await self.app.close_async()


# ---------------------------------------------------------------- PgQueuer


class PgQueuer:
    """PgQueuer on an asyncpg pool: one entrypoint, dedupe_key = update_id; no per-chat serialisation exists."""

    name = "pgqueuer"

    def __init__(self, pool: asyncpg.Pool) -> None:
        """Use `pool` (the bot's own create_pool when it works with it)."""
        self.lib: Any = importlib.import_module("pgqueuer")
        self.version = importlib.metadata.version("pgqueuer")
        self.pool = pool
        self.queries: Any = self.lib.Queries(self.lib.AsyncpgPoolDriver(pool))
        self.qm: Any = None
        self.worker: asyncio.Task[None] | None = None

    async def open(self, install: bool) -> None:
        """Install the schema (tables, enum, trigger, function) when asked."""
        if install:
            await self.queries.install()

    async def enqueue(self, msg: Message) -> bool:
        """enqueue(..., dedupe_key, on_conflict="skip"): None in the result means a duplicate."""
        body = json.dumps({"key": msg.key, "chat": msg.chat, "seq": msg.seq, "update": msg.payload()}).encode()
        ids = await self.queries.enqueue("inbox", body, dedupe_key=f"{PLATFORM}:{msg.key}", on_conflict="skip")
        return ids[0] is not None

    async def start(self, handler: Handler, concurrency: int, *, fast_recovery: bool = False) -> None:
        """QueueManager.run with library defaults (dequeue_timeout 30 s, heartbeat_timeout 30 s) unless fast."""
        self.qm = self.lib.QueueManager(self.lib.Queries(self.lib.AsyncpgPoolDriver(self.pool)))

        async def inbox(job: Any) -> None:
            body = json.loads(job.payload)
            await handler(body["key"], body["chat"], body["seq"])

        self.qm.entrypoint("inbox")(inbox)
        options: dict[str, Any] = {"max_concurrent_tasks": concurrency, "batch_size": max(1, concurrency // 2)}
        if fast_recovery:
            options |= {
                "heartbeat_timeout": timedelta(seconds=CRASH_TIMEOUT_S),
                "dequeue_timeout": timedelta(seconds=CRASH_TICK_S),
            }
        self.worker = asyncio.create_task(self.qm.run(**options))

    async def stop(self) -> None:
        """Set the manager's shutdown event; run() returns once its tasks are done."""
        if self.qm is not None and self.worker is not None:
            self.qm.shutdown.set()
            await self.worker
        self.qm = self.worker = None

    async def open_jobs(self) -> int:
        """Rows still in the queue table (finished ones are deleted)."""
        return int(await self.pool.fetchval("SELECT count(*) FROM pgqueuer WHERE status IN ('queued', 'picked')"))

    async def close(self) -> None:
        """The pool belongs to the caller."""


# ---------------------------------------------------------------- the hand-written inbox (core.inbox)


class HandWritten:
    """The bot's own inbox, core.inbox.Inbox on the inbox table: an update is stored once (by update_id, also after it
    ran), runs one at a time per chat in order, under a lease renewed while it runs; stored updates wake the worker."""

    name = "hand-written"
    version = "core.inbox (working tree)"

    def __init__(self, pool: asyncpg.Pool) -> None:
        """Use the bot's pool; a fresh Inbox (not serving) takes the enqueues until start()."""
        self.pool = pool
        self.owner = f"bench-{os.getpid()}"
        self.box = Inbox(pool, self.owner, Metrics())

    async def open(self, install: bool) -> None:
        """The table comes with the bot's migrations."""

    async def enqueue(self, msg: Message) -> bool:
        """Inbox.receive(): False for an update stored before."""
        return await self.box.receive(PLATFORM, msg.key, msg.chat, msg.payload(), None)

    async def start(self, handler: Handler, concurrency: int, *, fast_recovery: bool = False) -> None:
        """serve() the platform with `concurrency` updates at a time (part 4: a 2 s lease, polling every 0.5 s)."""
        fast = {"lease_s": CRASH_TIMEOUT_S, "poll_s": CRASH_TICK_S} if fast_recovery else {}
        self.box = Inbox(self.pool, self.owner, Metrics(), concurrency=concurrency, **fast)

        async def run(delivery: Delivery) -> None:
            update = delivery.update
            await handler(update["update_id"], update["message"]["chat"]["id"], update["message"]["seq"])

        self.box.serve(PLATFORM, lambda payload: payload, run)

    async def stop(self) -> None:
        """stop() with a grace long enough for every running handler."""
        await self.box.stop(DONE_TIMEOUT_S)
        self.box = Inbox(self.pool, self.owner, Metrics())

    async def open_jobs(self) -> int:
        """Updates not marked done."""
        return int(await self.pool.fetchval("SELECT count(*) FROM inbox WHERE done_at IS NULL"))

    async def close(self) -> None:
        """The pool belongs to the caller."""


Queue = Procrastinate | PgQueuer | HandWritten  # each: enqueue, start a worker, stop it, count open jobs, close


# ---------------------------------------------------------------- the parts


async def enqueue_timed(queue: Queue, rec: Recorder, msg: Message, put_s: list[float]) -> None:
    """Enqueue one message, noting when it started and how long the enqueue took."""
    t0 = time.monotonic()
    rec.sent_at[msg.key] = t0
    await queue.enqueue(msg)
    put_s.append(time.monotonic() - t0)


async def wait_all_ran(queue: Queue, rec: Recorder, keys: set[int], *, drained: bool = True) -> bool:
    """Wait until every key ran to its end and (when `drained`) the queue holds no open job."""

    def done() -> bool:
        ended = {r.msg.key for r in rec.runs if r.end == r.end}  # NaN != NaN: still running
        return keys <= ended

    ok = await rec.wait_until(done, DONE_TIMEOUT_S)
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while ok and drained and time.monotonic() < deadline:
        if not await queue.open_jobs():
            break
        await asyncio.sleep(0.01)  # the queue's own bookkeeping may trail the handler's end
    return ok


@dataclass
class Latency:
    """Part 1's figures (seconds)."""

    put_p50: float
    put_p99: float
    p50: float
    p99: float
    max: float


async def part_latency(queue: Queue, concurrency: int, chats: int) -> Latency:
    """Steady low rate, handler returns at once: enqueue start -> handler start."""
    rec = Recorder()
    await queue.start(rec.handle, concurrency)
    msgs = [m for chat in new_messages(chats, LATENCY_PER_CHAT, "lat") for m in chat]
    msgs.sort(key=lambda m: (m.seq, m.chat))  # a chat's next message comes 5 s after its previous one
    put_s: list[float] = []
    t0 = time.monotonic()
    tasks = []
    for i, msg in enumerate(msgs):
        await asyncio.sleep(max(0.0, t0 + i / LATENCY_RATE - time.monotonic()))
        tasks.append(asyncio.create_task(enqueue_timed(queue, rec, msg, put_s)))
    await asyncio.gather(*tasks)
    await wait_all_ran(queue, rec, {m.key for m in msgs})
    await queue.stop()
    first: dict[int, float] = {}
    for r in rec.runs:
        first.setdefault(r.msg.key, r.start)
    lat = sorted(first[k] - rec.sent_at[k] for k in first)
    puts = sorted(put_s)
    return Latency(percentile(puts, 50), percentile(puts, 99), percentile(lat, 50), percentile(lat, 99), lat[-1])


@dataclass
class Burst:
    """Part 2's figures."""

    wall_s: float
    per_s: float
    lost: int
    duplicated: int
    out_of_order: int  # chats whose message n+1 started before message n
    overlapped: int  # chats whose message n+1 started before message n ended
    p99_s: float  # enqueue -> handler start


async def part_burst(queue: Queue, concurrency: int, work_s: float, n: int) -> Burst:
    """3,000 messages over 1,000 chats at once, handler takes `work_s`."""
    rec = Recorder(work_s=work_s)
    await queue.start(rec.handle, concurrency)
    chats = new_messages(n, BURST_PER_CHAT, "burst")
    gate = asyncio.Semaphore(BURST_SENDERS)
    put_s: list[float] = []

    async def send_chat(chat: list[Message]) -> None:
        async with gate:
            for msg in chat:
                await enqueue_timed(queue, rec, msg, put_s)

    t0 = time.monotonic()
    await asyncio.gather(*(send_chat(c) for c in chats))
    keys = {m.key for c in chats for m in c}
    await wait_all_ran(queue, rec, keys)
    await queue.stop()
    wall = max(r.end for r in rec.runs) - t0
    counts: dict[int, int] = defaultdict(int)
    for r in rec.runs:
        counts[r.msg.key] += 1
    by_chat: dict[str, list[Run]] = defaultdict(list)
    for r in sorted(rec.runs, key=lambda r: r.start):
        by_chat[r.msg.chat].append(r)
    out_of_order = sum(1 for runs in by_chat.values() if [r.msg.seq for r in runs] != sorted(r.msg.seq for r in runs))
    overlapped = sum(1 for runs in by_chat.values() if any(b.start < a.end for a, b in itertools.pairwise(runs)))
    first: dict[int, float] = {}
    for r in rec.runs:
        first.setdefault(r.msg.key, r.start)
    lat = sorted(first[k] - rec.sent_at[k] for k in first)
    return Burst(
        wall,
        len(keys) / wall,
        len(keys - set(counts)),
        sum(n - 1 for n in counts.values()),
        out_of_order,
        overlapped,
        percentile(lat, 99),
    )


@dataclass
class Dedupe:
    """Part 3's figures: handler runs of one update sent twice in each situation."""

    while_queued: int
    while_running: int
    after_done: int
    refused: str  # which second enqueues the queue itself refused (q, r, d)


async def part_dedupe(queue: Queue, concurrency: int) -> Dedupe:
    """The same update twice: while queued, while running, after it ran."""
    rec = Recorder()
    queued, running, done = (m[0] for m in new_messages(3, 1, "dedupe"))
    refused = ""
    await queue.enqueue(queued)
    refused += "" if await queue.enqueue(queued) else "q"
    rec.held[running.key] = asyncio.Event()
    await queue.start(rec.handle, concurrency)
    await queue.enqueue(running)
    await queue.enqueue(done)
    await rec.wait_until(lambda: rec.count(running.key) >= 1 and rec.count(done.key) >= 1, DONE_TIMEOUT_S)
    await wait_all_ran(queue, rec, {queued.key, done.key}, drained=False)
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while time.monotonic() < deadline:  # until the queue closed their jobs: only the held one is left open
        if await queue.open_jobs() <= 1:
            break
        await asyncio.sleep(0.01)
    refused += "" if await queue.enqueue(running) else "r"
    refused += "" if await queue.enqueue(done) else "d"
    rec.held[running.key].set()
    await wait_all_ran(queue, rec, {queued.key, running.key, done.key})
    await queue.stop()
    return Dedupe(rec.count(queued.key), rec.count(running.key), rec.count(done.key), refused or "-")


@dataclass
class Crash:
    """Part 4's figures."""

    rerun_s: float | None  # SIGKILL -> message 1 starts again (None: not within CRASH_WAIT_S)
    second_after_first: bool | None  # message 2 started only after message 1's re-run ended
    note: str


async def part_crash(queue: Queue, dsn: str, concurrency: int) -> Crash:
    """A child worker takes message 1, hangs and is killed; this process's worker must redo 1, then 2."""
    first, second = new_messages(1, 2, "crash")[0]
    await queue.enqueue(first)
    await queue.enqueue(second)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve()),
        "--crash-worker",
        queue.name,
        "--dsn",
        dsn,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    started = set()
    first_started = asyncio.Event()

    async def read_started() -> None:
        while line := (await child.stdout.readline()).decode().split():  # type: ignore[union-attr]
            if line[0] == "STARTED":
                started.add(int(line[1]))
                if int(line[1]) == first.key:
                    first_started.set()

    reader = asyncio.create_task(read_started())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(first_started.wait(), CRASH_WAIT_S)
    await asyncio.sleep(CRASH_TICK_S)  # would it take message 2 of the chat as well?
    reader.cancel()
    child.send_signal(signal.SIGKILL)
    await child.wait()
    killed_at = time.monotonic()
    if first.key not in started:
        return Crash(None, None, "child never started message 1")
    note = "child took 1 and 2 together" if second.key in started else "child took 1 only"
    rec = Recorder(work_s=CRASH_WORK_S)
    await queue.start(rec.handle, concurrency, fast_recovery=True)
    ok = await rec.wait_until(lambda: rec.count(first.key) >= 1 and rec.count(second.key) >= 1, CRASH_WAIT_S)
    await rec.wait_until(lambda: all(r.end == r.end for r in rec.runs), CRASH_WAIT_S)
    await queue.stop()
    if not ok:
        return Crash(None, None, note + f"; not redone within {CRASH_WAIT_S:g} s")
    redo = next(r for r in rec.runs if r.msg.key == first.key)
    nxt = next(r for r in rec.runs if r.msg.key == second.key)
    return Crash(redo.start - killed_at, nxt.start >= redo.end, note)


# ---------------------------------------------------------------- wiring


async def build_queue(
    name: str, dsn: str, pool_size: int, install: bool, poll_s: float | None = None
) -> tuple[Queue, asyncpg.Pool | None]:
    """A queue by name with a pool of its own (the bot's create_pool for ours; PgQueuer's documented plain
    asyncpg pool), opened (schema installed when `install`)."""
    queue: Queue
    pool: asyncpg.Pool | None = None
    if name == "procrastinate":
        queue = Procrastinate(dsn, pool_size, poll_s)
    elif name == "pgqueuer":
        pool = await asyncpg.create_pool(dsn, min_size=pool_size, max_size=pool_size)
        assert pool is not None
        queue = PgQueuer(pool)
    else:
        pool = await create_pool(dsn, min_size=pool_size, max_size=pool_size)
        queue = HandWritten(pool)
    await queue.open(install)
    return queue, pool


async def crash_worker(name: str, dsn: str) -> None:
    """Child of part 4: a worker whose handler announces each message and then hangs until killed."""
    queue, _ = await build_queue(name, dsn, 4, install=False)

    async def hang(key: int, chat: str, seq: int) -> None:
        print(f"STARTED {key}", flush=True)
        await asyncio.Event().wait()

    await queue.start(hang, 10, fast_recovery=True)
    await asyncio.Event().wait()


def available(names: list[str]) -> tuple[list[str], list[str]]:
    """The queues that can run here, and why the others cannot."""
    modules = {"procrastinate": "procrastinate", "pgqueuer": "pgqueuer", "hand-written": "core.inbox"}
    ok, skipped = [], []
    for name in names:
        try:
            importlib.import_module(modules[name])
            ok.append(name)
        except ImportError as e:
            skipped.append(f"{name} ({e})")
    return ok, skipped


def fmt_ms(s: float | None) -> str:
    """Seconds as milliseconds."""
    return "-" if s is None else f"{s * 1000:.1f}"


async def main_async(args: argparse.Namespace) -> None:
    """Run the parts for every available queue and print the tables."""
    names, skipped = available(args.queues)
    async with bench_database() as db:
        print(f"worker: {args.concurrency} jobs at a time, pool of {args.pool}; burst handler {args.work_ms:g} ms")
        if skipped:
            print("skipped: " + "; ".join(skipped))
        rows = []
        for name in names:
            queue, pool = await build_queue(name, db.dsn, args.pool, install=True, poll_s=args.procrastinate_poll)
            try:
                t0 = time.monotonic()
                lat = await part_latency(queue, args.concurrency, args.latency_chats)
                burst = await part_burst(queue, args.concurrency, args.work_ms / 1000, args.burst_chats)
                dedupe = await part_dedupe(queue, args.concurrency)
                crash = await part_crash(queue, db.dsn, args.concurrency) if not args.no_crash else None
                rows.append((queue, lat, burst, dedupe, crash, time.monotonic() - t0))
                print(f"  {name} {queue.version}: done in {time.monotonic() - t0:.1f} s", flush=True)
            finally:
                await queue.close()
                if pool is not None:
                    await pool.close()
    print_tables(rows, args)


def print_tables(
    rows: list[tuple[Queue, Latency, Burst, Dedupe, Crash | None, float]], args: argparse.Namespace
) -> None:
    """The figures, one line per queue and part."""
    print(f"\n1. latency, {args.latency_chats * LATENCY_PER_CHAT} messages at {LATENCY_RATE:g}/s (ms)")
    print(f"{'queue':<14} {'version':<16} {'enqueue p50':>11} {'p99':>7} {'→ start p50':>12} {'p99':>7} {'max':>7}")
    for q, lat, *_ in rows:
        print(
            f"{q.name:<14} {q.version.split(' ')[0]:<16} {fmt_ms(lat.put_p50):>11} {fmt_ms(lat.put_p99):>7} "
            f"{fmt_ms(lat.p50):>12} {fmt_ms(lat.p99):>7} {fmt_ms(lat.max):>7}"
        )
    n = args.burst_chats
    print(f"\n2. burst, {n * BURST_PER_CHAT} messages, {BURST_PER_CHAT} per chat over {n} chats")
    print(f"{'queue':<14} {'wall s':>7} {'msg/s':>7} {'lost':>5} {'dup':>5} {'chats out of order':>19} {'overlap':>8}")
    for q, _, b, *_ in rows:
        print(
            f"{q.name:<14} {b.wall_s:>7.2f} {b.per_s:>7.0f} {b.lost:>5} {b.duplicated:>5} "
            f"{b.out_of_order:>19} {b.overlapped:>8}   (→ start p99 {fmt_ms(b.p99_s)} ms)"
        )
    print("\n3. dedupe: handler runs of one update enqueued twice (1 = deduplicated)")
    print(f"{'queue':<14} {'while queued':>12} {'while running':>14} {'after done':>11}  refused by the queue")
    for q, _, _, d, *_ in rows:
        print(f"{q.name:<14} {d.while_queued:>12} {d.while_running:>14} {d.after_done:>11}  {d.refused}")
    print(f"\n4. crash: SIGKILL of a worker holding message 1 of a chat ({CRASH_TIMEOUT_S:g} s heartbeat/lease)")
    print(f"{'queue':<14} {'redone after s':>14} {'2 after 1':>10}  note")
    for q, *_, c, _ in rows:
        if c is None:
            continue
        redo = "never" if c.rerun_s is None else f"{c.rerun_s:.2f}"
        order = "-" if c.second_after_first is None else ("yes" if c.second_after_first else "NO")
        print(f"{q.name:<14} {redo:>14} {order:>10}  {c.note}")


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run."""
    p = parser("inbox_queues", __doc__)
    p.add_argument("--queues", nargs="+", default=["hand-written", "procrastinate", "pgqueuer"])
    p.add_argument("--concurrency", type=int, default=50, help="jobs one worker runs at a time (50)")
    p.add_argument("--pool", type=int, default=10, help="connections per queue's pool (10)")
    p.add_argument("--work-ms", type=float, default=10.0, help="handler time in the burst (10)")
    p.add_argument("--latency-chats", type=int, default=500, help="chats in part 1, two messages each (500)")
    p.add_argument("--burst-chats", type=int, default=1000, help="chats in part 2, three messages each (1000)")
    p.add_argument("--no-crash", action="store_true", help="skip part 4")
    p.add_argument("--procrastinate-poll", type=float, help="its fetch_job_polling_interval (default 5 s)")
    p.add_argument("--crash-worker", help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parse(p, argv, {"latency_chats": 50, "burst_chats": 100})
    quiet_logging()
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)  # "App is instantiated in the main module"
    if args.crash_worker:
        asyncio.run(crash_worker(args.crash_worker, args.dsn))
        return
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
