"""Slack end to end: a user's message pushed over the fake Socket Mode websocket (tests.fake_slack) until the fake
records the bot's chat.postMessage, through the real slack_sdk, the SlackAdapter (stored in the inbox, acked, answered)
and the Core on a real PostgreSQL, the fake model answering at once from its own process (the fake Slack runs on the
bot's event loop, so its CPU is in the figures). Sequential turns of 8 users, each alternating between a DM and an
@mention in a channel (answered in its thread). Goal: the same as Telegram's and Discord's, p50 ≤ 10 ms and p99 ≤ 20 ms,
every message answered. PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server.
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import slack_sdk

from adapters.slack import SlackAdapter
from bench.common import (
    BenchDatabase,
    CpuMeter,
    FakeLLMProcess,
    bench_core,
    bench_database,
    parse,
    parser,
    quiet_logging,
    spread,
)
from tests.fake_slack import BOT_USER, GROUP, FakeSlack

SEQ_USERS = 8
TEXT = "what is on my list for today?"


class TimedFakeSlack(FakeSlack):
    """FakeSlack that stamps when each bot message joined `sent`."""

    def __init__(self) -> None:
        """The default fake, with 8 people."""
        super().__init__()
        self.sent_at: list[float] = []  # parallel to `sent`

    def _notify(self) -> None:
        """Stamp the bot messages that joined `sent` since the last change."""
        now = time.monotonic()
        self.sent_at.extend([now] * (len(self.sent) - len(self.sent_at)))
        super()._notify()


@dataclass
class Rig:
    """A running bot (the real adapter and core) and its fakes."""

    fake: TimedFakeSlack
    llm: FakeLLMProcess
    users: list[str]
    turns_done: int = 0


@asynccontextmanager
async def make_rig(db: BenchDatabase, llm: FakeLLMProcess) -> AsyncIterator[Rig]:
    """The production wiring (create_pool defaults, LLM.from_settings) with Slack pointed at the fake."""
    async with TimedFakeSlack() as fake:
        api = {"SLACK_BOT_TOKEN": fake.token, "SLACK_APP_TOKEN": fake.app_token, "SLACK_API_BASE_URL": fake.api_base}
        users = [fake.person(f"U0BENCH{i:02d}", f"user{i}").id for i in range(SEQ_USERS)]
        async with bench_core(db.dsn, llm.base_url, settings=api) as core:
            adapter = SlackAdapter(core, core.settings)
            await adapter.start()
            try:
                yield Rig(fake, llm, users)
            finally:
                await core.drain(5.0)
                await adapter.stop()


@dataclass(frozen=True)
class TurnTimes:
    """One turn's figures (time.monotonic())."""

    dm: bool
    pushed: float
    sent: float
    ok: bool

    @property
    def ms(self) -> float:
        """Pushed → reply recorded, in ms."""
        return (self.sent - self.pushed) * 1000


async def one_turn(rig: Rig) -> TurnTimes:
    """Push one message (a DM or a channel mention) and wait for the fake to record the bot's reply."""
    fake, n = rig.fake, rig.turns_done
    rig.turns_done += 1
    user = rig.users[n % len(rig.users)]
    dm = (n + n // len(rig.users)) % 2 == 0
    channel = fake.dm_of(user) if dm else GROUP
    text = f"{TEXT} (#{n})" if dm else f"<@{BOT_USER}> {TEXT} (#{n})"
    before = len(fake.sent)
    pushed = time.monotonic()
    await fake.push("events_api", fake.post(user, text, channel=channel))
    await fake.wait_for(lambda: len(fake.sent) > before, 30.0, what="the reply")
    reply = fake.sent[before]
    ok = reply["channel"] == channel and str(reply["text"]).startswith("ok")
    return TurnTimes(dm, pushed, fake.sent_at[before], ok)


async def part_sequential(rig: Rig, meter: CpuMeter, turns: int, warmup: int) -> int:
    """The headline: sequential turns; how many lacked the expected reply."""
    for _ in range(warmup):
        await one_turn(rig)
    print(f"== Message in → reply out: {turns} sequential turns after {warmup} warm-up, {SEQ_USERS} users ==")
    await rig.llm.stats()  # reset
    first = len(rig.fake.calls)
    meter.start()
    t0 = time.monotonic()
    times = [await one_turn(rig) for _ in range(turns)]
    wall = time.monotonic() - t0
    cpu = meter.stop((await rig.llm.stats()).cpu_s)
    bad = sum(not t.ok for t in times)
    print(f"  {turns} turns, {bad} without the expected reply; {turns / wall:.1f} turns/s")
    print(f"    [HEADLINE] all        {spread(sorted(t.ms for t in times))}")
    print(f"               DMs        {spread(sorted(t.ms for t in times if t.dm))}")
    print(f"               channel @  {spread(sorted(t.ms for t in times if not t.dm))}")
    methods = Counter(m for m, _ in rig.fake.calls[first:])
    print("    Web API calls per turn: " + ", ".join(f"{m} {k / turns:.2f}" for m, k in methods.most_common()))
    print(f"    {cpu.line(turns)}")
    return bad


async def bench(args: argparse.Namespace) -> int:
    """Run and print the figures; 1 when a message lacked its reply."""
    async with bench_database() as db:
        print(f"slack_sdk {slack_sdk.version.__version__}; SlackAdapter + Core; the fake model answers 'ok' at once")
        print()
        async with FakeLLMProcess(0.0) as llm, make_rig(db, llm) as rig:
            bad = await part_sequential(rig, CpuMeter(db.postmaster), args.turns, args.warmup)
    return int(bad > 0)


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when some message lacked the expected reply."""
    p = parser("slack_overhead", __doc__)
    p.add_argument("--turns", type=int, default=300, help="measured sequential turns (300)")
    p.add_argument("--warmup", type=int, default=30, help="warm-up turns (30)")
    args = parse(p, argv, {"turns": 60, "warmup": 10})
    if args.turns < 1 or args.warmup < 0:
        p.error("--turns must be at least 1 and --warmup not negative")
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
