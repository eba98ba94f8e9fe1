"""Matrix end to end: a person's message put into the fake homeserver's event log (tests.fake_matrix), where the bot's
waiting /sync long poll sees it, until the fake receives the answer's PUT /send, through the real mautrix ClientAPI,
the MatrixAdapter (stored in the inbox, the sync token kept, answered) and the Core on a real PostgreSQL, the fake
model answering at once from its own process (the fake homeserver runs on the bot's event loop, so its CPU is in the
figures). Sequential turns of 8 people, each in their own direct room; `--mentions` makes every other turn of each
person an @mention in a group room all of them are in. Goal: the same as Telegram's, Discord's and Slack's, p50 ≤ 10
ms and p99 ≤ 20 ms, every message answered. `--telegram` then runs bench.telegram_overhead's headline (part 1: its
pacing, bursts of 8 back to back with a 1 s pause after each) on the same database and fake model, and prints both
side by side. PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server.
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
from importlib.metadata import version

from aiohttp import web

from adapters.matrix.adapter import MatrixAdapter
from bench.common import (
    BenchDatabase,
    CpuMeter,
    CpuUse,
    FakeLLMProcess,
    bench_core,
    bench_database,
    parse,
    parser,
    percentile,
    quiet_logging,
    spread,
)
from bot.app import freeze_startup_objects
from tests.fake_matrix import BOT, BOT_NAME, SERVER, TOKEN, FakeMatrix, Room

SEQ_USERS = 8
TEXT = "what is on my list for today?"
JOIN_WAIT_S = 30.0  # the bot joining the rooms at the start
REPLY_WAIT_S = 30.0  # one turn's answer


class TimedFakeMatrix(FakeMatrix):
    """FakeMatrix that stamps when each of the bot's events reached it, and wakes waiters once it is in `sent`."""

    def __init__(self) -> None:
        """The default fake (the bot's account, no rooms)."""
        super().__init__()
        self.sent_at: list[float] = []  # parallel to `sent`: when the PUT /send that sent it reached the fake

    async def _send(self, request: web.Request) -> web.Response:
        """Time the send; the fake notifies before it files the event in `sent`, so notify again after."""
        t0 = time.monotonic()
        try:
            return await super()._send(request)
        finally:
            self.sent_at.extend([t0] * (len(self.sent) - len(self.sent_at)))
            self._notify()


@dataclass
class Rig:
    """A running bot (the real adapter and core) and its fakes."""

    fake: TimedFakeMatrix
    llm: FakeLLMProcess
    users: list[str]
    directs: list[Room]
    group: Room | None
    turns_done: int = 0


@asynccontextmanager
async def make_rig(db: BenchDatabase, llm: FakeLLMProcess, mentions: bool) -> AsyncIterator[Rig]:
    """The production wiring (create_pool defaults, LLM.from_settings) with Matrix pointed at the fake; each person
    opens a direct room with the bot (and with `mentions` they share a group room it is invited to), joined before
    the first turn."""
    async with TimedFakeMatrix() as fake:
        api = {"MATRIX_HOMESERVER": fake.origin, "MATRIX_USER_ID": BOT, "MATRIX_ACCESS_TOKEN": TOKEN}
        users = [fake.person(f"@bench{i:02d}:{SERVER}", f"user{i}") for i in range(SEQ_USERS)]
        async with bench_core(db.dsn, llm.base_url, settings=api) as core:
            adapter = MatrixAdapter(core, core.settings)
            await adapter.start()
            freeze_startup_objects()  # as bot/app.py does once its adapters run
            try:
                directs = [fake.direct(user) for user in users]
                group = None
                if mentions:
                    group = fake.room(users[0])
                    for user in users[1:]:
                        fake.join(group, user)
                    fake.invite(group, users[0])
                rooms = [*directs, *([group] if group else [])]
                await fake.wait_for(lambda: all(BOT in r.members for r in rooms), JOIN_WAIT_S, what="the bot joining")
                yield Rig(fake, llm, users, directs, group)
            finally:
                await core.drain(5.0)
                await adapter.stop()


@dataclass(frozen=True)
class TurnTimes:
    """One turn's figures (time.monotonic())."""

    direct: bool
    said: float
    sent: float
    ok: bool

    @property
    def ms(self) -> float:
        """The event in the log (a waiting /sync answers it) → the answer's PUT /send at the fake, in ms."""
        return (self.sent - self.said) * 1000


async def one_turn(rig: Rig) -> TurnTimes:
    """One message (in a direct room, or an @mention in the group room) and the wait for the fake to receive the
    bot's answer."""
    fake, n = rig.fake, rig.turns_done
    rig.turns_done += 1
    i = n % len(rig.users)
    user = rig.users[i]
    direct = rig.group is None or (n + n // len(rig.users)) % 2 == 0
    room = rig.directs[i] if direct or rig.group is None else rig.group
    before = len(fake.sent)
    said = time.monotonic()
    if direct:
        fake.say(room, user, f"{TEXT} (#{n})")
    else:  # as a client sends a mention "pill": the display name in the body, the id in m.mentions
        fake.say(room, user, f"{BOT_NAME}: {TEXT} (#{n})", mentions=[BOT])
    await fake.wait_for(lambda: len(fake.sent) > before, REPLY_WAIT_S, what="the answer")
    reply = fake.sent[before]
    ok = reply["room_id"] == room.id and str(reply["content"].get("body", "")).startswith("ok")
    return TurnTimes(direct, said, fake.sent_at[before], ok)


@dataclass(frozen=True)
class Figures:
    """A measured run, for the side-by-side table."""

    ms: list[float]  # sorted
    cpu: CpuUse
    turns: int


async def part_sequential(rig: Rig, meter: CpuMeter, turns: int, warmup: int) -> tuple[int, Figures]:
    """The headline: sequential turns; how many lacked the expected answer, and the figures."""
    for _ in range(warmup):
        await one_turn(rig)
    where = "direct rooms and group-room @mentions alternating" if rig.group else "direct rooms"
    print(f"== Event in /sync → answer's send at the homeserver: {turns} sequential turns after {warmup} warm-up,")
    print(f"   {SEQ_USERS} people, {where} ==")
    await rig.llm.stats()  # reset
    fake = rig.fake
    syncs, typing, sent = len(fake.syncs), len(fake.typing), len(fake.sent)
    meter.start()
    t0 = time.monotonic()
    times = [await one_turn(rig) for _ in range(turns)]
    wall = time.monotonic() - t0
    cpu = meter.stop((await rig.llm.stats()).cpu_s)
    bad = sum(not t.ok for t in times)
    ms = sorted(t.ms for t in times)
    print(f"  {turns} turns, {bad} without the expected answer; {turns / wall:.1f} turns/s")
    print(f"    [HEADLINE] all        {spread(ms)}")
    if rig.group is not None:
        print(f"               direct     {spread(sorted(t.ms for t in times if t.direct))}")
        print(f"               group @    {spread(sorted(t.ms for t in times if not t.direct))}")
    kinds = Counter(str(e["type"]) for e in fake.sent[sent:])
    calls = {"/sync": len(fake.syncs) - syncs, "typing": len(fake.typing) - typing, **kinds}
    print("    homeserver calls per turn: " + ", ".join(f"{k} {v / turns:.2f}" for k, v in calls.items()))
    print(f"    {cpu.line(turns)}")
    return bad, Figures(ms, cpu, turns)


async def part_telegram(db: BenchDatabase, llm: FakeLLMProcess, turns: int, warmup: int) -> tuple[int, Figures]:
    """bench.telegram_overhead's part 1 (its pacing and figures) on this run's database and fake model."""
    from bench import telegram_overhead as tg  # PTB only when asked for

    pacing = tg.Pacing()
    async with tg.make_rig(db, llm, 1) as rig:
        await tg.run_turns(rig, warmup, pacing)
        await asyncio.sleep(pacing.pause_s)
        print(
            f"== Telegram (bench.telegram_overhead part 1): {turns} turns after {warmup} warm-up, {pacing.describe()}"
        )
        run = await tg.measured_run(rig, CpuMeter(db.postmaster), turns, pacing, llm)
        tg.print_run(run, pacing.pause_s)
    bad = sum(not t.ok for t in run.turns)
    return bad, Figures(run.ms(after_idle=False), run.cpu, len(run.turns))


def print_side_by_side(matrix: Figures, telegram: Figures) -> None:
    """Matrix's sequential turns beside Telegram's back-to-back ones."""
    print("== Side by side (ms; Matrix: all sequential turns; Telegram: its back-to-back turns) ==")
    print(f"    {'':<22}{'Matrix':>10}{'Telegram':>10}")
    for label, q in (("p50", 50.0), ("p99", 99.0)):
        print(f"    {label:<22}{percentile(matrix.ms, q):10.2f}{percentile(telegram.ms, q):10.2f}")
    per = [f.cpu.bot_s * 1000 / f.turns for f in (matrix, telegram)]
    print(f"    {'bot CPU per turn':<22}{per[0]:10.2f}{per[1]:10.2f}")


async def bench(args: argparse.Namespace) -> int:
    """Run and print the figures; 1 when a message lacked its answer."""
    async with bench_database() as db:
        print(f"mautrix {version('mautrix')}; MatrixAdapter + Core; the fake model answers 'ok' at once")
        print()
        async with FakeLLMProcess(0.0) as llm:
            async with make_rig(db, llm, args.mentions) as rig:
                bad, matrix = await part_sequential(rig, CpuMeter(db.postmaster), args.turns, args.warmup)
            if not args.telegram:
                print()
                print("(for Telegram's figures beside these: --telegram, or python -m bench.telegram_overhead)")
                return int(bad > 0)
            print()
            tg_bad, telegram = await part_telegram(db, llm, args.turns, args.warmup)
            print()
            print_side_by_side(matrix, telegram)
    return int(bad + tg_bad > 0)


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when some message lacked the expected answer."""
    p = parser("matrix_overhead", __doc__)
    p.add_argument("--turns", type=int, default=300, help="measured sequential turns (300)")
    p.add_argument("--warmup", type=int, default=30, help="warm-up turns (30)")
    p.add_argument("--mentions", action="store_true", help="every other turn an @mention in a group room")
    p.add_argument(
        "--telegram", action="store_true", help="then Telegram's headline on the same database, side by side"
    )
    args = parse(p, argv, {"turns": 60, "warmup": 10})
    if args.turns < 1 or args.warmup < 0:
        p.error("--turns must be at least 1 and --warmup not negative")
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
