"""The bot's own time per turn, and 200 chats at once, through `Core.handle` on a real PostgreSQL.

Run with `uv run python -m bench.turn_overhead` (or `uv run python bench/turn_overhead.py`).
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
The fake LLM is tests.fake_openai; the headline figures run it in its own process.
`--profile` adds a cProfile of sequential turns, grouped by package.
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
import logging
import pstats
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import asyncpg
import openai

from bench.common import (
    REPO_ROOT,
    BenchDatabase,
    FakeLLMProcess,
    ServerStats,
    bench_database,
    bench_settings,
    fake_llm_in_process,
    percentile,
    verdict,
)
from core.db import create_pool
from core.llm import LLM
from core.service import Core
from core.types import Assistant, ChatKind, Error, Incoming

GOAL_P50_MS = 10.0
GOAL_P99_MS = 40.0
GOAL_BURST_S = 1.3
PRIVATE_CHATS = 8  # users u0..u7, each in a private chat with the bot
GROUP_CHATS = 2  # two groups of four of those users
POOL_MAX_DEFAULT = 20  # core.db.create_pool's default max_size


# ---------------------------------------------------------------- incoming messages


def sequential_incoming(tag: str, n: int) -> Incoming:
    """Turn n of the sequential run: round-robin over 8 private chats and 2 group chats."""
    conv = n % (PRIVATE_CHATS + GROUP_CHATS)
    kind: ChatKind = "private"
    user, chat, title = conv, f"{tag}p{conv}", ""
    if conv >= PRIVATE_CHATS:
        g = conv - PRIVATE_CHATS
        user = g * 4 + (n // (PRIVATE_CHATS + GROUP_CHATS)) % 4
        chat, kind, title = f"{tag}g{g}", "group", f"bench group {g}"
    return Incoming(
        platform="telegram", user_id=f"{tag}u{user}", chat_id=chat, user_name=f"User {user}",
        text=f"Message {n}: what is on my list for today, and anything due this week?",
        chat_kind=kind, chat_title=title, message_id=f"{tag}m{n}",
    )


def burst_incoming(tag: str, i: int, round_no: int) -> Incoming:
    """Chat i of the concurrent burst (one user per private chat)."""
    return Incoming(
        platform="telegram", user_id=f"{tag}bu{i}", chat_id=f"{tag}bc{i}", user_name=f"Burst {i}",
        text=f"Hello from chat {i}, round {round_no}", message_id=f"{tag}bm{i}-{round_no}",
    )


# ---------------------------------------------------------------- running turns


@asynccontextmanager
async def make_core(dsn: str, base_url: str, *, pool_max: int = POOL_MAX_DEFAULT) -> AsyncIterator[Core]:
    """A Core wired like production (create_pool defaults unless pool_max, LLM.from_settings)."""
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        settings = bench_settings(base_url, Path(tmp))
        pool = await create_pool(dsn, max_size=pool_max)
        llm = LLM.from_settings(settings)
        try:
            yield Core(settings, pool, llm)
        finally:
            await llm.client.close()
            await pool.close()


async def one_turn(core: Core, inc: Incoming) -> Assistant | Error | None:
    """Run handle() to its end; the final event (Assistant or Error), or None if it yielded nothing."""
    last: Assistant | Error | None = None
    async for event in core.handle(inc):
        if isinstance(event, Assistant | Error):
            last = event
    return last


@dataclass
class SequentialResult:
    """Per-turn wall times of one sequential run."""

    label: str
    ms: list[float]  # sorted
    failures: int
    bot_cpu_s: float  # CPU of the bot's process over the measured turns
    server: ServerStats

    @property
    def turns(self) -> int:
        """Measured turns."""
        return len(self.ms)


async def sequential(
    core: Core, tag: str, warmup: int, turns: int, take_stats: Callable[[], Awaitable[ServerStats]], label: str,
) -> SequentialResult:
    """Warm up, then time `turns` turns one after another."""
    for n in range(warmup):
        await one_turn(core, sequential_incoming(tag, n))
    await take_stats()  # reset the server's counters
    times: list[float] = []
    failures = 0
    cpu0 = time.process_time()
    for n in range(warmup, warmup + turns):
        inc = sequential_incoming(tag, n)
        t0 = time.perf_counter()
        last = await one_turn(core, inc)
        times.append((time.perf_counter() - t0) * 1000)
        if not isinstance(last, Assistant):
            failures += 1
    cpu = time.process_time() - cpu0
    return SequentialResult(label, sorted(times), failures, cpu, await take_stats())


def print_sequential(r: SequentialResult, *, headline: bool) -> None:
    """The figures of one sequential run."""
    mean = sum(r.ms) / len(r.ms)
    p50, p99 = percentile(r.ms, 50), percentile(r.ms, 99)
    print(f"  {'[HEADLINE] ' if headline else ''}{r.label}: {r.turns} turns, {r.failures} failed")
    print(f"    p50  {p50:7.2f} ms   goal <= {GOAL_P50_MS:.0f} ms   {verdict(p50, GOAL_P50_MS)}")
    print(f"    p99  {percentile(r.ms, 99):7.2f} ms   goal <= {GOAL_P99_MS:.0f} ms   {verdict(p99, GOAL_P99_MS)}")
    print(f"    mean {mean:7.2f} ms   (p90 {percentile(r.ms, 90):.2f}, max {r.ms[-1]:.2f}, min {r.ms[0]:.2f})")
    handler_ms = r.server.handler_s * 1000 / max(1, r.server.requests)
    print(f"    bot process CPU per turn: {r.bot_cpu_s * 1000 / r.turns:.2f} ms"
          + ("" if r.server.cpu_s is not None else "  (includes the fake server's CPU)"))
    line = f"    fake server: {r.server.requests} requests, handler {handler_ms:.2f} ms/request"
    if r.server.cpu_s is not None:
        line += f", its process CPU {r.server.cpu_s * 1000 / max(1, r.server.requests):.2f} ms/request"
    print(line)
    if r.server.cpu_s is None:
        print(f"    p50 minus the fake handler's mean time: {p50 - handler_ms:.2f} ms "
              "(aiohttp's own parsing/writing still included)")


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
    bot_cpu_s: float
    pool_size: int
    server_cpu_s: float | None


async def burst(core: Core, tag: str, chats: int, round_no: int, server: FakeLLMProcess, label: str) -> BurstResult:
    """`chats` concurrent handle() calls in distinct chats; wall time until the last one is answered."""
    incs = [burst_incoming(tag, i, round_no) for i in range(chats)]
    await server.stats()  # reset
    done: list[float] = []

    async def run(inc: Incoming) -> Assistant | Error | None:
        result = await one_turn(core, inc)
        done.append(time.monotonic())
        return result

    cpu0 = time.process_time()
    t0 = time.monotonic()
    results = await asyncio.gather(*(run(i) for i in incs), return_exceptions=True)
    wall = time.monotonic() - t0
    cpu = time.process_time() - cpu0
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
    st = await server.stats()
    return BurstResult(
        label, chats, wall, answered, dict(errors), sorted(d - t0 for d in done),
        sorted(a - t0 for a in st.arrivals), cpu, core.pool.get_size(), st.cpu_s,
    )


def print_burst(r: BurstResult, delay: float) -> None:
    """The figures of one burst."""
    print(f"  {r.label}")
    print(f"    wall until all {r.chats} answered: {r.wall_s:.3f} s   goal <= {GOAL_BURST_S} s   "
          f"{verdict(r.wall_s, GOAL_BURST_S)}")
    errs = ", ".join(f"{k}: {v}" for k, v in r.errors.items())
    print(f"    answered successfully: {r.answered}/{r.chats}" + (f"   errors: {errs}" if errs else ""))
    if r.arrivals_s:
        a = r.arrivals_s
        print(f"    LLM requests reached the server after: first {a[0] * 1000:.0f} ms, "
              f"median {percentile(a, 50) * 1000:.0f} ms, last {a[-1] * 1000:.0f} ms  (pre-LLM: DB + SDK)")
        if r.done_s:
            tail = r.done_s[-1] - (a[-1] + delay)
            print(f"    answers done after: first {r.done_s[0]:.3f} s, median {percentile(r.done_s, 50):.3f} s, "
                  f"last {r.done_s[-1]:.3f} s  (last answer {tail * 1000:.0f} ms after the last "
                  f"reply could be ready)")
    busy = r.bot_cpu_s / r.wall_s if r.wall_s else 0.0
    print(f"    bot process CPU during the burst: {r.bot_cpu_s:.3f} s = {r.bot_cpu_s * 1000 / r.chats:.2f} ms/turn, "
          f"{busy:.0%} of one core over the wall time")
    extra = f", fake server process CPU {r.server_cpu_s:.3f} s" if r.server_cpu_s is not None else ""
    print(f"    DB pool size after the burst: {r.pool_size}{extra}")


# ---------------------------------------------------------------- profile


def _package(filename: str) -> str:
    """A coarse owner for a profiled function's file."""
    path = filename.replace("\\", "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    root = str(REPO_ROOT).replace("\\", "/") + "/"
    if path.startswith(root):
        rel = path[len(root):]
        return rel.split("/", 1)[0] + "/ (ours)" if "/" in rel else rel
    if "/lib/python3" in path:
        rest = path.split("/lib/python3", 1)[1].split("/", 1)[1]
        return "stdlib " + rest.split("/", 1)[0].removesuffix(".py")
    return path or "?"


def _builtin_owner(name: str) -> str | None:
    """The owner of a C function when its name says it (else it is charged to its callers)."""
    for marker, owner in (
        ("asyncpg", "asyncpg (C)"), ("pydantic_core", "pydantic_core (C)"), ("select.epoll", "epoll wait (idle)"),
        ("_socket", "socket syscalls"), ("uvloop", "uvloop"), ("_json", "json (C)"), ("_ssl", "ssl"),
    ):
        if marker in name:
            return owner
    return None


def print_profile(prof: cProfile.Profile, turns: int, top: int = 25) -> None:
    """Self time grouped by package (C calls charged to callers), then the top functions."""
    st = pstats.Stats(prof)
    raw = cast(dict[tuple[str, int, str], tuple[int, int, float, float, dict[Any, Any]]], st.__dict__["stats"])
    by_pkg: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, name), (_cc, _nc, tt, _ct, callers) in raw.items():
        total += tt
        if filename != "~":
            by_pkg[_package(filename)] += tt
            continue
        owner = _builtin_owner(name)
        if owner is not None or not callers:
            by_pkg[owner or f"C: {name}"] += tt
            continue
        caller_tt = {c: v[2] for c, v in callers.items()}
        weight = sum(caller_tt.values()) or float(len(caller_tt))
        for c, v in caller_tt.items():
            share = (v if sum(caller_tt.values()) else 1.0) / weight
            key = _package(c[0]) if c[0] != "~" else (_builtin_owner(c[2]) or "C (other)")
            by_pkg[key] += tt * share
    print(f"  profiled {turns} sequential turns; total self time {total:.3f} s = {total * 1000 / turns:.2f} ms/turn "
          "(cProfile inflates Python-heavy code)")
    print("  self time by owner (C builtins charged to their Python callers):")
    for pkg, tt in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:18]:
        print(f"    {tt * 1000 / turns:7.3f} ms/turn  {tt / total:5.1%}  {pkg}")
    print(f"  top {top} functions by self time:")
    rows = sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]
    for (filename, line, name), (_cc, nc, tt, _ct, _callers) in rows:
        where = name if filename == "~" else f"{_package(filename)}: {name} ({Path(filename).name}:{line})"
        print(f"    {tt * 1000 / turns:7.3f} ms/turn  {nc / turns:6.1f} calls/turn  {where}")


# ---------------------------------------------------------------- main


async def bench(args: argparse.Namespace) -> int:
    """Run the selected parts and print their figures."""
    status = 0
    async with bench_database() as db:
        print(f"PostgreSQL: {db.description}")
        conn = await asyncpg.connect(db.dsn)
        try:
            version = await conn.fetchval("SHOW server_version")
            max_conn = int(await conn.fetchval("SHOW max_connections"))
        finally:
            await conn.close()
        print(f"  server {version}, max_connections {max_conn}; bot pool: create_pool defaults "
              f"(min 2, max {POOL_MAX_DEFAULT})")
        print(f"openai {openai.__version__} client: max_retries {inspect.signature(LLM.from_settings).parameters['max_retries'].default}, "
              f"httpx limits {openai.DEFAULT_CONNECTION_LIMITS}")
        print(f"Python {sys.version.split()[0]}, event loop {type(asyncio.get_running_loop()).__name__}")
        print()
        if not args.skip_sequential:
            status |= await part_sequential(db, args)
        if not args.skip_burst:
            status |= await part_burst(db, args, max_conn)
        if args.profile:
            await part_profile(db, args)
    return status


async def part_sequential(db: BenchDatabase, args: argparse.Namespace) -> int:
    """Part 1: sequential turns with an instant fake LLM, out of process (headline) and in process."""
    print(f"== 1. Bot time per turn: {args.turns} sequential turns after {args.warmup} warm-up, instant fake LLM, "
          f"{PRIVATE_CHATS} private + {GROUP_CHATS} group chats, HISTORY_MESSAGES=40 ==")
    async with FakeLLMProcess(0.0) as server, make_core(db.dsn, server.base_url) as core:
        headline = await sequential(
            core, f"{db.tag}s1-", args.warmup, args.turns, server.stats, "fake LLM in a separate process"
        )
    print_sequential(headline, headline=True)
    if not args.skip_in_process:
        async with fake_llm_in_process(0.0) as fake, make_core(db.dsn, fake.base_url) as core:

            async def take() -> ServerStats:
                return ServerStats.from_dict(fake.take_stats(), own_process=False)

            other = await sequential(
                core, f"{db.tag}s2-", args.warmup, args.turns, take, "fake LLM on the bot's event loop"
            )
        print_sequential(other, headline=False)
    print()
    p50, p99 = percentile(headline.ms, 50), percentile(headline.ms, 99)
    return int(headline.failures > 0 or p50 > GOAL_P50_MS or p99 > GOAL_P99_MS)


async def part_burst(db: BenchDatabase, args: argparse.Namespace, max_conn: int) -> int:
    """Part 2: many chats at once with a slow fake LLM."""
    n, delay = args.chats, args.delay
    print(f"== 2. {n} chats at once: {n} concurrent handle() calls, distinct users/chats, "
          f"fake LLM takes {delay:g} s per reply (separate process) ==")
    status = 0
    async with FakeLLMProcess(delay) as server:
        async with make_core(db.dsn, server.base_url) as core:
            cold = await burst(core, f"{db.tag}b1-", n, 1, server,
                               f"[HEADLINE] round 1, cold: new users and chats, fresh pool (max {POOL_MAX_DEFAULT}) "
                               "and HTTP client")
            print_burst(cold, delay)
            warm = await burst(core, f"{db.tag}b1-", n, 2, server,
                               "round 2, warm: the same chats again, pool and keep-alive connections reused")
            print_burst(warm, delay)
        status = int(cold.answered < n or cold.wall_s > GOAL_BURST_S)
        big = min(max(n, POOL_MAX_DEFAULT), max_conn - 10)
        if args.diagnose and big > POOL_MAX_DEFAULT:
            async with make_core(db.dsn, server.base_url, pool_max=big) as core:
                diag = await burst(core, f"{db.tag}b2-", n, 1, server,
                                   f"diagnostic: round 1 cold again but pool max_size={big} (is the pool the limit?)")
                print_burst(diag, delay)
    print()
    return status


async def part_profile(db: BenchDatabase, args: argparse.Namespace) -> None:
    """cProfile of sequential turns (fake LLM in its own process)."""
    turns = args.profile_turns
    print(f"== Profile: {turns} sequential turns under cProfile (fake LLM in a separate process) ==")
    async with FakeLLMProcess(0.0) as server, make_core(db.dsn, server.base_url) as core:
        tag = f"{db.tag}p-"
        for n in range(args.warmup):
            await one_turn(core, sequential_incoming(tag, n))
        prof = cProfile.Profile()
        prof.enable()
        for n in range(args.warmup, args.warmup + turns):
            await one_turn(core, sequential_incoming(tag, n))
        prof.disable()
    print_profile(prof, turns)
    print()


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(prog="python -m bench.turn_overhead", description=__doc__)
    parser.add_argument("--turns", type=int, default=1000, help="measured sequential turns (1000)")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up turns (50)")
    parser.add_argument("--chats", type=int, default=200, help="concurrent chats in the burst (200)")
    parser.add_argument("--delay", type=float, default=1.0, help="fake LLM delay in the burst, seconds (1.0)")
    parser.add_argument("--skip-sequential", action="store_true", help="skip part 1")
    parser.add_argument("--skip-in-process", action="store_true", help="skip the in-process variant of part 1")
    parser.add_argument("--skip-burst", action="store_true", help="skip part 2")
    parser.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                        help="skip the burst with a bigger pool")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile breakdown")
    parser.add_argument("--profile-turns", type=int, default=300, help="turns to profile (300)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
