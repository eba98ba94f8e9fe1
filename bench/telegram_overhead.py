"""Telegram end-to-end overhead: the real python-telegram-bot against the fake Bot API, on a real PostgreSQL.

Run with `uv run python -m bench.telegram_overhead` (or `uv run python bench/telegram_overhead.py`).

Each turn pushes a private-chat text update into tests.fake_telegram.FakeTelegram and times it until the
fake receives the reply's sendMessage: the long poll hands the update to PTB, PTB dispatches it to
adapters.telegram, the core runs (PostgreSQL + the instant fake LLM in its own process), the adapter
streams a draft (sendMessageDraft, only for answers slower than 0.6 s) and sends the answer. Part 0 first
sends 50 users' messages at once to a bot whose model takes 1 s. The fake Telegram server runs on the bot's own
event loop, so its CPU is inside the figure; its handler time is printed separately.

Turns run in bursts back to back with a pause after each burst (not timed): the rate limiter's
window (30 messages in any 1.1 s for a process alone; one sendMessage per turn: typing actions, sent only for
turns slower than 0.3 s, and drafts bypass it) must never fill, or the figures measure its waits
(`--unpaced-turns` shows that). The first turn after each pause is reported apart: a
process that has been idle runs its next turn slower (cold caches / CPU), as a lone message does.
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
Part 2 traces each layer's share, part 3 prices one Bot API call, `--profile` adds a cProfile.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import cProfile
import gc
import itertools
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import telegram
from aiohttp import web
from pydantic import SecretStr
from telegram.constants import FloodLimit

from adapters.telegram import TelegramAdapter
from adapters.telegram.limits import TELEGRAM_RATE_WINDOW_S
from bench.common import (
    BenchDatabase,
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
    verdict,
)
from bench.turn_overhead import CpuMeter, CpuUse, print_profile
from core.front_door import Core
from core.storage import conversations
from core.types import Incoming
from tests.fake_telegram import FakeTelegram

GOAL_P50_MS = 15.0
POLL_TIMEOUT_S = 1
USERS = (7001, 7002, 7003, 7004, 7005)  # private chats: chat id == user id, as on Telegram
NAMES = ("Ann", "Ben", "Cleo", "Dan", "Eva")
MESSAGE_ID_BASE = 1_000_000
MESSAGE_ID_STRIDE = 16  # room for the bot's own message ids in the chat between two incoming ones
LIMITER_RATE = float(FloodLimit.MESSAGES_PER_SECOND)  # the adapter's sends per TELEGRAM_RATE_WINDOW_S (alone)
RATE_LIMITED = frozenset({"sendMessage"})  # what fills the bucket (typing and drafts bypass it)
GOAL_CROWD_S = 2.0
CROWD_USER_BASE = 20_000


# ---------------------------------------------------------------- the timed fake Bot API


@dataclass
class _Request:
    """Timing of the request being handled (one per aiohttp handler task)."""

    start: float
    wait_s: float = 0.0  # long-poll waiting inside getUpdates (idle, not work)
    updates: int = 0  # updates a getUpdates returned


@dataclass(frozen=True)
class ApiCall:
    """One Bot API request as the fake saw it (time.monotonic())."""

    method: str
    t_in: float  # the handler started (aiohttp has parsed the request line and headers)
    t_out: float  # the handler returned its response (aiohttp still has to write it)
    wait_s: float
    updates: int

    @property
    def work_s(self) -> float:
        """Time inside the handler minus long-poll waiting."""
        return max(0.0, self.t_out - self.t_in - self.wait_s)


_CURRENT: ContextVar[_Request | None] = ContextVar("telegram_overhead_request", default=None)


class TimedFakeTelegram(FakeTelegram):
    """FakeTelegram that logs each request's handler time and when each sendMessage arrived."""

    def __init__(self) -> None:
        """The default test bot (tests.fake_telegram.TOKEN, @test_bot)."""
        super().__init__()
        self.log: list[ApiCall] = []
        self.sent_at: list[float] = []  # parallel to `sent`: handler start of its sendMessage

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """Time the whole handler (parameter parsing, routing, the method, the JSON response)."""
        req = _Request(time.monotonic())
        token = _CURRENT.set(req)
        try:
            return await super()._handle(request)
        finally:
            _CURRENT.reset(token)
            self.log.append(
                ApiCall(request.path.rsplit("/", 1)[-1], req.start, time.monotonic(), req.wait_s, req.updates)
            )

    async def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Count the whole method as waiting (its own work is a few deque operations)."""
        t0 = time.monotonic()
        result = await super()._get_updates(params)
        req = _CURRENT.get()
        if req is not None:
            req.wait_s += time.monotonic() - t0
            req.updates = len(result)
        return result

    async def _send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        """Remember when the request reached the fake, in step with `sent`."""
        result = await super()._send_message(params)
        req = _CURRENT.get()
        self.sent_at.append(req.start if req is not None else time.monotonic())
        return result


# ---------------------------------------------------------------- the bot


@dataclass
class Rig:
    """A running bot (the real adapter and core) and its fakes."""

    fake: TimedFakeTelegram
    llm_server: FakeLLMProcess
    core: Core
    adapter: TelegramAdapter
    tag: int  # keeps message ids unique across the runs of one invocation
    turns_done: int = 0


@asynccontextmanager
async def make_rig(db: BenchDatabase, llm_server: FakeLLMProcess, tag: int) -> AsyncIterator[Rig]:
    """The production wiring (create_pool defaults, LLM.from_settings) with Telegram pointed at the fake."""
    async with TimedFakeTelegram() as fake:
        update = {"TELEGRAM_BOT_TOKEN": SecretStr(fake.token), "TELEGRAM_API_BASE_URL": fake.base_url}
        async with bench_core(db.dsn, llm_server.base_url, settings_update=update) as core:
            adapter = TelegramAdapter(core, core.settings, poll_timeout=POLL_TIMEOUT_S)
            await adapter.start()
            try:
                yield Rig(fake, llm_server, core, adapter, tag)
            finally:
                await adapter.stop()


@dataclass(frozen=True)
class TurnTimes:
    """One turn's figures (time.monotonic())."""

    pushed: float
    sent: float  # the fake received the reply's sendMessage
    woke: float  # wait_sent returned in the benchmark's coroutine
    ok: bool  # one reply, in the right chat, saying "ok"
    calls_from: int  # index into fake.log when the turn started
    after_idle: bool  # the first turn after a pause (the process had been idle)

    @property
    def ms(self) -> float:
        """Push → sendMessage at the fake, in ms."""
        return (self.sent - self.pushed) * 1000


async def one_turn(rig: Rig, after_idle: bool, text: str = "what is on my list for today?") -> TurnTimes:
    """Push one private text message and wait for the fake to receive the reply's sendMessage."""
    fake, n = rig.fake, rig.turns_done
    rig.turns_done += 1
    user = USERS[n % len(USERS)]
    message_id = MESSAGE_ID_BASE * rig.tag + n * MESSAGE_ID_STRIDE
    update = fake.message_update(
        f"{text} (#{n})", message_id=message_id, chat_id=user, user_id=user, first_name=NAMES[n % len(NAMES)]
    )
    before, calls_from = len(fake.sent), len(fake.log)
    pushed = time.monotonic()
    fake.push_update(update)
    await fake.wait_sent(before + 1, timeout=30.0)
    woke = time.monotonic()
    reply = fake.sent[before]
    ok = reply.get("chat_id") == user and str(reply.get("text", "")).startswith("ok")
    return TurnTimes(pushed, fake.sent_at[before], woke, ok, calls_from, after_idle)


@dataclass(frozen=True)
class Pacing:
    """Turns back to back in bursts, with a pause after each burst (not timed).

    The pause empties the adapter's send window (30 messages per TELEGRAM_RATE_WINDOW_S for a process alone), so it
    never makes a message wait: a burst of 8 turns puts 8 in it.
    """

    burst: int = 8
    pause_s: float = 1.0

    def describe(self) -> str:
        """For the headings."""
        if not self.pause_s:
            return "all back to back"
        return f"in bursts of {self.burst} back to back, {self.pause_s:g} s pause after each (not timed)"


BURSTS = Pacing()
NO_PAUSES = Pacing(burst=1, pause_s=0.0)


async def run_turns(
    rig: Rig,
    turns: int,
    pacing: Pacing,
    on_turn: Callable[[TurnTimes], None] | None = None,
    idle: Callable[[bool], None] | None = None,
) -> list[TurnTimes]:
    """`turns` turns paced by `pacing`; `idle(True)`/`idle(False)` brackets each pause (a profiler stops)."""
    out: list[TurnTimes] = []
    for i in range(turns):
        if pacing.pause_s and i and i % pacing.burst == 0:
            if idle is not None:
                idle(True)
            await asyncio.sleep(pacing.pause_s)  # pacing only: drains the rate limiter's bucket; not timed
            if idle is not None:
                idle(False)
        t = await one_turn(rig, after_idle=bool(pacing.pause_s) and i % pacing.burst == 0)
        out.append(t)
        if on_turn is not None:
            on_turn(t)
    return out


def limiter_peak(calls: list[ApiCall]) -> float:
    """The most rate-limited calls within any TELEGRAM_RATE_WINDOW_S: the adapter's limiter lets 30 through per
    window (a process alone) and makes the next one wait."""
    times = sorted(c.t_in for c in calls if c.method in RATE_LIMITED)
    peak, first = 0, 0
    for i, t in enumerate(times):
        while times[first] <= t - TELEGRAM_RATE_WINDOW_S:
            first += 1
        peak = max(peak, i - first + 1)
    return float(peak)


# ---------------------------------------------------------------- part 1: the headline figure


class GcPauses:
    """Garbage-collector pauses while active (gc.callbacks)."""

    def __init__(self) -> None:
        """No pauses yet."""
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t0))

    @contextmanager
    def active(self) -> Iterator[GcPauses]:
        """Record the pauses inside the block."""
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)

    def line(self, turns: int) -> str:
        """A summary."""
        if not self.pauses:
            return "GC: no collections"
        by_gen = Counter(g for g, _ in self.pauses)
        total = sum(d for _, d in self.pauses)
        gen, longest = max(self.pauses, key=lambda p: p[1])
        return (
            f"GC: {len(self.pauses)} collections ("
            + ", ".join(f"gen{g} {k}" for g, k in sorted(by_gen.items()))
            + f"), {total * 1000 / turns:.2f} ms/turn in all, longest {longest * 1000:.1f} ms (gen{gen})"
        )


@dataclass
class RunResult:
    """A measured run."""

    label: str
    pacing: Pacing
    turns: list[TurnTimes]
    calls: list[ApiCall]
    cpu: CpuUse
    llm_requests: int
    llm_handler_s: float
    wall_s: float
    gc: GcPauses

    def ms(self, *, after_idle: bool) -> list[float]:
        """Sorted per-turn figures of the turns that came back to back (or after a pause)."""
        return sorted(t.ms for t in self.turns if t.after_idle == after_idle)


async def measured_run(rig: Rig, meter: CpuMeter, label: str, turns: int, pacing: Pacing) -> RunResult:
    """Time `turns` turns and collect the fakes' counters."""
    await rig.llm_server.stats()  # reset
    first = len(rig.fake.log)
    meter.start()
    t0 = time.monotonic()
    with GcPauses().active() as pauses:
        times = await run_turns(rig, turns, pacing)
    wall = time.monotonic() - t0
    llm = await rig.llm_server.stats()
    cpu = meter.stop(llm.cpu_s)
    return RunResult(label, pacing, times, rig.fake.log[first:], cpu, llm.requests, llm.handler_s, wall, pauses)


def print_series(title: str, ms: list[float]) -> None:
    """p50/p99/mean of sorted figures."""
    p50 = percentile(ms, 50)
    print(f"    {title}: {len(ms)} turns")
    print(f"      p50  {p50:7.2f} ms   goal <= {GOAL_P50_MS:.0f} ms   {verdict(p50, GOAL_P50_MS)}")
    print(f"      p99  {percentile(ms, 99):7.2f} ms")
    print(
        f"      mean {statistics.fmean(ms):7.2f} ms   (p90 {percentile(ms, 90):.2f}, min {ms[0]:.2f}, max {ms[-1]:.2f})"
    )


def print_run(r: RunResult, *, headline: bool) -> None:
    """p50/p99/mean, the Bot API calls per turn and where the CPU went."""
    n = len(r.turns)
    bad = sum(not t.ok for t in r.turns)
    print(f"  {'[HEADLINE] ' if headline else ''}{r.label}: {n} turns, {bad} without the expected reply")
    warm, cold = r.ms(after_idle=False), r.ms(after_idle=True)
    if warm:
        print_series("back to back (the previous turn just ended; as bench.turn_overhead measures)", warm)
    if cold:
        print_series(f"first turn after a {r.pacing.pause_s:g} s idle pause (a lone message to an idle bot)", cold)
    woke = sorted((t.woke - t.pushed) * 1000 for t in r.turns)
    print(
        f"    all turns as seen by the benchmark's wait_sent(): p50 {percentile(woke, 50):.2f} ms "
        "(the fake's receipt + one loop wake-up)"
    )
    counts = Counter(c.method for c in r.calls)
    polls = sum(1 for c in r.calls if c.method == "getUpdates" and c.updates)
    print(
        "    Bot API calls per turn: "
        + ", ".join(f"{m} {k / n:.2f}" for m, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        + (
            f" ({polls / n:.2f} returned updates; the others timed out empty during the pauses)"
            if counts["getUpdates"] > polls
            else ""
        )
    )
    work: dict[str, float] = defaultdict(float)
    for c in r.calls:
        work[c.method] += c.work_s
    total_work = sum(work.values())
    print(
        f"    fake Telegram handler time (in the bot's process; subtract it): {total_work * 1000 / n:.2f} ms/turn = "
        + ", ".join(f"{m} {s * 1000 / n:.2f}" for m, s in sorted(work.items(), key=lambda kv: -kv[1]))
    )
    print(
        "      (getUpdates without its long-poll wait; aiohttp's own HTTP parsing and writing around the handlers "
        "is not in it: see part 3)"
    )
    if warm:
        net = percentile(warm, 50) - total_work * 1000 / n
        print(f"    back-to-back p50 minus the fake's handler time: {net:.2f} ms")
    print(f"    {r.cpu.line(n, 'turn')}")
    print(
        f"    fake LLM: {r.llm_requests} requests, {r.llm_handler_s * 1000 / max(1, r.llm_requests):.2f} ms/request "
        "inside its handler (own process)"
    )
    print(f"    {r.gc.line(n)}")
    peak = limiter_peak(r.calls)
    print(
        f"    rate limiter: at most {peak:.0f} sends in one {TELEGRAM_RATE_WINDOW_S:g} s window of {LIMITER_RATE:.0f} "
        f"({'never waited' if peak <= LIMITER_RATE else 'FULL: turns waited for the limiter'}); "
        f"{n / r.wall_s:.1f} turns/s overall"
    )


# ---------------------------------------------------------------- part 0: many users at once


@dataclass(frozen=True)
class CrowdResult:
    """One crowd: `users` private chats write at the same moment to a bot with a slow model."""

    wall_s: float  # first push → the fake receives the last answer's sendMessage
    answered: int  # users whose chat got an "ok" answer
    counts: Counter[str]  # Bot API calls during the crowd, by method


async def crowd(rig: Rig, users: int, round_no: int) -> CrowdResult:
    """`users` distinct users each send one private message at once; time until every answer reached the fake."""
    fake = rig.fake
    ids = [CROWD_USER_BASE + round_no * 1000 + i for i in range(users)]
    updates = [
        fake.message_update(f"hello from {u}", chat_id=u, user_id=u, first_name=f"User{i}") for i, u in enumerate(ids)
    ]
    before, first_call = len(fake.sent), len(fake.log)
    t0 = time.monotonic()
    for update in updates:
        fake.push_update(update)
    await fake.wait_sent(before + users, timeout=60.0)
    wall = max(fake.sent_at[before:]) - t0
    await asyncio.sleep(0.2)  # late calls of the turns' tails (typing tasks) are counted too; not timed
    answered = {s.get("chat_id") for s in fake.sent[before:] if str(s.get("text", "")).startswith("ok")}
    counts = Counter(c.method for c in fake.log[first_call:] if c.method != "getUpdates")
    return CrowdResult(wall, len(answered & set(ids)), counts)


async def part_crowd(db: BenchDatabase, users: int, rounds: int, delay: float) -> bool:
    """Part 0: `users` users at once with a `delay` s model; True when every round met the goal."""
    floor = delay + max(0, users - LIMITER_RATE) / LIMITER_RATE
    print(
        f"== 0. {users} users at once, each in their own private chat, model answering after {delay:g} s: first push "
        f"→ the fake receives the last answer; a cold round, then {rounds} rounds, 2 s apart (floor at "
        f"{LIMITER_RATE:.0f} messages/s: ~{floor:.1f} s; goal <= {GOAL_CROWD_S:.1f} s) =="
    )
    ok = True
    async with FakeLLMProcess(delay) as llm_server, make_rig(db, llm_server, 2) as rig:
        for r in range(rounds + 1):
            res = await crowd(rig, users, r)
            if r:
                ok = ok and res.wall_s <= GOAL_CROWD_S and res.answered == users
            calls = ", ".join(f"{m} {k}" for m, k in sorted(res.counts.items()))
            label = f"round {r}" if r else "cold   "
            print(
                f"    {label}: {res.wall_s:5.2f} s   {verdict(res.wall_s, GOAL_CROWD_S)}   "
                f"{res.answered}/{users} answered; Bot API calls: {calls}"
            )
            if not r:
                print(
                    "             (the first crowd after start: the DB pool grows from 10 to 20 connections and "
                    "the HTTP clients open theirs)"
                )
            await asyncio.sleep(2.0)  # drain the rate limiter's bucket; not timed
    print()
    return ok


# ---------------------------------------------------------------- part 2: where the time goes


@contextmanager
def traced(rig: Rig, tracer: Tracer) -> Iterator[None]:
    """Timestamps at adapter._turn, the core's events and the store calls of a turn; undone afterwards."""
    adapter = rig.adapter
    orig_turn = adapter._turn

    async def turn(inc: Incoming, msg: telegram.Message) -> None:
        marks = tracer.cur
        marks.mark("turn")
        try:
            await orig_turn(inc, msg)
        finally:
            marks.mark("done")

    def timed(orig: Callable[..., Awaitable[Any]], name: str) -> Callable[..., Awaitable[Any]]:
        async def call(*a: Any, **k: Any) -> Any:
            marks = tracer.cur
            t0 = time.monotonic()
            try:
                return await orig(*a, **k)
            finally:
                marks.db.append((name, t0, time.monotonic()))

        return call

    undo: list[tuple[str, Any]] = []
    for name in ("begin_turn", "finish_turn_with_answer"):
        undo.append((name, getattr(conversations, name)))
        setattr(conversations, name, timed(getattr(conversations, name), name))
    adapter._turn = turn  # type: ignore[method-assign]
    try:
        with traced_handle(rig.core, tracer):
            yield
    finally:
        del adapter._turn  # back to the class's method
        for name, orig in undo:
            setattr(conversations, name, orig)


SEGMENTS = (
    ("push → the fake answers the waiting getUpdates", "fake Telegram (bot's process): wake the poll, JSON"),
    ("→ adapter._turn entered", "PTB: httpx reads the poll reply, JSON → Update, queue, handler task, filters"),
    ("→ conversations.begin_turn called", "adapter: typing task, draft; core: checks, chat lock"),
    ("→ begin_turn done", "core: conversations.begin_turn: message, turn and context in one round trip (asyncpg)"),
    ("→ LLM request reaches the fake LLM", "core: prompt, replay; openai SDK + its aiohttp request"),
    ("→ first AssistantDelta in the adapter", "fake LLM (own process) + SSE back + SDK stream parsing"),
    ("→ sendMessageDraft reaches the fake", "adapter + PTB request layer (0 when no draft: instant answers)"),
    ("   sendMessageDraft inside the fake", "fake Telegram handler (bot's process; 0 when no draft)"),
    ("→ finish_turn_with_answer called", "the draft's reply read (if any); rest of the LLM stream"),
    ("   finish_turn_with_answer", "core: asyncpg round trip"),
    ("→ Assistant event in the adapter", "core"),
    ("→ sendMessage reaches the fake", "adapter render_reply + PTB request layer (rate limiter, encode, httpx)"),
)


def turn_segments(t: TurnTimes, m: Marks, calls: list[ApiCall], llm_arrival: float) -> list[float] | None:
    """The turn's timeline split at the marks (seconds, as SEGMENTS), or None when a mark is missing."""
    poll = next((c for c in calls if c.method == "getUpdates" and c.updates and c.t_out >= t.pushed), None)
    draft = next((c for c in calls if c.method == "sendMessageDraft" and c.t_in >= t.pushed), None)
    db = {name: (a, b) for name, a, b in m.db}
    if poll is None or any(k not in m.at for k in ("turn", "AssistantDelta", "Assistant")) or len(db) < 3:
        return None
    # an answer faster than DRAFT_EVERY_S sends no draft: its two segments are empty
    draft_in, draft_out = (draft.t_in, draft.t_out) if draft is not None else (m.at["AssistantDelta"],) * 2
    points = [
        t.pushed,
        poll.t_out,
        m.at["turn"],
        db["begin_turn"][0],
        db["begin_turn"][1],
        llm_arrival,
        m.at["AssistantDelta"],
        draft_in,
        draft_out,
        db["finish_turn_with_answer"][0],
        db["finish_turn_with_answer"][1],
        m.at["Assistant"],
        t.sent,
    ]
    return [b - a for a, b in itertools.pairwise(points)]


def _median_ms(values: list[float]) -> str:
    """The median of seconds, as ms (or a dash)."""
    return f"{percentile(sorted(values), 50) * 1000:8.3f}" if values else f"{'-':>8}"


async def part_breakdown(rig: Rig, turns: int, pacing: Pacing) -> None:
    """Timestamps through each turn: which layer the time goes to (wall time)."""
    print(
        f"== 2. Where the time goes: {turns} turns {pacing.describe()}, traced at each layer (wall time, medians; "
        "the segments add up to the total) =="
    )
    await rig.llm_server.stats()  # reset
    tracer = Tracer()
    with traced(rig, tracer):
        times = await run_turns(rig, turns, pacing, on_turn=lambda _t: tracer.next())
        await asyncio.sleep(0.05)  # the last turn's tail (its "done" mark); not timed
    llm = await rig.llm_server.stats()
    if len(llm.arrivals) != turns:
        print(f"  (the fake LLM saw {len(llm.arrivals)} requests for {turns} turns: no breakdown)")
        return
    rows: dict[bool, list[list[float]]] = {False: [], True: []}
    tails: list[float] = []
    actions: list[tuple[float, float]] = []
    for t, m, arrival in zip(times, tracer.done, llm.arrivals, strict=True):
        calls = rig.fake.log[t.calls_from :]
        seg = turn_segments(t, m, calls, arrival)
        if seg is not None:
            rows[t.after_idle].append(seg)
        if "done" in m.at:
            tails.append(m.at["done"] - t.sent)
        action = next((c for c in calls if c.method == "sendChatAction" and c.t_in >= t.pushed), None)
        if action is not None:
            actions.append((action.t_in - t.pushed, action.t_out - t.pushed))
    warm, cold = rows[False], rows[True]
    print(f"  {len(warm) + len(cold)} of {turns} turns fully traced (tracing adds a few µs)")
    print(f"    {'b2b':>8} {'idle':>8}  segment  [who]      (b2b: back to back; idle: first turn after a pause)")
    for i, (label, owner) in enumerate(SEGMENTS):
        print(f"    {_median_ms([r[i] for r in warm])} {_median_ms([r[i] for r in cold])}  {label}  [{owner}]")
    print(f"    {_median_ms([sum(r) for r in warm])} {_median_ms([sum(r) for r in cold])}  total")
    if actions:
        print(
            f"  the typing task's sendChatAction reaches the fake {_median_ms([a for a, _ in actions]).strip()} ms "
            f"after the push and is answered at {_median_ms([b for _, b in actions]).strip()} ms: its PTB + httpx "
            "+ fake-server work shares the loop with the DB segment"
        )
    if tails:
        print(
            f"  after sendMessage reaches the fake, the turn's tail (PTB reads the reply, the typing task is "
            f"cancelled) takes {_median_ms(tails).strip()} ms more: back to back, it overlaps the next turn"
        )
    print()


# ---------------------------------------------------------------- part 3: one Bot API call


@dataclass
class CallCost:
    """Sequential calls of one kind of client."""

    wall_ms: list[float]  # sorted
    cpu_ms: float  # bot process CPU per call (client and fake server together)
    handler_ms: float  # the fake's handler per call

    def cell(self) -> str:
        """One printable cell."""
        return f"p50 {percentile(self.wall_ms, 50):5.2f} ms, CPU {self.cpu_ms:5.2f} (handler {self.handler_ms:.2f})"


async def time_calls(
    rig: Rig, call: Callable[[], Awaitable[object]], n: int, *, every: int, pause_s: float
) -> CallCost:
    """`n` sequential sendChatAction calls made by `call`, pausing `pause_s` (not timed) after each `every`."""
    for _ in range(3):
        await call()
    await asyncio.sleep(pause_s)
    first = len(rig.fake.log)
    walls: list[float] = []
    cpu = 0.0
    for i in range(n):
        if i and i % every == 0:
            await asyncio.sleep(pause_s)  # pacing only, not timed
        c0, t0 = time.process_time(), time.perf_counter()
        await call()
        walls.append((time.perf_counter() - t0) * 1000)
        cpu += time.process_time() - c0
    handler = sum(c.work_s for c in rig.fake.log[first:] if c.method == "sendChatAction")
    return CallCost(sorted(walls), cpu * 1000 / n, handler * 1000 / n)


async def part_calls(rig: Rig, n: int) -> None:
    """What one Bot API round trip costs the bot's process, by client, back to back and after idling."""
    idle_n, idle_s = max(1, n // 5), 0.05
    print(
        f"== 3. One Bot API call: sendChatAction to the fake, by client; {n} calls back to back (the rate-limited "
        f"one in bursts of 20), and {idle_n} calls each after {idle_s * 1000:.0f} ms idle. Client and fake server "
        "share the process: CPU (ms/call) counts both =="
    )
    fake, chat = rig.fake, USERS[0]
    url = f"{fake.base_url}{fake.token}/sendChatAction"
    plain = telegram.Bot(fake.token, base_url=fake.base_url)
    bot = rig.adapter.app.bot
    async with aiohttp.ClientSession() as session, plain:

        async def lean() -> object:
            async with session.post(url, json={"chat_id": chat, "action": "typing"}) as resp:
                return await resp.read()

        clients: list[tuple[str, Callable[[], Awaitable[object]], int]] = [
            ("plain aiohttp.ClientSession + JSON (the floor)", lean, n),
            ("telegram.Bot: PTB + HTTPXRequest, no rate limiter", lambda: plain.send_chat_action(chat, "typing"), n),
            (
                "the adapter's ExtBot (aiohttp; typing bypasses the limiter)",
                lambda: bot.send_chat_action(chat, "typing"),
                20,
            ),
        ]
        costs: list[tuple[CallCost, CallCost]] = []
        for label, call, every in clients:
            b2b = await time_calls(rig, call, n, every=every, pause_s=1.0)
            cold = await time_calls(rig, call, idle_n, every=1, pause_s=idle_s)
            costs.append((b2b, cold))
            print(f"    {label:<52} b2b: {b2b.cell()}   after idle: {cold.cell()}")
    (lean_b, lean_c), (ptb_b, ptb_c), (ext_b, ext_c) = costs
    print(
        f"    → PTB's request layer: +{ptb_b.cpu_ms - lean_b.cpu_ms:.2f} ms CPU per call over a plain aiohttp client "
        f"back to back (+{ptb_c.cpu_ms - lean_c.cpu_ms:.2f} after idle); the adapter's ExtBot on aiohttp "
        f"{ext_b.cpu_ms - ptb_b.cpu_ms:+.2f} ({ext_c.cpu_ms - ptb_c.cpu_ms:+.2f})"
    )
    print()


# ---------------------------------------------------------------- part 4: cProfile


async def part_profile(rig: Rig, turns: int, pacing: Pacing) -> None:
    """cProfile of turns (stopped during the pauses)."""
    print(
        f"== 4. cProfile of {turns} turns {pacing.describe()}: the whole bot process, i.e. PTB (telegram, httpx, "
        "httpcore, h11, anyio), adapters/, core/, asyncpg, openai (httpx2 over aiohttp) AND the fake Telegram "
        "server (aiohttp web_*, tests/) =="
    )
    prof = cProfile.Profile()

    def idle(pausing: bool) -> None:
        if pausing:
            prof.disable()
        else:
            prof.enable()

    prof.enable()
    await run_turns(rig, turns, pacing, idle=idle)
    prof.disable()
    print_profile(prof, turns)
    print()


# ---------------------------------------------------------------- main


async def bench(args: argparse.Namespace) -> int:
    """Run the parts and print their figures."""
    pacing = Pacing(args.burst, args.pause)
    async with bench_database() as db:
        server = await server_info(db.dsn)
        meter = CpuMeter(server.postmaster)
        print(f"PostgreSQL {server.version}: {db.description}; synchronous_commit {server.sync_commit}")
        print(
            f"python-telegram-bot {telegram.__version__} (httpx {httpx.__version__}, AIORateLimiter), "
            f"aiohttp {aiohttp.__version__}; Python {sys.version.split()[0]}, "
            f"{type(asyncio.get_running_loop()).__name__}; host: {load_average()}"
        )
        print(
            f"Bot: TelegramAdapter(poll_timeout={POLL_TIMEOUT_S}) + Core + create_pool defaults; "
            f"{len(USERS)} private chats round robin, ALLOWED_USERS=*, HISTORY_MESSAGES=40; the fake LLM answers "
            "'ok' at once from its own process; the fake Telegram server runs on the bot's event loop"
        )
        print()
        status = 0
        if args.crowd_users:
            status = int(not await part_crowd(db, args.crowd_users, args.crowd_rounds, args.crowd_delay))
        async with FakeLLMProcess(0.0) as llm_server, make_rig(db, llm_server, 1) as rig:
            await run_turns(rig, args.warmup, pacing)
            await asyncio.sleep(pacing.pause_s)
            print(
                f"== 1. Push → the fake receives sendMessage: {args.turns} turns after {args.warmup} warm-up, "
                f"{pacing.describe()} =="
            )
            head = await measured_run(rig, meter, "fake LLM in a separate process", args.turns, pacing)
            print_run(head, headline=True)
            warm = head.ms(after_idle=False)
            status |= int(not warm or percentile(warm, 50) > GOAL_P50_MS or any(not t.ok for t in head.turns))
            if args.unpaced_turns:
                await asyncio.sleep(pacing.pause_s)
                unpaced = await measured_run(
                    rig, meter, "diagnostic: no pauses at all, the rate limiter's effect", args.unpaced_turns, NO_PAUSES
                )
                print_run(unpaced, headline=False)
                await asyncio.sleep(2.0)  # drain the limiter's bucket before the next part
            print()
            if args.breakdown_turns:
                await part_breakdown(rig, args.breakdown_turns, pacing)
            if args.call_samples:
                await part_calls(rig, args.call_samples)
            if args.profile:
                await asyncio.sleep(pacing.pause_s)
                await part_profile(rig, args.profile_turns, pacing)
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when the back-to-back p50 goal is missed."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.telegram_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--turns", type=int, default=500, help="measured turns (500)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up turns (30)")
    parser.add_argument("--burst", type=int, default=BURSTS.burst, help=f"turns back to back ({BURSTS.burst})")
    parser.add_argument(
        "--pause", type=float, default=BURSTS.pause_s, help=f"seconds of pause after each burst ({BURSTS.pause_s:g})"
    )
    parser.add_argument(
        "--unpaced-turns",
        type=int,
        default=60,
        help="turns without pauses, to show the rate limiter's effect (60; 0 skips)",
    )
    parser.add_argument("--breakdown-turns", type=int, default=200, help="traced turns for part 2 (200; 0 skips)")
    parser.add_argument(
        "--call-samples", type=int, default=200, help="back-to-back calls per client in part 3 (200; 0 skips)"
    )
    parser.add_argument("--crowd-users", type=int, default=50, help="users at once in part 0 (50; 0 skips)")
    parser.add_argument("--crowd-rounds", type=int, default=3, help="rounds of part 0 (3)")
    parser.add_argument("--crowd-delay", type=float, default=1.0, help="the model's answer time in part 0 (1.0 s)")
    parser.add_argument("--profile", action="store_true", help="add a cProfile (part 4)")
    parser.add_argument("--profile-turns", type=int, default=200, help="turns to profile (200)")
    args = parser.parse_args(argv)
    if args.burst < 1 or args.pause < 0:
        parser.error("--burst must be at least 1 and --pause not negative")
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
