"""What token usage and the budget check add to a turn: sequential private turns through `Core.handle` on a real
PostgreSQL, the fake model (tests.fake_openai, reporting usage) answering at once from its own process. Three Cores on
one database take turns round by round (in a rotating order, so all see the same host load), each with its own users:
  - none:     no usage recorded and no check (a stand-in for the code before issue 21: the turn's start skips
              usage_admit, the calls are not metered);
  - recorded: usage recorded after each model call, no budget set (the check is one lookup in the turn's start);
  - budgets:  USER_DAILY_TOKENS, USER_MONTHLY_TOKENS and BOT_DAILY_TOKENS all set (never reached): the check and the
              admission in the turn's start, the bot-wide lock, the reservation freed by the usage write.
Prints each one's p50/p99 and the differences (goal: the budget check adds <= 0.5 ms p50 to a turn).
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
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any

from bench.common import (
    BenchDatabase,
    FakeLLMProcess,
    bench_core,
    bench_database,
    goal_line,
    parse,
    parser,
    percentile,
    quiet_logging,
    spread,
)
from core.accounts.usage import Spending, TurnMeter
from core.front_door import Core
from core.types import Assistant, Incoming, UserRef

GOAL_CHECK_MS = 0.5
USERS = 5  # private chats per variant, round robin
NEVER = 10**14  # a budget no bench reaches
VARIANTS = ("none", "recorded", "budgets")
BUDGETS = {"USER_DAILY_TOKENS": NEVER, "USER_MONTHLY_TOKENS": NEVER, "BOT_DAILY_TOKENS": NEVER}


class _Unmetered(TurnMeter):
    """A meter that neither checks nor records."""

    async def admit(self) -> str | None:
        """Always go ahead."""
        return None

    def spent(self, reply: Any) -> None:
        """Record nothing."""


class _NoSpending(Spending):
    """Spending switched off: the turn's start skips usage_admit and the calls are not metered."""

    def admission(self, now: datetime) -> tuple[Any, ...]:
        """No check in the turn's start (its parameters are NULL)."""
        return (None, None, None, None, None, None, None)

    def meter(self, user: UserRef, verdict: Any, *, defer: bool = False) -> TurnMeter:
        """A meter that does nothing."""
        return _Unmetered(self, user, None)


def incoming(tag: str, variant: str, n: int) -> Incoming:
    """Turn n of a variant: round robin over its private chats."""
    user = f"{tag}{variant}-u{n % USERS}"
    return Incoming(
        platform="telegram",
        user_id=user,
        chat_id=user,
        user_name=f"User {n % USERS}",
        text=f"Message {n}: what is on my list for today, and anything due this week?",
        message_id=f"{tag}{variant}-m{n}",
    )


async def timed_turn(core: Core, inc: Incoming) -> float:
    """One turn's ms through Core.handle (fails unless it is answered)."""
    t0 = time.perf_counter()
    last = None
    async for event in core.handle(inc):
        last = event
    ms = (time.perf_counter() - t0) * 1000
    if not isinstance(last, Assistant):
        raise RuntimeError(f"turn not answered: {last!r}")
    return ms


@asynccontextmanager
async def cores(db: BenchDatabase, llm_url: str) -> AsyncIterator[dict[str, Core]]:
    """The three variants' Cores on one database."""
    async with AsyncExitStack() as stack:
        made = {
            "none": await stack.enter_async_context(bench_core(db.dsn, llm_url)),
            "recorded": await stack.enter_async_context(bench_core(db.dsn, llm_url)),
            "budgets": await stack.enter_async_context(bench_core(db.dsn, llm_url, settings=BUDGETS)),
        }
        off = made["none"]
        off.spending = _NoSpending(off.pool, off.settings, off.clock)
        try:
            yield made
        finally:
            for core in made.values():
                await core.drain(5.0)


def line(name: str, ms: Sequence[float]) -> str:
    """`recorded  p50 … (spread)`."""
    return f"    {name:<9} {spread(sorted(ms))}"


async def bench(args: argparse.Namespace) -> int:
    """Run the rounds and print the figures; 1 when the goal is missed."""
    async with bench_database() as db, FakeLLMProcess(0.0) as llm, cores(db, llm.base_url) as made:
        print(
            f"== {args.turns} rounds after {args.warmup} warm-up: one private turn of each variant per round, "
            f"{USERS} users each, the model answering at once =="
        )
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for n in range(args.warmup + args.turns):
            order = VARIANTS[n % 3 :] + VARIANTS[: n % 3]
            for variant in order:
                ms = await timed_turn(made[variant], incoming(db.tag, variant, n))
                if n >= args.warmup:
                    times[variant].append(ms)
        for core in made.values():
            await core.spending.flush()
        rows = await made["none"].pool.fetchval("SELECT count(*) FROM token_usage")
        print(f"  per turn, through Core.handle ({rows} usage rows written):")
        for variant in VARIANTS:
            print(line(variant, times[variant]))
        p50 = {v: percentile(sorted(times[v]), 50) for v in VARIANTS}
        p99 = {v: percentile(sorted(times[v]), 99) for v in VARIANTS}
        check, record = p50["budgets"] - p50["recorded"], p50["recorded"] - p50["none"]
        print(f"  recording usage adds:      p50 {record:+.3f} ms, p99 {p99['recorded'] - p99['none']:+.3f} ms")
        print(f"  [HEADLINE] the budget check adds: {goal_line('p50', check, GOAL_CHECK_MS)}")
        print(f"             p99 {p99['budgets'] - p99['recorded']:+.3f} ms")
        total = p50["budgets"] - p50["none"]
        print(f"  both together (budgets vs none): p50 {total:+.3f} ms, p99 {p99['budgets'] - p99['none']:+.3f} ms")
        return int(check > GOAL_CHECK_MS)


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when the goal is missed."""
    p = parser("budget", __doc__)
    p.add_argument("--turns", type=int, default=1000, help="measured rounds (1000): a turn of each variant per round")
    p.add_argument("--warmup", type=int, default=50, help="warm-up rounds (50)")
    args = parse(p, argv, {"turns": 100, "warmup": 20})
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
