"""The core's own time per turn, and 200 chats at once, through `Core.handle` on a real PostgreSQL with the fake model
(tests.fake_openai) in its own process. Part 1 runs sequential turns answered at once over 8 private and 2 group chats
with up to HISTORY_MESSAGES=40 messages replayed (goals: p50 <= 10 ms, p99 <= 40 ms); part 2 starts 200 turns in
distinct chats at once with a model that takes 1 s (goal: all answered within 1.3 s, cold: new users, a fresh pool and
HTTP client); `--full-memory` fills every user's core memory first and alternates turns of a user with full memory
and one without (goal: memory adds <= 1 ms a turn); `--profile` adds a cProfile grouped by package.
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Sequence

import openai

from bench.common import (
    BenchDatabase,
    CpuMeter,
    FakeLLMProcess,
    bench_core,
    bench_database,
    goal_line,
    parse,
    parser,
    percentile,
    profiled,
    quiet_logging,
    spread,
    verdict,
)
from core.constants import POOL_MAX_SIZE
from core.front_door import Core
from core.types import Assistant, ChatKind, Error, Incoming

GOAL_P50_MS, GOAL_P99_MS = 10.0, 40.0
GOAL_BURST_S = 1.3
GOAL_MEMORY_MS = 1.0
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


def incoming(tag: str, n: int) -> Incoming:
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


async def one_turn(core: Core, inc: Incoming) -> Assistant | Error | None:
    """Run handle() to its end; the final event (Assistant or Error), or None if it yielded nothing."""
    last: Assistant | Error | None = None
    async for event in core.handle(inc):
        if isinstance(event, Assistant | Error):
            last = event
    return last


async def timed_turns(core: Core, incs: Sequence[Incoming]) -> tuple[list[float], int]:
    """Run turns one after another: each one's ms, and how many ended without an answer."""
    times: list[float] = []
    failures = 0
    for inc in incs:
        t0 = time.perf_counter()
        last = await one_turn(core, inc)
        times.append((time.perf_counter() - t0) * 1000)
        failures += not isinstance(last, Assistant)
    return times, failures


async def fill_memory(core: Core, tag: str, prefix: str = "") -> int:
    """Give the users of `tag` (whose id starts with `prefix` after it) full human and persona blocks
    (MEMORY_BLOCK_WORDS words each); how many blocks."""
    words = core.settings.MEMORY_BLOCK_WORDS
    lines = [
        " ".join(f"fact{i}w{j}" for j in range(min(MEMORY_LINE_WORDS, words - i)))
        for i in range(0, words, MEMORY_LINE_WORDS)
    ]
    status = await core.pool.execute(_FILL_MEMORY_SQL, tag + prefix, lines)
    return int(status.rsplit(" ", 1)[-1])


# ---------------------------------------------------------------- the parts


async def part_sequential(db: BenchDatabase, args: argparse.Namespace) -> int:
    """Part 1: sequential turns with an instant model in its own process."""
    memory = "full core memory (--full-memory)" if args.full_memory else "empty core memory"
    print(
        f"== 1. Core time per turn: {args.turns} sequential turns after {args.warmup} warm-up, {PRIVATE_CHATS} private "
        f"+ {GROUP_CHATS} group chats, {memory} =="
    )
    tag = f"{db.tag}s-"
    async with FakeLLMProcess(0.0) as llm, bench_core(db.dsn, llm.base_url) as core:
        await timed_turns(core, [incoming(tag, n) for n in range(args.warmup)])
        if args.full_memory:
            print(f"  filled {await fill_memory(core, tag)} blocks with {core.settings.MEMORY_BLOCK_WORDS} words each")
        await llm.stats()  # reset
        meter = CpuMeter(db.postmaster)
        meter.start()
        times, failures = await timed_turns(core, [incoming(tag, args.warmup + n) for n in range(args.turns)])
        cpu = meter.stop((await llm.stats()).cpu_s)
    ms = sorted(times)
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    print(f"  [HEADLINE] {args.turns} turns, {failures} failed")
    print(f"    {goal_line('p50', p50, GOAL_P50_MS)}")
    print(f"    {goal_line('p99', p99, GOAL_P99_MS)}")
    print(f"    ({spread(ms)})")
    print(f"    {cpu.line(args.turns)}")
    print()
    return int(failures > 0 or p50 > GOAL_P50_MS or p99 > GOAL_P99_MS)


async def burst(core: Core, tag: str, chats: int, round_no: int, llm: FakeLLMProcess, meter: CpuMeter) -> bool:
    """`chats` concurrent turns in distinct chats; print the wall time until the last one is answered."""
    incs = [
        Incoming(
            "telegram",
            f"{tag}bu{i}",
            f"{tag}bc{i}",
            f"Hello from chat {i}, round {round_no}",
            message_id=f"{i}-{round_no}",
        )
        for i in range(chats)
    ]
    await llm.stats()  # reset
    meter.start()
    t0 = time.monotonic()
    results = await asyncio.gather(*(one_turn(core, i) for i in incs), return_exceptions=True)
    wall = time.monotonic() - t0
    stats = await llm.stats()
    cpu = meter.stop(stats.cpu_s)
    outcomes = Counter(
        "answered" if isinstance(r, Assistant) else r.code if isinstance(r, Error) else type(r).__name__
        for r in results
    )
    arrivals = sorted(a - t0 for a in stats.arrivals)
    print(
        f"    wall until all {chats} answered: {wall:.3f} s   goal <= {GOAL_BURST_S} s   {verdict(wall, GOAL_BURST_S)}"
    )
    print(f"    {', '.join(f'{k} {v}' for k, v in outcomes.most_common())}; DB pool size after: {core.pool.get_size()}")
    if arrivals:
        print(
            f"    model requests arrived after: first {arrivals[0] * 1000:.0f} ms, median "
            f"{percentile(arrivals, 50) * 1000:.0f} ms, last {arrivals[-1] * 1000:.0f} ms (the work before the model)"
        )
    print(f"    {cpu.line(chats)}")
    return outcomes["answered"] == chats and wall <= GOAL_BURST_S


async def part_burst(db: BenchDatabase, args: argparse.Namespace) -> int:
    """Part 2: many chats at once with a slow model: cold (new users, fresh pool), then warm."""
    print(f"== 2. {args.chats} chats at once, the model taking {args.delay:g} s per answer ==")
    meter = CpuMeter(db.postmaster)
    async with FakeLLMProcess(args.delay) as llm, bench_core(db.dsn, llm.base_url) as core:
        print(f"  [HEADLINE] round 1, cold: new users and chats, fresh pool (max {POOL_MAX_SIZE}) and HTTP client")
        cold = await burst(core, f"{db.tag}b-", args.chats, 1, llm, meter)
        print("  round 2, warm: the same chats again")
        await burst(core, f"{db.tag}b-", args.chats, 2, llm, meter)
    print()
    return int(not cold)


async def part_memory(db: BenchDatabase, args: argparse.Namespace) -> int:
    """With --full-memory: alternate private turns of a user with full core memory and one without (same history),
    so both see the same host load; what memory adds is the difference of their medians."""
    rounds = args.turns // 2
    print(f"== Memory: {rounds} alternating private turns of a user with full core memory and one without ==")
    tag = f"{db.tag}m-"

    def turn(user: str, n: int) -> Incoming:
        return Incoming("telegram", f"{tag}{user}", f"{tag}{user}", f"what is on my list today? ({n})", user_name=user)

    async with FakeLLMProcess(0.0) as llm, bench_core(db.dsn, llm.base_url) as core:
        history = core.settings.HISTORY_MESSAGES
        await timed_turns(core, [turn(user, n) for n in range(history // 2) for user in ("full", "empty")])
        print(f"  {await fill_memory(core, tag, 'full')} full blocks")
        await timed_turns(core, [turn(user, n) for n in range(args.warmup) for user in ("full", "empty")])
        full: list[float] = []
        empty: list[float] = []
        for n in range(rounds):
            for user, out in (("full", full), ("empty", empty)):
                out += (await timed_turns(core, [turn(user, history + n)]))[0]
    a, b = percentile(sorted(empty), 50), percentile(sorted(full), 50)
    print(f"  turn p50 without memory {a:.3f} ms, with full core memory {b:.3f} ms")
    print(f"  [HEADLINE] what memory adds to a private turn: {goal_line('p50', b - a, GOAL_MEMORY_MS)}")
    print()
    return int(b - a > GOAL_MEMORY_MS)


async def part_profile(db: BenchDatabase, args: argparse.Namespace) -> None:
    """A cProfile of sequential turns with full history."""
    turns, fill = args.profile_turns, CONVERSATIONS * 20 + CONVERSATIONS
    print(f"== Profile: {turns} sequential turns with full history ({fill} turns first) ==")
    tag = f"{db.tag}p-"
    async with FakeLLMProcess(0.0) as llm, bench_core(db.dsn, llm.base_url) as core:
        await timed_turns(core, [incoming(tag, n) for n in range(fill)])
        with profiled(turns):
            await timed_turns(core, [incoming(tag, n) for n in range(fill, fill + turns)])
    print()


async def bench(args: argparse.Namespace) -> int:
    """Run the selected parts; 1 when a goal is missed."""
    status = 0
    async with bench_database() as db:
        print(
            f"openai {openai.__version__}; the core's pool: create_pool defaults; max_connections {db.max_connections}"
        )
        print()
        if not args.skip_sequential:
            status |= await part_sequential(db, args)
        if not args.skip_burst:
            status |= await part_burst(db, args)
        if args.full_memory:
            status |= await part_memory(db, args)
        if args.profile:
            await part_profile(db, args)
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when a goal is missed."""
    p = parser("turn_overhead", __doc__)
    p.add_argument("--turns", type=int, default=1000, help="measured sequential turns (1000)")
    p.add_argument("--warmup", type=int, default=50, help="warm-up turns (50)")
    p.add_argument("--chats", type=int, default=200, help="concurrent chats in part 2 (200)")
    p.add_argument("--delay", type=float, default=1.0, help="the model's answer time in part 2 (1 s)")
    p.add_argument("--skip-sequential", action="store_true", help="skip part 1")
    p.add_argument("--skip-burst", action="store_true", help="skip part 2")
    p.add_argument("--full-memory", action="store_true", help="full core memory in part 1, and the memory part")
    p.add_argument("--profile", action="store_true", help="add a cProfile")
    p.add_argument("--profile-turns", type=int, default=300, help="turns to profile (300)")
    args = parse(p, argv, {"turns": 100, "warmup": 20, "chats": 40, "profile_turns": 50})
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
