"""Discord end-to-end overhead: the real discord.py against the fake REST API + gateway, on a real PostgreSQL.

Run with `uv run python -m bench.discord_overhead` (or `uv run python bench/discord_overhead.py`).

Each turn dispatches a user's message (MESSAGE_CREATE) through tests.fake_discord.FakeDiscord's gateway and
times it until the fake records the bot's reply (POST /channels/{id}/messages lands in `fake.sent`): discord.py
reads the websocket frame and builds the Message, adapters.discord checks it is addressed and starts the
typing indicator, the core runs (PostgreSQL + the instant fake LLM in its own process), the adapter renders
the reply and discord.py sends it through its REST client and per-route rate limiter. The fake Discord server
runs on the bot's own event loop, so its CPU is inside the figure; its REST handler time is printed apart.
Turns alternate across 8 users, each of them alternating between a DM and an @mention in the guild channel.
Part 2 dispatches a burst of messages from distinct users at once; part 3 traces each layer's share of a turn;
`--profile` adds a cProfile. PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import cProfile
import itertools
import logging
import re
import statistics
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import discord
from aiohttp import web
from pydantic import SecretStr

from adapters.discord import DiscordAdapter
from bench.common import (
    FakeLLMProcess,
    Marks,
    Tracer,
    bench_core,
    bench_database,
    load_average,
    percentile,
    quiet_logging,
    server_info,
    traced_handle,
)
from bench.turn_overhead import CpuMeter, CpuUse, print_profile
from core.front_door import Core
from tests.fake_discord import FakeDiscord

SEQ_USERS = 8
SEQ_USER_BASE = 310_000_000_000_000_000  # snowflake-sized ids (the fake's mention pattern wants 15-21 digits)
BURST_USER_BASE = 320_000_000_000_000_000
TEXT = "what is on my list for today?"
_IDS = re.compile(r"(?<=/)\d+")


# ---------------------------------------------------------------- the timed fake Discord


@dataclass(frozen=True)
class RestCall:
    """One REST request as the fake saw it (time.monotonic())."""

    route: str  # "POST /channels/{id}/messages"
    t_in: float  # the handler started (aiohttp has parsed the request line and headers)
    t_out: float  # the handler returned its response (aiohttp still has to write it)

    @property
    def work_s(self) -> float:
        """Time inside the fake's REST handler."""
        return self.t_out - self.t_in


class TimedFakeDiscord(FakeDiscord):
    """FakeDiscord that logs each REST request's handler time and when each bot message was recorded."""

    def __init__(self) -> None:
        """The default fake (one guild, #general, the bot user)."""
        super().__init__()
        self.log: list[RestCall] = []
        self.sent_at: list[float] = []  # parallel to `sent`: when the message was appended to it

    async def _rest(self, request: web.Request, path: str | None) -> web.StreamResponse:
        """Time the whole REST handler (routing, body decoding, the route, the JSON response)."""
        t0 = time.monotonic()
        try:
            return await super()._rest(request, path)
        finally:
            self.log.append(
                RestCall(f"{request.method} {_IDS.sub('{id}', path or request.path)}", t0, time.monotonic())
            )

    async def _dispatch(self, event: str, data: Any) -> None:
        """Stamp a bot message the moment it joined `sent` (create_message dispatches right after appending)."""
        if len(self.sent_at) < len(self.sent):
            now = time.monotonic()
            self.sent_at.extend([now] * (len(self.sent) - len(self.sent_at)))
        await super()._dispatch(event, data)


# ---------------------------------------------------------------- the bot


@dataclass
class Rig:
    """A running bot (the real adapter and core) and its fakes."""

    fake: TimedFakeDiscord
    llm_server: FakeLLMProcess
    core: Core
    adapter: DiscordAdapter
    users: list[dict[str, Any]]
    turns_done: int = 0


@asynccontextmanager
async def make_rig(dsn: str, llm_server: FakeLLMProcess) -> AsyncIterator[Rig]:
    """The production wiring (create_pool defaults, LLM.from_settings) with Discord pointed at the fake."""
    async with TimedFakeDiscord() as fake:
        update = {
            "DISCORD_BOT_TOKEN": SecretStr(fake.token),
            "DISCORD_API_BASE_URL": fake.api_base,
            "DISCORD_GATEWAY_URL": fake.gateway_url,
        }
        async with bench_core(dsn, llm_server.base_url, own_capabilities_dir=True, settings_update=update) as core:
            adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
            await adapter.start()
            try:
                users = [fake.user(SEQ_USER_BASE + i, f"user{i}") for i in range(SEQ_USERS)]
                yield Rig(fake, llm_server, core, adapter, users)
            finally:
                await adapter.stop()  # before the fake stops: a client losing its server logs errors


@dataclass(frozen=True)
class TurnTimes:
    """One turn's figures (time.monotonic())."""

    dm: bool
    pushed: float  # post_message called
    dispatched: float  # post_message returned: the fake wrote the gateway frame
    sent: float  # the fake recorded the reply in `sent`
    woke: float  # wait_sent returned in the benchmark's coroutine
    ok: bool  # one reply, in the right channel, saying "ok"
    calls_from: int  # index into fake.log when the turn started

    @property
    def ms(self) -> float:
        """post_message → reply recorded, in ms."""
        return (self.sent - self.pushed) * 1000


async def wait_sent(fake: FakeDiscord, n: int, timeout: float) -> None:
    """fake.wait_sent(n) without its eager timeout message (a list of every content sent so far, built per call)."""
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
    woke = time.monotonic()
    reply = fake.sent[before]
    ok = len(fake.sent) == before + 1 and reply["channel_id"] == channel and str(reply["content"]).startswith("ok")
    return TurnTimes(dm, pushed, dispatched, fake.sent_at[before], woke, ok, calls_from)


async def run_turns(rig: Rig, turns: int) -> list[TurnTimes]:
    """`turns` sequential turns, each starting as soon as the previous reply was recorded."""
    return [await one_turn(rig) for _ in range(turns)]


# ---------------------------------------------------------------- part 1: sequential turns


def _stats_line(ms: list[float]) -> str:
    """p50/p90/p99/max/mean of sorted ms figures."""
    return (
        f"p50 {percentile(ms, 50):6.2f}  p90 {percentile(ms, 90):6.2f}  p99 {percentile(ms, 99):6.2f}  "
        f"max {ms[-1]:6.2f}  mean {statistics.fmean(ms):6.2f} ms  (min {ms[0]:.2f})"
    )


async def part_sequential(rig: Rig, meter: CpuMeter, turns: int, warmup: int) -> int:
    """The headline: sequential turns; returns how many lacked the expected reply."""
    await run_turns(rig, warmup)
    print(
        f"== 1. Message in → reply out: {turns} sequential turns after {warmup} warm-up, {SEQ_USERS} users, "
        "each alternating DM / guild @mention; the fake LLM answers instantly ('ok', no tool calls) =="
    )
    await rig.llm_server.stats()  # reset
    first = len(rig.fake.log)
    meter.start()
    t0 = time.monotonic()
    times = await run_turns(rig, turns)
    wall = time.monotonic() - t0
    llm = await rig.llm_server.stats()
    cpu: CpuUse = meter.stop(llm.cpu_s)
    calls = rig.fake.log[first:]
    bad = sum(not t.ok for t in times)
    print(f"  {turns} turns, {bad} without the expected reply; {turns / wall:.1f} turns/s")
    print(f"    [HEADLINE] all     {_stats_line(sorted(t.ms for t in times))}")
    for dm, label in ((True, "DMs    "), (False, "guild @")):
        ms = sorted(t.ms for t in times if t.dm == dm)
        if ms:
            print(f"               {label} {_stats_line(ms)}")
    print(
        "    (post_message called → the fake appends the reply to `sent`; the fake LLM answers instantly, so "
        "this is the bot's own overhead plus the fakes' share)"
    )
    post = sorted((t.dispatched - t.pushed) * 1000 for t in times)
    woke = sorted((t.woke - t.pushed) * 1000 for t in times)
    print(
        f"    inside that: post_message itself (the fake builds the message, JSON, writes the frame) "
        f"p50 {percentile(post, 50):.2f} ms; the benchmark's wait_sent() wakes at p50 {percentile(woke, 50):.2f} ms"
    )
    per_route = Counter(c.route for c in calls)
    print(
        "    REST calls per turn: "
        + ", ".join(f"{r} {k / turns:.2f}" for r, k in sorted(per_route.items(), key=lambda kv: (-kv[1], kv[0])))
    )
    work: dict[str, float] = defaultdict(float)
    for c in calls:
        work[c.route] += c.work_s
    total_work = sum(work.values()) * 1000 / turns
    print(
        f"    fake Discord REST handler time (in the bot's process): {total_work:.2f} ms/turn = "
        + ", ".join(f"{r} {s * 1000 / turns:.2f}" for r, s in sorted(work.items(), key=lambda kv: -kv[1]))
    )
    print(
        f"    p50 minus the fake's REST handler time and post_message: "
        f"{percentile(sorted(t.ms for t in times), 50) - total_work - percentile(post, 50):.2f} ms"
    )
    print(f"    {cpu.line(turns, 'turn')}")
    print(
        f"    fake LLM: {llm.requests} requests, {llm.handler_s * 1000 / max(1, llm.requests):.2f} ms/request "
        "inside its handler (own process)"
    )
    print()
    return bad


# ---------------------------------------------------------------- part 2: a burst


@dataclass(frozen=True)
class BurstResult:
    """One burst: per-message latencies and the wall time until every reply was recorded."""

    ms: list[float]  # sorted, per message
    wall_ms: float  # first post_message → last reply recorded
    post_ms: float  # dispatching all of them (the fake's side)
    bad: int
    routes: Counter[str]  # REST calls that reached the fake while waiting for the replies


async def burst(rig: Rig, users: list[dict[str, Any]], *, dm: bool) -> BurstResult:
    """Every user posts one message at once (dispatched back to back); wait for all the replies."""
    fake = rig.fake
    before = len(fake.sent)
    posted_at: dict[str, float] = {}  # DM: channel id; guild: message id
    t0 = time.monotonic()
    for i, user in enumerate(users):
        message = await fake.post_message(user, f"{TEXT} (burst {i})", dm=dm, mention_bot=not dm)
        posted_at[message["channel_id"] if dm else message["id"]] = time.monotonic()
    posted = time.monotonic()
    calls_from = len(fake.log)
    await wait_sent(fake, before + len(users), 120.0)
    replies, stamps = fake.sent[before:], fake.sent_at[before:]
    ms: list[float] = []
    for reply, at in zip(replies, stamps, strict=True):
        key = reply["channel_id"] if dm else (reply.get("message_reference") or {}).get("message_id")
        start = posted_at.pop(str(key), None)
        if start is not None and str(reply["content"]).startswith("ok"):
            ms.append((at - start) * 1000)
    bad = len(users) - len(ms) + max(0, len(replies) - len(users))
    routes = Counter(c.route for c in fake.log[calls_from:])
    return BurstResult(sorted(ms), (max(stamps) - t0) * 1000, (posted - t0) * 1000, bad, routes)


async def part_burst(rig: Rig, n: int) -> int:
    """`n` distinct users at once: first contact, again once known, and all in one guild channel."""
    print(
        f"== 2. Burst: {n} messages from {n} distinct users dispatched at once (each answered by its own "
        "discord.py task); wall time until every reply is recorded =="
    )
    users = [rig.fake.user(BURST_USER_BASE + i, f"burst{i}") for i in range(n)]
    bad = 0
    runs = (
        ("DMs, first contact (new users, new DM channels)", True),
        ("DMs again, the same users now known", True),
        ("@mentions in one guild channel (one conversation: the core's chat lock serialises the turns)", False),
    )
    for label, dm in runs:
        await asyncio.sleep(1.2)  # let discord.py's per-route buckets (the fake says 1 s windows) reset; not timed
        r = await burst(rig, users, dm=dm)
        bad += r.bad
        print(f"  {label}:")
        print(
            f"    wall {r.wall_ms:7.1f} ms = {r.wall_ms / n:.2f} ms/message (dispatching all {n} took "
            f"{r.post_ms:.1f} ms); {r.bad} without the expected reply"
        )
        if r.ms:
            print(f"    per message: {_stats_line(r.ms)}")
        print(
            "    REST calls reaching the fake by the last reply: "
            + ", ".join(f"{route} {k}" for route, k in sorted(r.routes.items()))
        )
    print()
    return bad


# ---------------------------------------------------------------- part 3: where the time goes


@contextmanager
def traced(rig: Rig, tracer: Tracer) -> Iterator[None]:
    """Wrap the adapter's on_message and Core.handle to mark when each layer starts and what it yields."""
    adapter = rig.adapter
    orig_on_message = adapter.on_message

    async def on_message(message: discord.Message) -> None:
        if not message.author.bot:
            tracer.cur.mark("on_message")
        await orig_on_message(message)

    adapter.on_message = on_message  # type: ignore[method-assign]
    try:
        with traced_handle(rig.core, tracer):
            yield
    finally:
        del adapter.on_message  # back to the class's method


SEGMENTS = (
    ("post_message → returned", "fake Discord (bot's process): build the message, JSON snapshot, websocket write"),
    ("→ adapter.on_message entered", "discord.py: websocket read, JSON, parse_message_create, Message, event task"),
    ("→ core.handle called", "adapter: addressed?, text, Incoming, typing task"),
    ("→ LLM request reaches the fake LLM", "core: checks, chat lock, begin_turn, prompt, SDK"),
    ("→ Assistant event in the adapter", "fake LLM (own process) + SSE back + SDK parsing + finish_turn"),
    ("→ POST …/messages reaches the fake", "adapter render_reply + discord.py REST (route, rate limiter, aiohttp)"),
    ("   … until recorded in `sent`", "fake Discord handler: body, validation, store"),
)


def turn_segments(t: TurnTimes, m: Marks, calls: list[RestCall], llm_arrival: float) -> list[float] | None:
    """The turn's timeline split at the marks (seconds, as SEGMENTS), or None when a mark is missing."""
    post = next((c for c in calls if c.route == "POST /channels/{id}/messages" and c.t_in >= t.pushed), None)
    if post is None or any(k not in m.at for k in ("on_message", "core", "Assistant")):
        return None
    points = [
        t.pushed,
        t.dispatched,
        m.at["on_message"],
        m.at["core"],
        llm_arrival,
        m.at["Assistant"],
        post.t_in,
        t.sent,
    ]
    return [b - a for a, b in itertools.pairwise(points)]


async def part_breakdown(rig: Rig, turns: int) -> None:
    """Timestamps through each turn: which layer the time goes to (wall time)."""
    print(
        f"== 3. Where the time goes: {turns} sequential turns traced at each layer (wall time, medians; the "
        "segments add up to the total) =="
    )
    await rig.llm_server.stats()  # reset
    tracer = Tracer()
    times: list[TurnTimes] = []
    with traced(rig, tracer):
        for _ in range(turns):
            times.append(await one_turn(rig))
            await asyncio.sleep(0.005)  # the turn's tail (typing task cancelled, own MESSAGE_CREATE echo)
            tracer.next()
    llm = await rig.llm_server.stats()
    if len(llm.arrivals) != turns:
        print(f"  (the fake LLM saw {len(llm.arrivals)} requests for {turns} turns: no breakdown)")
        return
    rows: dict[bool, list[list[float]]] = {True: [], False: []}
    typing: list[float] = []
    for t, m, arrival in zip(times, tracer.done, llm.arrivals, strict=True):
        calls = rig.fake.log[t.calls_from :]
        seg = turn_segments(t, m, calls, arrival)
        if seg is not None:
            rows[t.dm].append(seg)
        tp = next((c for c in calls if c.route == "POST /channels/{id}/typing" and c.t_in >= t.pushed), None)
        if tp is not None:
            typing.append(tp.t_in - t.pushed)
    print(
        f"  {len(rows[True]) + len(rows[False])} of {turns} turns fully traced (tracing adds a few µs); "
        "the 5 ms pause after each turn is not timed"
    )

    def med(values: list[float]) -> str:
        return f"{percentile(sorted(values), 50) * 1000:8.3f}" if values else f"{'-':>8}"

    print(f"    {'DM':>8} {'guild':>8}  segment  [who]")
    for i, (label, owner) in enumerate(SEGMENTS):
        print(f"    {med([r[i] for r in rows[True]])} {med([r[i] for r in rows[False]])}  {label}  [{owner}]")
    print(f"    {med([sum(r) for r in rows[True]])} {med([sum(r) for r in rows[False]])}  total")
    if typing:
        print(
            f"  the typing task's POST …/typing reaches the fake {med(typing).strip()} ms after post_message: its "
            "discord.py + fake-server work shares the loop with the core's DB segment"
        )
    print()


# ---------------------------------------------------------------- part 4: cProfile


async def part_profile(rig: Rig, turns: int) -> None:
    """cProfile of sequential turns."""
    print(
        f"== 4. cProfile of {turns} sequential turns: the whole bot process, i.e. discord.py (+ aiohttp client), "
        "adapters/, core/, asyncpg, openai AND the fake Discord server (aiohttp web_*, tests/) =="
    )
    prof = cProfile.Profile()
    prof.enable()
    await run_turns(rig, turns)
    prof.disable()
    print_profile(prof, turns)
    print()


# ---------------------------------------------------------------- main


async def bench(args: argparse.Namespace) -> int:
    """Run the parts and print their figures."""
    async with bench_database() as db:
        server = await server_info(db.dsn)
        print(f"PostgreSQL {server.version}: {db.description}; synchronous_commit {server.sync_commit}")
        print(
            f"discord.py {discord.__version__}, aiohttp {aiohttp.__version__}; Python {sys.version.split()[0]}, "
            f"{type(asyncio.get_running_loop()).__name__}; host: {load_average()}"
        )
        print(
            "Bot: DiscordAdapter + Core + create_pool defaults; ALLOWED_USERS=*, HISTORY_MESSAGES=40; the fake LLM "
            "answers 'ok' at once from its own process; the fake Discord (REST + gateway) runs on the bot's loop"
        )
        print()
        async with FakeLLMProcess(0.0) as llm_server, make_rig(db.dsn, llm_server) as rig:
            bad = await part_sequential(rig, CpuMeter(server.postmaster), args.turns, args.warmup)
            if args.burst:
                bad += await part_burst(rig, args.burst)
            if args.breakdown_turns:
                await part_breakdown(rig, args.breakdown_turns)
            if args.profile:
                await part_profile(rig, args.profile_turns)
    return int(bad > 0)


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when some message lacked the expected reply."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.discord_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--turns", type=int, default=300, help="measured sequential turns (300)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up turns (30)")
    parser.add_argument("--burst", type=int, default=50, help="messages from distinct users at once (50; 0 skips)")
    parser.add_argument("--breakdown-turns", type=int, default=150, help="traced turns for part 3 (150; 0 skips)")
    parser.add_argument("--profile", action="store_true", help="add a cProfile (part 4)")
    parser.add_argument("--profile-turns", type=int, default=200, help="turns to profile (200)")
    args = parser.parse_args(argv)
    if args.turns < 1 or args.warmup < 0 or args.burst < 0:
        parser.error("--turns must be at least 1, --warmup and --burst not negative")
    quiet_logging()
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    logging.getLogger("discord.client").addFilter(lambda r: "voice will NOT be supported" not in r.getMessage())
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
