"""The bot's own time per turn, and 200 chats at once, through `Core.handle` on a real PostgreSQL.

Run with `uv run python -m bench.turn_overhead` (or `uv run python bench/turn_overhead.py`).
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
The fake LLM is tests.fake_openai; the headline figures run it in its own process.
`--profile` adds a per-phase breakdown and a cProfile of sequential turns, grouped by package.
`--full-memory` gives every bench user full core memory (human and persona at MEMORY_BLOCK_WORDS words each)
before part 1's measured turns: run once with and once without, same settings, to see what memory costs a turn.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import cProfile
import inspect
import pstats
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import openai

from bench.common import (
    REPO_ROOT,
    BenchDatabase,
    CpuSample,
    FakeLLMProcess,
    ServerStats,
    bench_core,
    bench_database,
    cpu_sample,
    fake_llm_in_process,
    load_average,
    percentile,
    quiet_logging,
    server_info,
    verdict,
)
from core.agent.llm import LLM
from core.constants import DUE_SOON, DUE_SOON_LINES, POOL_MAX_SIZE, POOL_MIN_SIZE
from core.front_door import Core
from core.memory.blocks import render_prompt_section
from core.storage import conversations
from core.types import Assistant, ChatKind, Error, Incoming

GOAL_P50_MS = 10.0
GOAL_P99_MS = 40.0
GOAL_BURST_S = 1.3
HISTORY = 40  # HISTORY_MESSAGES
PRIVATE_CHATS = 8  # users u0..u7, each in a private chat with the bot
GROUP_CHATS = 2  # two groups of four of those users
CONVERSATIONS = PRIVATE_CHATS + GROUP_CHATS
MEMORY_LINE_WORDS = 10  # --full-memory fills each block with lines of this many words

_FILL_MEMORY_SQL = """
INSERT INTO memory_blocks (user_id, name, lines)
SELECT u.id, b.name, $2::text[] FROM users u, (VALUES ('human'), ('persona')) b(name)
WHERE u.platform = 'telegram' AND u.platform_user_id LIKE $1 || '%'
ON CONFLICT (user_id, name) DO UPDATE SET lines = EXCLUDED.lines
"""


# ---------------------------------------------------------------- incoming messages


def sequential_incoming(tag: str, n: int) -> Incoming:
    """Turn n of the sequential run: round-robin over 8 private chats and 2 group chats."""
    conv = n % CONVERSATIONS
    kind: ChatKind = "private"
    user, chat, title = conv, f"{tag}p{conv}", ""
    if conv >= PRIVATE_CHATS:
        g = conv - PRIVATE_CHATS
        user = g * 4 + (n // CONVERSATIONS) % 4
        chat, kind, title = f"{tag}g{g}", "group", f"bench group {g}"
    return Incoming(
        platform="telegram",
        user_id=f"{tag}u{user}",
        chat_id=chat,
        user_name=f"User {user}",
        text=f"Message {n}: what is on my list for today, and anything due this week?",
        chat_kind=kind,
        chat_title=title,
        message_id=f"{tag}m{n}",
    )


def replayed_messages(n: int) -> int:
    """Stored messages replayed to the model in turn n (two per earlier turn of the chat, capped)."""
    return min(HISTORY, 2 * (n // CONVERSATIONS) + 1)


def burst_incoming(tag: str, i: int, round_no: int) -> Incoming:
    """Chat i of the concurrent burst (one user per private chat)."""
    return Incoming(
        platform="telegram",
        user_id=f"{tag}bu{i}",
        chat_id=f"{tag}bc{i}",
        user_name=f"Burst {i}",
        text=f"Hello from chat {i}, round {round_no}",
        message_id=f"{tag}bm{i}-{round_no}",
    )


# ---------------------------------------------------------------- running turns


async def one_turn(core: Core, inc: Incoming) -> Assistant | Error | None:
    """Run handle() to its end; the final event (Assistant or Error), or None if it yielded nothing."""
    last: Assistant | Error | None = None
    async for event in core.handle(inc):
        if isinstance(event, Assistant | Error):
            last = event
    return last


@dataclass
class CpuUse:
    """CPU seconds used during a measurement, by whom."""

    wall_s: float
    bot_s: float
    server_s: float | None  # the fake LLM process (None when it runs inside the bot)
    postgres_s: float | None  # None when the server is not on this host
    others_s: float | None  # everything else on the host (other people's jobs): noise
    cores: float  # host core-seconds available over the wall time

    def line(self, per: int, what: str) -> str:
        """One printable line."""
        parts = [f"bot {self.bot_s * 1000 / per:.2f} ms/{what}"]
        if self.server_s is not None:
            parts.append(f"fake LLM {self.server_s * 1000 / per:.2f} ms/{what}")
        if self.postgres_s is not None:
            parts.append(f"PostgreSQL {self.postgres_s * 1000 / per:.2f} ms/{what}")
        if self.others_s is not None:
            busy = self.others_s / self.wall_s if self.wall_s else 0.0
            parts.append(f"other processes on the host {busy:.2f} of {self.cores / self.wall_s:.0f} cores")
        return "CPU: " + ", ".join(parts)


class CpuMeter:
    """Measures CPU use of the bot, the fake server, PostgreSQL and the rest of the host."""

    def __init__(self, postmaster: int | None) -> None:
        """`postmaster`: the local PostgreSQL server's pid, if known."""
        self.postmaster = postmaster
        self._t0 = self._bot0 = 0.0
        self._host0: CpuSample | None = None

    def start(self) -> None:
        """Mark the beginning."""
        self._host0 = cpu_sample(self.postmaster)
        self._t0, self._bot0 = time.monotonic(), time.process_time()

    def stop(self, server_s: float | None) -> CpuUse:
        """CPU used since start()."""
        wall, bot = time.monotonic() - self._t0, time.process_time() - self._bot0
        host1 = cpu_sample(self.postmaster)
        pg = others = None
        cores = wall * 1.0
        if self._host0 is not None and host1 is not None:
            cores = host1.host_total - self._host0.host_total
            pg = host1.postgres - self._host0.postgres if self.postmaster is not None else None
            others = max(0.0, host1.host_busy - self._host0.host_busy - bot - (server_s or 0.0) - (pg or 0.0))
        return CpuUse(wall, bot, server_s, pg, others, cores)


@dataclass
class SequentialResult:
    """Per-turn wall times of one sequential run."""

    label: str
    ms: list[float]  # in turn order
    history: list[int]  # replayed messages per turn
    failures: int
    cpu: CpuUse
    server: ServerStats

    @property
    def turns(self) -> int:
        """Measured turns."""
        return len(self.ms)


async def fill_memory(core: Core, tag: str) -> int:
    """Give every user of `tag` full human and persona blocks (MEMORY_BLOCK_WORDS words each); how many blocks."""
    words = core.settings.MEMORY_BLOCK_WORDS
    lines = [
        " ".join(f"fact{i}w{j}" for j in range(min(MEMORY_LINE_WORDS, words - i)))
        for i in range(0, words, MEMORY_LINE_WORDS)
    ]
    status = await core.pool.execute(_FILL_MEMORY_SQL, tag, lines)
    return int(status.rsplit(" ", 1)[-1])


async def sequential(
    core: Core,
    tag: str,
    warmup: int,
    turns: int,
    take_stats: Callable[[], Awaitable[ServerStats]],
    meter: CpuMeter,
    label: str,
    *,
    full_memory: bool = False,
) -> SequentialResult:
    """Warm up (then fill the users' core memory when asked), then time `turns` turns one after another."""
    for n in range(warmup):
        await one_turn(core, sequential_incoming(tag, n))
    if full_memory:
        blocks = await fill_memory(core, tag)
        print(f"  filled {blocks} blocks with {core.settings.MEMORY_BLOCK_WORDS} words each")
        for n in range(CONVERSATIONS):  # the bigger prompt warms up too
            await one_turn(core, sequential_incoming(tag, warmup + n))
        warmup += CONVERSATIONS
    await take_stats()  # reset the server's counters
    times: list[float] = []
    failures = 0
    meter.start()
    for n in range(warmup, warmup + turns):
        inc = sequential_incoming(tag, n)
        t0 = time.perf_counter()
        last = await one_turn(core, inc)
        times.append((time.perf_counter() - t0) * 1000)
        if not isinstance(last, Assistant):
            failures += 1
    server = await take_stats()
    cpu = meter.stop(server.cpu_s)
    history = [replayed_messages(n) for n in range(warmup, warmup + turns)]
    return SequentialResult(label, times, history, failures, cpu, server)


def print_sequential(r: SequentialResult, *, headline: bool) -> None:
    """The figures of one sequential run."""
    ms = sorted(r.ms)
    mean = sum(ms) / len(ms)
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    print(f"  {'[HEADLINE] ' if headline else ''}{r.label}: {r.turns} turns, {r.failures} failed")
    print(f"    p50  {p50:7.2f} ms   goal <= {GOAL_P50_MS:.0f} ms   {verdict(p50, GOAL_P50_MS)}")
    print(f"    p99  {p99:7.2f} ms   goal <= {GOAL_P99_MS:.0f} ms   {verdict(p99, GOAL_P99_MS)}")
    print(f"    mean {mean:7.2f} ms   (p90 {percentile(ms, 90):.2f}, min {ms[0]:.2f}, max {ms[-1]:.2f})")
    buckets: dict[str, list[float]] = defaultdict(list)
    for t, h in zip(r.ms, r.history, strict=True):
        buckets["1-19" if h < 20 else "20-39" if h < HISTORY else f"{HISTORY} (full)"].append(t)
    print(
        "    p50 by replayed history: "
        + ", ".join(f"{k} msgs {percentile(sorted(v), 50):.2f} ms (n={len(v)})" for k, v in buckets.items())
    )
    handler_ms = r.server.handler_s * 1000 / max(1, r.server.requests)
    print(
        f"    {r.cpu.line(r.turns, 'turn')}"
        + ("" if r.server.cpu_s is not None else " (bot includes the in-process fake LLM)")
    )
    print(f"    fake LLM: {r.server.requests} requests, {handler_ms:.2f} ms/request inside its handler")
    if r.server.cpu_s is None:
        print(f"    p50 minus the fake handler's mean: {p50 - handler_ms:.2f} ms (aiohttp's own work still inside)")


# ---------------------------------------------------------------- the burst


@dataclass
class BurstResult:
    """One burst of concurrent turns."""

    label: str
    chats: int
    wall_s: float
    answered: int
    errors: dict[str, int]
    done_s: list[float]  # completion times after the start, sorted
    arrivals_s: list[float]  # LLM request arrivals at the server after the start, sorted
    cpu: CpuUse
    pool_size: int


async def burst(
    core: Core,
    tag: str,
    chats: int,
    round_no: int,
    server: FakeLLMProcess,
    meter: CpuMeter,
    label: str,
) -> BurstResult:
    """`chats` concurrent handle() calls in distinct chats; wall time until the last one is answered."""
    incs = [burst_incoming(tag, i, round_no) for i in range(chats)]
    await server.stats()  # reset
    done: list[float] = []

    async def run(inc: Incoming) -> Assistant | Error | None:
        result = await one_turn(core, inc)
        done.append(time.monotonic())
        return result

    meter.start()
    t0 = time.monotonic()
    results = await asyncio.gather(*(run(i) for i in incs), return_exceptions=True)
    wall = time.monotonic() - t0
    st = await server.stats()
    cpu = meter.stop(st.cpu_s)
    errors: dict[str, int] = defaultdict(int)
    answered = 0
    for res in results:
        if isinstance(res, Assistant):
            answered += 1
        elif isinstance(res, Error):
            errors[res.code] += 1
        elif isinstance(res, BaseException):
            errors[type(res).__name__] += 1
        else:
            errors["no answer"] += 1
    return BurstResult(
        label,
        chats,
        wall,
        answered,
        dict(errors),
        sorted(d - t0 for d in done),
        sorted(a - t0 for a in st.arrivals),
        cpu,
        core.pool.get_size(),
    )


def print_burst(r: BurstResult, delay: float) -> None:
    """The figures of one burst."""
    print(f"  {r.label}")
    print(
        f"    wall until all {r.chats} answered: {r.wall_s:.3f} s   goal <= {GOAL_BURST_S} s   "
        f"{verdict(r.wall_s, GOAL_BURST_S)}"
    )
    errs = ", ".join(f"{k}: {v}" for k, v in r.errors.items())
    print(f"    answered successfully: {r.answered}/{r.chats}" + (f"   errors: {errs}" if errs else ""))
    a, d = r.arrivals_s, r.done_s
    if a:
        print(
            f"    LLM requests reached the fake server after: first {a[0] * 1000:.0f} ms, "
            f"median {percentile(a, 50) * 1000:.0f} ms, last {a[-1] * 1000:.0f} ms  (= pre-LLM work: DB + SDK)"
        )
    if a and d:
        tail = d[-1] - (a[-1] + delay)
        print(
            f"    answers done after: first {d[0]:.3f} s, median {percentile(d, 50):.3f} s, last {d[-1]:.3f} s "
            f"(last one {tail * 1000:.0f} ms after the last reply was sent)"
        )
    busy = r.cpu.bot_s / r.wall_s if r.wall_s else 0.0
    print(f"    {r.cpu.line(r.chats, 'turn')}")
    print(f"    bot event loop busy {busy:.0%} of the wall time; DB pool size after the burst: {r.pool_size}")


# ---------------------------------------------------------------- profile


@contextmanager
def phase_timers(core: Core) -> Iterator[dict[str, float]]:
    """Wall time spent in the turn's awaited phases (store calls, the SDK call and its param transform)."""
    acc: dict[str, float] = defaultdict(float)
    undo: list[tuple[object, str, object]] = []

    def wrap(owner: object, name: str, label: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return

        async def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await cast(Callable[..., Awaitable[Any]], orig)(*a, **k)
            finally:
                acc[label] += time.perf_counter() - t0

        undo.append((owner, name, orig))
        setattr(owner, name, timed)

    for name in ("begin_turn", "finish_turn_with_answer"):
        wrap(conversations, name, f"DB: conversations.{name}")
    wrap(core.llm.client, "post", "openai SDK: client.post (all of it)")
    try:
        yield acc
    finally:
        for owner, name, orig in reversed(undo):
            if owner is core.llm.client:
                delattr(owner, name)
            else:
                setattr(owner, name, orig)


def _package(filename: str) -> str:
    """A coarse owner for a profiled function's file."""
    path = filename.replace("\\", "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    root = str(REPO_ROOT).replace("\\", "/") + "/"
    if path.startswith(root):
        rel = path[len(root) :]
        return rel.split("/", 1)[0] + "/ (ours)" if "/" in rel else rel
    if "/lib/python3" in path:
        rest = path.split("/lib/python3", 1)[1].split("/", 1)[1]
        return "stdlib " + rest.split("/", 1)[0].removesuffix(".py")
    return path or "?"


_C_OWNERS = (
    ("asyncpg", "asyncpg (C)"),
    ("pydantic_core", "pydantic_core (C)"),
    ("select.epoll", "epoll wait (idle)"),
    ("_socket", "socket syscalls"),
    ("_json", "json (C)"),
    ("_ssl", "ssl"),
)


def _builtin_owner(name: str) -> str | None:
    """The owner of a C function when its name says it (else it is charged to its callers)."""
    return next((owner for marker, owner in _C_OWNERS if marker in name), None)


StatsTable = dict[tuple[str, int, str], tuple[int, int, float, float, dict[Any, Any]]]


def print_profile(prof: cProfile.Profile, turns: int, top: int = 20) -> None:
    """Self time grouped by package (C calls charged to their callers), then the top functions."""
    raw = cast(StatsTable, pstats.Stats(prof).__dict__["stats"])
    by_pkg: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, name), (_cc, _nc, tt, _ct, callers) in raw.items():
        total += tt
        owner = _package(filename) if filename != "~" else _builtin_owner(name)
        if owner is not None or not callers:
            by_pkg[owner or f"C: {name}"] += tt
            continue
        caller_tt = {c: float(v[2]) for c, v in callers.items()}
        weight = sum(caller_tt.values())
        for c, v in caller_tt.items():
            share = v / weight if weight else 1.0 / len(caller_tt)
            by_pkg[_package(c[0]) if c[0] != "~" else (_builtin_owner(c[2]) or "C (other)")] += tt * share
    print(
        f"  cProfile of {turns} turns: {total * 1000 / turns:.2f} ms/turn of self time "
        "(cProfile inflates pure-Python code)"
    )
    print("  self time by owner (C builtins charged to their Python callers):")
    for pkg, tt in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:16]:
        print(f"    {tt * 1000 / turns:7.3f} ms/turn  {tt / total:6.1%}  {pkg}")
    print(f"  top {top} functions by self time:")
    for (filename, line, name), (_cc, nc, tt, _ct, _callers) in sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]:
        where = name if filename == "~" else f"{_package(filename)}: {name} ({Path(filename).name}:{line})"
        print(f"    {tt * 1000 / turns:7.3f} ms/turn  {nc / turns:7.1f} calls/turn  {where}")


# ---------------------------------------------------------------- the parts


async def part_sequential(db: BenchDatabase, args: argparse.Namespace, meter: CpuMeter) -> int:
    """Part 1: sequential turns with an instant fake LLM, out of process (headline) and in process."""
    print(
        f"== 1. Bot time per turn: {args.turns} sequential turns after {args.warmup} warm-up, instant fake "
        f"LLM, {PRIVATE_CHATS} private + {GROUP_CHATS} group chats, HISTORY_MESSAGES={HISTORY} =="
    )
    memory = "full core memory" if args.full_memory else "empty core memory"
    print(f"  {memory}: human and persona blocks per user (loaded in private chats only), --full-memory to change")
    async with FakeLLMProcess(0.0) as server, bench_core(db.dsn, server.base_url) as core:
        headline = await sequential(
            core, f"{db.tag}s1-", args.warmup, args.turns, server.stats, meter,
            f"fake LLM in a separate process, {memory}", full_memory=args.full_memory,
        )  # fmt: skip
    print_sequential(headline, headline=True)
    if not args.skip_in_process:
        async with fake_llm_in_process(0.0) as fake, bench_core(db.dsn, fake.base_url) as core:

            async def take() -> ServerStats:
                return ServerStats.from_dict(fake.take_stats(), own_process=False)

            other = await sequential(
                core, f"{db.tag}s2-", args.warmup, args.turns, take, meter,
                f"fake LLM on the bot's event loop, {memory}", full_memory=args.full_memory,
            )  # fmt: skip
        print_sequential(other, headline=False)
    print()
    ms = sorted(headline.ms)
    return int(headline.failures > 0 or percentile(ms, 50) > GOAL_P50_MS or percentile(ms, 99) > GOAL_P99_MS)


async def part_burst(db: BenchDatabase, args: argparse.Namespace, meter: CpuMeter, max_conn: int) -> int:
    """Part 2: many chats at once with a slow fake LLM."""
    n, delay = args.chats, args.delay
    print(
        f"== 2. {n} chats at once: {n} concurrent handle() calls, distinct users and chats, "
        f"fake LLM takes {delay:g} s per reply (separate process) =="
    )
    async with FakeLLMProcess(delay) as server:
        async with bench_core(db.dsn, server.base_url) as core:
            cold = await burst(
                core,
                f"{db.tag}b1-",
                n,
                1,
                server,
                meter,
                f"[HEADLINE] round 1, cold: new users and chats, fresh pool (max {POOL_MAX_SIZE}) and HTTP client",
            )
            print_burst(cold, delay)
            warm = await burst(
                core,
                f"{db.tag}b1-",
                n,
                2,
                server,
                meter,
                "round 2, warm: the same chats again, pool and keep-alive connections reused",
            )
            print_burst(warm, delay)
        big = min(max(n, POOL_MAX_SIZE), max_conn - 10)
        if args.diagnose and big > POOL_MAX_SIZE:
            async with bench_core(db.dsn, server.base_url, pool_max=big) as core:
                diag = await burst(
                    core,
                    f"{db.tag}b2-",
                    n,
                    1,
                    server,
                    meter,
                    f"diagnostic: round 1 (cold) again with pool max_size={big}: is the pool the limit?",
                )
                print_burst(diag, delay)
    print()
    return int(cold.answered < n or cold.wall_s > GOAL_BURST_S)


async def memory_share(core: Core, tag: str, rounds: int) -> tuple[list[float], list[float]]:
    """Alternate a turn's start without and with the memory load (+ its prompt section) for one private user with
    full blocks, so both see the same host load: the milliseconds of each (turns are opened and left running)."""
    without: list[float] = []
    with_memory: list[float] = []
    words = core.settings.MEMORY_BLOCK_WORDS
    for n in range(rounds):
        for load, out in ((False, without), (True, with_memory)):
            inc = Incoming("telegram", f"{tag}u0", f"{tag}p0", f"memory share {n} {load}", user_name="User 0")
            t0 = time.perf_counter()
            start = await conversations.begin_turn(
                core.pool, inc, "UTC", HISTORY, core.now() + DUE_SOON, DUE_SOON_LINES, memory=load
            )
            if start.memory is not None:
                render_prompt_section(start.memory, words)
            out.append((time.perf_counter() - t0) * 1000)
    return without, with_memory


async def part_memory(db: BenchDatabase, args: argparse.Namespace) -> None:
    """With --full-memory: what the memory load adds to a turn, measured side by side on the same database."""
    rounds = args.turns
    print(f"== Memory: a private turn's start without and with full core memory, {rounds} alternating pairs ==")
    async with FakeLLMProcess(0.0) as server, bench_core(db.dsn, server.base_url) as core:
        tag = f"{db.tag}m-"
        for n in range(HISTORY):
            await one_turn(core, sequential_incoming(tag, n * CONVERSATIONS))  # user 0's private chat, full history
        print(f"  user 0: {HISTORY} turns of history, {await fill_memory(core, tag)} full blocks")
        await memory_share(core, tag, args.warmup)
        without, with_memory = await memory_share(core, tag, rounds)
    a, b = percentile(sorted(without), 50), percentile(sorted(with_memory), 50)
    print(f"  begin_turn p50 without memory {a:.3f} ms, with full memory + <core_memory> rendered {b:.3f} ms")
    print(f"  [HEADLINE] memory adds {b - a:.3f} ms per private turn (p50)   goal <= 1 ms   {verdict(b - a, 1.0)}")
    print()


async def part_profile(db: BenchDatabase, args: argparse.Namespace) -> None:
    """Per-phase wall time and a cProfile of sequential turns with full history (fake LLM in its own process)."""
    turns = args.profile_turns
    fill = CONVERSATIONS * HISTORY // 2 + CONVERSATIONS
    print(
        f"== Profile: {turns} sequential turns with full history ({fill} turns first), fake LLM in a "
        "separate process =="
    )
    async with FakeLLMProcess(0.0) as server, bench_core(db.dsn, server.base_url) as core:
        tag = f"{db.tag}p-"
        for n in range(fill):
            await one_turn(core, sequential_incoming(tag, n))
        if args.full_memory:
            print(f"  full core memory: {await fill_memory(core, tag)} blocks")
        with phase_timers(core) as acc:
            t0 = time.perf_counter()
            for n in range(fill, fill + turns):
                await one_turn(core, sequential_incoming(tag, n))
            total = time.perf_counter() - t0
        print(f"  wall time by phase (no profiler), {total * 1000 / turns:.2f} ms/turn in all:")
        for label, s in sorted(acc.items(), key=lambda kv: -kv[1]):
            print(f"    {s * 1000 / turns:7.3f} ms/turn  {label}")
        rest = total - sum(s for label, s in acc.items() if not label.startswith(" "))
        print(f"    {rest * 1000 / turns:7.3f} ms/turn  the rest: prompt, replay, our code")
        prof = cProfile.Profile()
        prof.enable()
        for n in range(fill + turns, fill + 2 * turns):
            await one_turn(core, sequential_incoming(tag, n))
        prof.disable()
    print_profile(prof, turns)
    print()


async def bench(args: argparse.Namespace) -> int:
    """Run the selected parts and print their figures."""
    status = 0
    async with bench_database() as db:
        server = await server_info(db.dsn)
        meter = CpuMeter(server.postmaster)
        retries = inspect.signature(LLM.from_settings).parameters["max_retries"].default
        print(f"PostgreSQL {server.version}: {db.description}")
        print(
            f"  max_connections {server.max_connections}, synchronous_commit {server.sync_commit}; the bot's pool: "
            f"create_pool defaults (min {POOL_MIN_SIZE}, max {POOL_MAX_SIZE})"
        )
        print(
            f"openai {openai.__version__} via LLM.from_settings: max_retries {retries}, default HTTP pool "
            f"{openai.DEFAULT_CONNECTION_LIMITS}"
        )
        print(f"Python {sys.version.split()[0]}, {type(asyncio.get_running_loop()).__name__}; host: {load_average()}")
        print()
        if not args.skip_sequential:
            status |= await part_sequential(db, args, meter)
        if not args.skip_burst:
            status |= await part_burst(db, args, meter, server.max_connections)
        if args.full_memory:
            await part_memory(db, args)
        if args.profile:
            await part_profile(db, args)
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when a goal is missed."""
    parser = argparse.ArgumentParser(prog="python -m bench.turn_overhead", description=__doc__)
    parser.add_argument("--turns", type=int, default=1000, help="measured sequential turns (1000)")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up turns (50)")
    parser.add_argument("--chats", type=int, default=200, help="concurrent chats in the burst (200)")
    parser.add_argument("--delay", type=float, default=1.0, help="fake LLM delay in the burst, seconds (1.0)")
    parser.add_argument("--skip-sequential", action="store_true", help="skip part 1")
    parser.add_argument("--skip-in-process", action="store_true", help="skip part 1's in-process variant")
    parser.add_argument("--skip-burst", action="store_true", help="skip part 2")
    parser.add_argument(
        "--no-diagnose", dest="diagnose", action="store_false", help="skip the burst with a bigger pool"
    )
    parser.add_argument("--profile", action="store_true", help="add a phase breakdown and a cProfile")
    parser.add_argument(
        "--full-memory",
        action="store_true",
        help="full human and persona blocks (MEMORY_BLOCK_WORDS) for part 1's users",
    )
    parser.add_argument("--profile-turns", type=int, default=300, help="turns to profile (300)")
    args = parser.parse_args(argv)
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
