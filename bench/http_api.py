"""The HTTP API (issue 22) end to end: `python -m bot serve` in its own process (the production wiring: WebServer +
HttpApi + Core, create_pool defaults, on a real PostgreSQL), the fake model in another (bench.common.FakeLLMProcess),
and this process as the client (aiohttp). Part 1 times POST /v1/sessions/{id}/messages with a model that answers at
once: N turns answered as JSON and N with `Accept: text/event-stream` (alternating, round robin over 5 people's
sessions, in bursts of 8 back to back with a pause after each; the first turn after a pause is reported apart):
p50/p99 of the whole request (goal: p50 <= 10 ms, like Telegram) and of the time to the first SSE byte, and the bot's
CPU per turn. Part 2 has 200 people (a token and a session each) open an SSE stream at once to a model that takes
1 s: first request sent → the last `message.completed` received (goal: <= 1.5 s), a cold round (new connections)
then rounds on kept-alive connections.

The bot's rate limits are raised for the bench (a handful of people send hundreds of turns a minute):
API_REQUESTS_PER_MINUTE (per token), USER_MESSAGES_PER_MINUTE (per person) and CHAT_MESSAGES_PER_MINUTE (per
session) are 1,000,000; part 2 would stay under the defaults (one request per token and round).
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import aiohttp
import fastapi
import uvicorn

from bench.common import (
    REPO_ROOT,
    BenchDatabase,
    CpuMeter,
    FakeLLMProcess,
    bench_core,
    bench_database,
    goal_line,
    parse,
    parser,
    percentile,
    proc_cpu,
    quiet_logging,
    verdict,
)
from core import Incoming

GOAL_P50_MS = 10.0
GOAL_CROWD_S = 1.5
PEOPLE = 5  # part 1's people, a session each, round robin
START_TIMEOUT_S = 60.0  # `bot serve` prints its URL within this
STOP_TIMEOUT_S = 30.0
SERVING = re.compile(r"Serving the HTTP API on (http://\S+) ")  # bot.app.SERVING, the line `bot serve` prints
EVENT_STREAM = {"Accept": "text/event-stream"}
RAISED = 1_000_000  # the bench's rate limits


# ---------------------------------------------------------------- the bot process and its people


@dataclass
class Bot:
    """`python -m bot serve` running, and where."""

    proc: asyncio.subprocess.Process
    url: str
    log: Path

    def cpu_s(self) -> float:
        """CPU seconds the process has used."""
        return proc_cpu(self.proc.pid) or 0.0


def serve_env(db: BenchDatabase, llm_url: str, data_dir: Path) -> dict[str, str]:
    """The bot's environment from scratch (bench.common.bench_settings' values, PORT unset: a free port)."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(data_dir),
        "PYTHONPATH": str(REPO_ROOT),
        "DATABASE_URL": db.dsn,
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": llm_url,
        "LLM_API_KEY": "bench",
        "LLM_MODEL": "fake-model",
        "ALLOWED_USERS": "*",
        "DEFAULT_TIMEZONE": "UTC",
        "DATA_DIR": str(data_dir),
        "HISTORY_MESSAGES": "40",
        "API_REQUESTS_PER_MINUTE": str(RAISED),
        "USER_MESSAGES_PER_MINUTE": str(RAISED),
        "CHAT_MESSAGES_PER_MINUTE": str(RAISED),
    }


@asynccontextmanager
async def bot_serve(db: BenchDatabase, llm_url: str) -> AsyncIterator[Bot]:
    """`python -m bot serve` (this checkout) until the block ends, then SIGTERM (killed if it lingers)."""
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        log = Path(tmp) / "bot.log"
        with log.open("wb") as errors:
            proc = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "bot", "serve"),
                cwd=tmp,  # no .env of a developer's tree
                env=serve_env(db, llm_url, Path(tmp)),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
            )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)).decode()
            found = SERVING.match(line)
            if found is None:
                raise RuntimeError(f"bot serve did not start (said {line!r}): {log.read_text()[-2000:]}")
            yield Bot(proc, found[1], log)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
                except TimeoutError:
                    with suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()


@dataclass(frozen=True)
class Person:
    """Someone with an API token and a session."""

    headers: dict[str, str]
    session: str


async def make_people(
    db: BenchDatabase, llm_url: str, bot: str, http: aiohttp.ClientSession, n: int, part: str
) -> list[Person]:
    """`n` people (Telegram identities of the run's tag and `part`), each with a token (as /token new makes it) and a
    session made over the API."""
    secrets: list[str] = []
    async with bench_core(db.dsn, llm_url) as core:
        for i in range(n):
            uid = f"{db.tag}{part}-{i}"
            inc = Incoming(platform="telegram", user_id=uid, chat_id=uid, text="/token", user_name=f"P{i}")
            made = await core.new_api_token(inc, "bench")
            assert isinstance(made, str), made
            secrets.append(made)

    async def person(secret: str) -> Person:
        headers = {"Authorization": f"Bearer {secret}"}
        async with http.post(f"{bot}/v1/sessions", json={"title": "bench"}, headers=headers) as r:
            assert r.status == 201, await r.text()
            return Person(headers, str((await r.json())["id"]))

    return list(await asyncio.gather(*(person(s) for s in secrets)))


def client() -> aiohttp.ClientSession:
    """The bench's HTTP client: no connection limit, no timeout shorter than a slow run."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=120))


# ---------------------------------------------------------------- one turn


@dataclass(frozen=True)
class Turn:
    """One request's figures (time.perf_counter())."""

    sent: float
    first_byte: float | None  # SSE only: the first byte of the body
    done: float  # the whole answer received
    ok: bool  # answered "ok"
    sse: bool
    after_idle: bool = False

    @property
    def ms(self) -> float:
        """The whole request, in ms."""
        return (self.done - self.sent) * 1000

    @property
    def first_ms(self) -> float:
        """Sent → first SSE byte, in ms."""
        return ((self.first_byte or self.done) - self.sent) * 1000


def answered_ok(message: dict[str, object]) -> bool:
    """Whether a message is the fake model's finished `ok`."""
    return message.get("status") == "done" and message.get("parts") == [{"type": "text", "text": "ok"}]


async def json_turn(http: aiohttp.ClientSession, bot: str, who: Person, text: str) -> Turn:
    """Post a message and read the finished answer as JSON."""
    url = f"{bot}/v1/sessions/{who.session}/messages"
    sent = time.perf_counter()
    async with http.post(url, json={"content": text}, headers=who.headers) as r:
        body = await r.read()
    done = time.perf_counter()
    return Turn(sent, None, done, r.status == 200 and answered_ok(json.loads(body)), sse=False)


async def sse_turn(http: aiohttp.ClientSession, bot: str, who: Person, text: str) -> Turn:
    """Post a message with Accept: text/event-stream and read the stream to its end."""
    url = f"{bot}/v1/sessions/{who.session}/messages"
    first: float | None = None
    chunks: list[bytes] = []
    sent = time.perf_counter()
    async with http.post(url, json={"content": text}, headers=who.headers | EVENT_STREAM) as r:
        async for chunk in r.content.iter_any():
            if first is None:
                first = time.perf_counter()
            chunks.append(chunk)
    done = time.perf_counter()
    frames = b"".join(chunks).decode().split("\n\n")
    last = next((f for f in reversed(frames) if "event: message.completed" in f), "")
    data = next((line[6:] for line in last.splitlines() if line.startswith("data: ")), "{}")
    ok = r.status == 200 and answered_ok(json.loads(data).get("message", {}))
    return Turn(sent, first, done, ok, sse=True)


# ---------------------------------------------------------------- part 1: turn overhead


async def run_turns(
    http: aiohttp.ClientSession, bot: str, people: list[Person], turns: int, burst: int, pause: float, start: int = 0
) -> list[Turn]:
    """`turns` turns of each kind, alternating JSON and SSE, round robin, in bursts with a pause after each."""
    out: list[Turn] = []
    for i in range(2 * turns):
        if i and i % burst == 0:
            await asyncio.sleep(pause)
        who, n = people[i % len(people)], start + i
        kind = sse_turn if (i + i // burst) % 2 else json_turn  # bursts start with either kind in turn
        turn = await kind(http, bot, who, f"what is on my list for today? (#{n})")
        out.append(Turn(turn.sent, turn.first_byte, turn.done, turn.ok, turn.sse, after_idle=i % burst == 0))
    return out


def series(title: str, ms: list[float], goal: float | None) -> None:
    """p50 and p99 of sorted figures (p50 against its goal, if any)."""
    if not ms:
        return
    p50 = percentile(ms, 50)
    head = goal_line("p50", p50, goal) if goal is not None else f"p50  {p50:7.2f} ms"
    print(f"    {title} ({len(ms)}): {head}; p99 {percentile(ms, 99):.2f}, max {ms[-1]:.2f} ms")


async def part_overhead(db: BenchDatabase, turns: int, warmup: int, burst: int, pause: float) -> bool:
    """Part 1; True when the goals were met and every turn was answered."""
    print(
        f"== 1. POST /v1/sessions/{{id}}/messages, the model answering at once: {turns} JSON and {turns} SSE turns "
        f"alternating after {warmup} warm-up, {PEOPLE} people round robin, in bursts of {burst} back to back, "
        f"{pause:g} s pause after each =="
    )
    async with FakeLLMProcess(0.0) as llm, bot_serve(db, llm.base_url) as bot, client() as http:
        people = await make_people(db, llm.base_url, bot.url, http, PEOPLE, "turns")
        await run_turns(http, bot.url, people, warmup, burst, pause)
        await asyncio.sleep(pause)
        await llm.stats()  # reset
        meter = CpuMeter(db.postmaster)
        meter.start()
        bot0 = bot.cpu_s()
        done = await run_turns(http, bot.url, people, turns, burst, pause, start=2 * warmup)
        bot_s = bot.cpu_s() - bot0
        cpu = meter.stop((await llm.stats()).cpu_s)
    n = len(done)
    bad = sum(not t.ok for t in done)
    print(f"  [HEADLINE] {n} requests, {bad} without the expected answer; the whole request, back to back:")
    ok = not bad
    for sse, label in ((False, "JSON"), (True, "SSE ")):
        warm = sorted(t.ms for t in done if t.sse == sse and not t.after_idle)
        series(f"{label} whole request", warm, GOAL_P50_MS)
        ok = ok and bool(warm) and percentile(warm, 50) <= GOAL_P50_MS
    series("SSE  sent → first byte", sorted(t.first_ms for t in done if t.sse and not t.after_idle), None)
    print(f"  the first request after a {pause:g} s pause (a lone message):")
    for sse, label in ((False, "JSON"), (True, "SSE ")):
        series(f"{label} whole request", sorted(t.ms for t in done if t.sse == sse and t.after_idle), None)
    parts = [f"bot {bot_s * 1000 / n:.2f} ms/request", f"client (this process) {cpu.bot_s * 1000 / n:.2f}"]
    if cpu.server_s is not None:
        parts.append(f"fake LLM {cpu.server_s * 1000 / n:.2f}")
    if cpu.postgres_s is not None:
        parts.append(f"PostgreSQL {cpu.postgres_s * 1000 / n:.2f}")
    if cpu.others_s is not None and cpu.wall_s:
        others = max(0.0, cpu.others_s - bot_s) / cpu.wall_s
        parts.append(f"other processes {others:.2f} of {cpu.cores / cpu.wall_s:.0f} cores")
    print("    CPU: " + ", ".join(parts))
    print()
    return ok


# ---------------------------------------------------------------- part 2: many streams at once


async def part_crowd(db: BenchDatabase, people_n: int, rounds: int, delay: float) -> bool:
    """Part 2; True when every round after the cold one met the goal with every stream answered."""
    print(
        f"== 2. {people_n} people open an SSE stream at once (a token and a session each), the model answering "
        f"after {delay:g} s: first request sent → the last message.completed; a cold round, then {rounds} rounds =="
    )
    ok = True
    async with FakeLLMProcess(delay) as llm, bot_serve(db, llm.base_url) as bot, client() as http:
        people = await make_people(db, llm.base_url, bot.url, http, people_n, "crowd")
        for r in range(rounds + 1):
            t0 = time.perf_counter()
            done = await asyncio.gather(*(sse_turn(http, bot.url, p, f"hello, round {r}") for p in people))
            wall = max(t.done for t in done) - t0
            got = sum(t.ok for t in done)
            ends = sorted((t.done - t0) * 1000 for t in done)
            firsts = sorted((t.first_byte or t.done) - t0 for t in done)
            if r:
                ok = ok and wall <= GOAL_CROWD_S and got == people_n
            label = f"round {r}" if r else "cold   "
            print(
                f"    {label}: {wall:5.2f} s   goal <= {GOAL_CROWD_S:g} s   {verdict(wall, GOAL_CROWD_S)}   "
                f"{got}/{people_n} answered; streams ended p50 {percentile(ends, 50):.0f} ms, first bytes by "
                f"{firsts[-1] * 1000:.0f} ms"
            )
            await asyncio.sleep(1.0)  # not timed
    print()
    return ok


async def bench(args: argparse.Namespace) -> int:
    """Run the parts and print their figures; 1 when a goal is missed."""
    async with bench_database() as db:
        print(f"fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__}, aiohttp {aiohttp.__version__} (client)")
        print()
        status = 0
        if args.turns:
            status |= int(not await part_overhead(db, args.turns, args.warmup, args.burst, args.pause))
        if args.crowd_users:
            status |= int(not await part_crowd(db, args.crowd_users, args.crowd_rounds, args.crowd_delay))
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when a goal is missed."""
    p = parser("http_api", __doc__)
    p.add_argument("--turns", type=int, default=300, help="measured turns of each kind in part 1 (300; 0 skips)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up turns of each kind (20)")
    p.add_argument("--burst", type=int, default=8, help="requests back to back between pauses (8)")
    p.add_argument("--pause", type=float, default=0.5, help="seconds of pause after each burst (0.5)")
    p.add_argument("--crowd-users", type=int, default=200, help="people at once in part 2 (200; 0 skips)")
    p.add_argument("--crowd-rounds", type=int, default=2, help="rounds of part 2 after the cold one (2)")
    p.add_argument("--crowd-delay", type=float, default=1.0, help="the model's answer time in part 2 (1 s)")
    args = parse(p, argv, {"turns": 40, "warmup": 8, "crowd_users": 50, "crowd_rounds": 1})
    if args.burst < 1 or args.pause <= 0 or args.turns < 0:
        p.error("--burst must be at least 1, --pause positive")
    quiet_logging()
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
