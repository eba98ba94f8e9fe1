"""Discord end to end: a user's message dispatched through the fake gateway (tests.fake_discord) until the fake records
the bot's reply (POST /channels/{id}/messages), through the real discord.py, the DiscordAdapter and the Core on a
real PostgreSQL, the fake model answering at once from its own process (the fake Discord runs on the bot's event
loop, so its CPU is in the figures). Part 1, the headline, runs sequential turns of 8 users, each alternating
between a DM and an @mention in a guild channel (the figures in docs/architecture.md: p50 about 9 ms, p99 about 13
ms, and every message answered); part 2 splits a turn at the core's front door (discord.py and the adapter's share,
about 1.3 ms in docs/architecture.md); `--profile` adds a cProfile. Goal: the same as Telegram's, p50 ≤ 10 ms and
p99 ≤ 20 ms, every message answered. PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import logging
import re
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import discord
from aiohttp import web

from adapters.discord import DiscordAdapter
from bench.common import (
    BenchDatabase,
    CoreTrace,
    CpuMeter,
    FakeLLMProcess,
    bench_core,
    bench_database,
    parse,
    parser,
    print_timeline,
    profiled,
    quiet_logging,
    spread,
)
from core.front_door import Core
from tests.fake_discord import FakeDiscord

SEQ_USERS = 8
SEQ_USER_BASE = 310_000_000_000_000_000  # snowflake-sized ids (the fake's mention pattern wants 15-21 digits)
TEXT = "what is on my list for today?"
POST = "POST /channels/{id}/messages"
_IDS = re.compile(r"(?<=/)\d+")


@dataclass(frozen=True)
class RestCall:
    """One REST request as the fake saw it (time.monotonic())."""

    route: str  # "POST /channels/{id}/messages"
    t_in: float  # its handler started


class TimedFakeDiscord(FakeDiscord):
    """FakeDiscord that logs each REST request and when each bot message was recorded in `sent`."""

    def __init__(self) -> None:
        """The default fake (one guild, #general, the bot user)."""
        super().__init__()
        self.log: list[RestCall] = []
        self.sent_at: list[float] = []  # parallel to `sent`

    async def _rest(self, request: web.Request, path: str | None) -> web.StreamResponse:
        """Note the route and when its handler started."""
        self.log.append(RestCall(f"{request.method} {_IDS.sub('{id}', path or request.path)}", time.monotonic()))
        return await super()._rest(request, path)

    def _notify(self) -> None:
        """Stamp the bot messages that joined `sent` since the last change (the fake notifies on every change)."""
        now = time.monotonic()
        self.sent_at.extend([now] * (len(self.sent) - len(self.sent_at)))
        super()._notify()


@dataclass
class Rig:
    """A running bot (the real adapter and core) and its fakes."""

    fake: TimedFakeDiscord
    llm: FakeLLMProcess
    core: Core
    users: list[dict[str, Any]]
    turns_done: int = 0


@asynccontextmanager
async def make_rig(db: BenchDatabase, llm: FakeLLMProcess) -> AsyncIterator[Rig]:
    """The production wiring (create_pool defaults, LLM.from_settings) with Discord pointed at the fake."""
    async with TimedFakeDiscord() as fake:
        api = {
            "DISCORD_BOT_TOKEN": fake.token,
            "DISCORD_API_BASE_URL": fake.api_base,
            "DISCORD_GATEWAY_URL": fake.gateway_url,
        }
        async with bench_core(db.dsn, llm.base_url, settings=api) as core:
            adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
            await adapter.start()
            try:
                users = [fake.user(SEQ_USER_BASE + i, f"user{i}") for i in range(SEQ_USERS)]
                yield Rig(fake, llm, core, users)
            finally:
                await core.drain(5.0)  # as the bot stops: running turns first, then the adapter
                await adapter.stop()  # before the fake stops: a client losing its server logs errors


@dataclass(frozen=True)
class TurnTimes:
    """One turn's figures (time.monotonic())."""

    dm: bool
    pushed: float  # post_message called
    dispatched: float  # post_message returned: the fake wrote the gateway frame
    sent: float  # the fake recorded the reply in `sent`
    ok: bool  # one reply, in the right channel, saying "ok"
    calls_from: int  # index into fake.log when the turn started

    @property
    def ms(self) -> float:
        """post_message → reply recorded, in ms."""
        return (self.sent - self.pushed) * 1000


async def wait_sent(fake: FakeDiscord, n: int, timeout: float) -> None:
    """fake.wait_sent(n) without its eager timeout message (built per call from everything sent so far)."""
    await fake.wait_for(lambda: len(fake.sent) >= n, timeout, what=f"{n} sent message(s)")


async def one_turn(rig: Rig) -> TurnTimes:
    """Post one message (a DM or a guild mention) and wait for the fake to record the bot's reply."""
    fake, n = rig.fake, rig.turns_done
    rig.turns_done += 1
    user = rig.users[n % len(rig.users)]
    dm = (n + n // len(rig.users)) % 2 == 0  # every user alternates between DM and guild
    channel = fake.dm_channel_id(user["id"]) if dm else str(fake.channel_id)
    before, calls_from = len(fake.sent), len(fake.log)
    pushed = time.monotonic()
    await fake.post_message(user, f"{TEXT} (#{n})", dm=dm, mention_bot=not dm)
    dispatched = time.monotonic()
    await wait_sent(fake, before + 1, 30.0)
    reply = fake.sent[before]
    ok = reply["channel_id"] == channel and str(reply["content"]).startswith("ok")
    return TurnTimes(dm, pushed, dispatched, fake.sent_at[before], ok, calls_from)


async def part_sequential(rig: Rig, meter: CpuMeter, turns: int, warmup: int) -> int:
    """The headline: sequential turns; how many lacked the expected reply."""
    for _ in range(warmup):
        await one_turn(rig)
    print(f"== 1. Message in → reply out: {turns} sequential turns after {warmup} warm-up, {SEQ_USERS} users ==")
    await rig.llm.stats()  # reset
    first = len(rig.fake.log)
    meter.start()
    t0 = time.monotonic()
    times = [await one_turn(rig) for _ in range(turns)]
    wall = time.monotonic() - t0
    cpu = meter.stop((await rig.llm.stats()).cpu_s)
    bad = sum(not t.ok for t in times)
    print(f"  {turns} turns, {bad} without the expected reply; {turns / wall:.1f} turns/s")
    print(f"    [HEADLINE] all      {spread(sorted(t.ms for t in times))}")
    print(f"               DMs      {spread(sorted(t.ms for t in times if t.dm))}")
    print(f"               guild @  {spread(sorted(t.ms for t in times if not t.dm))}")
    routes = Counter(c.route for c in rig.fake.log[first:])
    print("    REST calls per turn: " + ", ".join(f"{r} {k / turns:.2f}" for r, k in routes.most_common()))
    print(f"    {cpu.line(turns)}")
    print()
    return bad


STEPS = (
    "→ post_message returned  [fake Discord, in the bot's process: message, JSON, websocket write]",
    "→ the turn starts  [discord.py: frame → Message, event task; adapter: addressed?, Incoming, Core.answer]",
    "→ the request reaches the fake model  [core: checks, begin_turn, prompt; openai SDK]",
    "→ the Assistant event leaves the core  [fake model, SSE, SDK parsing; finish_turn]",
    "→ POST …/messages reaches the fake  [adapter: render; discord.py REST, rate limiter]",
    "→ recorded in `sent`  [fake Discord's handler]",
)


async def part_breakdown(rig: Rig, turns: int) -> None:
    """Where a turn's wall time goes, from timestamps at the core's front door and at the two fakes."""
    print(f"== 2. Where the time goes: {turns} sequential turns, split at the core's front door ==")
    await rig.llm.stats()  # reset
    times: list[TurnTimes] = []
    with CoreTrace().on(rig.core) as trace:
        for _ in range(turns):
            times.append(await one_turn(rig))
            await asyncio.sleep(0.005)  # the turn's tail (typing task cancelled, its own MESSAGE_CREATE); not timed
            trace.next()
    arrivals: list[float | None] = list((await rig.llm.stats()).arrivals)
    if len(arrivals) != turns:
        print(f"  (the fake model saw {len(arrivals)} requests for {turns} turns: its step is folded into the next)")
        arrivals = [None] * turns
    columns: dict[str, list[list[tuple[str, float | None]]]] = {"DM": [], "guild": []}
    for t, marks, arrival in zip(times, trace.done, arrivals, strict=True):
        post = next((c.t_in for c in rig.fake.log[t.calls_from :] if c.route == POST and c.t_in >= t.pushed), None)
        points = [("push", t.pushed), ("dispatched", t.dispatched), ("handle", marks.get("handle"))]
        points += [("model", arrival), ("Assistant", marks.get("Assistant")), ("post", post), ("sent", t.sent)]
        columns["DM" if t.dm else "guild"].append(points)
    print_timeline(columns, STEPS)
    print()


async def part_profile(rig: Rig, turns: int) -> None:
    """cProfile of the whole bot process (discord.py, adapters, core, asyncpg, openai and the fake Discord)."""
    print(f"== 3. cProfile of {turns} sequential turns ==")
    with profiled(turns):
        for _ in range(turns):
            await one_turn(rig)
    print()


async def bench(args: argparse.Namespace) -> int:
    """Run the parts and print their figures; 1 when a message lacked its reply."""
    async with bench_database() as db:
        print(f"discord.py {discord.__version__}; DiscordAdapter + Core; the fake model answers 'ok' at once")
        print()
        async with FakeLLMProcess(0.0) as llm, make_rig(db, llm) as rig:
            bad = await part_sequential(rig, CpuMeter(db.postmaster), args.turns, args.warmup)
            if args.breakdown_turns:
                await part_breakdown(rig, args.breakdown_turns)
            if args.profile:
                await part_profile(rig, args.profile_turns)
    return int(bad > 0)


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when some message lacked the expected reply."""
    p = parser("discord_overhead", __doc__)
    p.add_argument("--turns", type=int, default=300, help="measured sequential turns (300)")
    p.add_argument("--warmup", type=int, default=30, help="warm-up turns (30)")
    p.add_argument("--breakdown-turns", type=int, default=150, help="traced turns in part 2 (150; 0 skips)")
    p.add_argument("--profile", action="store_true", help="add a cProfile (part 3)")
    p.add_argument("--profile-turns", type=int, default=200, help="turns to profile (200)")
    args = parse(p, argv, {"turns": 60, "warmup": 10, "breakdown_turns": 30, "profile_turns": 30})
    if args.turns < 1 or args.warmup < 0:
        p.error("--turns must be at least 1 and --warmup not negative")
    quiet_logging()
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    logging.getLogger("discord.client").addFilter(lambda r: "voice will NOT be supported" not in r.getMessage())
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
