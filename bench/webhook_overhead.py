"""The Telegram webhook over the process's HTTP server (bot/web.py): private text updates POSTed to the webhook route
of a real WebServer with the TelegramAdapter in webhook mode and the Core with its inbox on a real PostgreSQL, over
one kept-alive connection as Telegram does; the fake Bot API (tests.fake_telegram) and the client run on the bot's
event loop, the fake model answers "ok" at once from its own process. Part 1, the server alone: GET /healthz and a
POST with a wrong secret (403, nothing stored), back to back. Part 2, turns: POST → the webhook's 200 (the update is
stored in the inbox) and POST → the reply's sendMessage at the fake, one turn at a time, in bursts of 8 with a 1 s
pause after each (the adapter's send window never makes a turn wait); the first turn after a pause is reported apart.
`--compare REV` runs this same file against REV's packages (exported with `git archive` under /tmp, this file copied
in; no git state is touched) and against the working tree, interleaved, and prints both side by side.
Goal: a webhook turn costs no more than a polled one (Telegram turn overhead p50 ≤ 10 ms, p99 ≤ 20 ms).
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import importlib.metadata
import io
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from adapters.telegram import TelegramAdapter
from bench.common import (
    REPO_ROOT,
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
from bench.telegram_overhead import TimedFakeTelegram
from bot.app import freeze_startup_objects
from bot.web import WebServer

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
USERS = (7001, 7002, 7003, 7004, 7005)  # private chats: chat id == user id, as on Telegram
MESSAGE_ID_STRIDE = 16  # room for the bot's own message ids in the chat between two incoming ones
REPLY_TIMEOUT_S = 30.0

# the figures part 1 and 2 print, by label (read back by --compare)
HEALTHZ, FORBIDDEN = "GET /healthz", "POST, wrong secret (403)"
STORED, REPLIED = "POST → 200 (stored)", "POST → sendMessage at the fake"
STORED_IDLE, REPLIED_IDLE = "after a pause: POST → 200", "after a pause: POST → sendMessage"
LABELS = (HEALTHZ, FORBIDDEN, STORED, REPLIED, STORED_IDLE, REPLIED_IDLE)


# ---------------------------------------------------------------- the bot behind its HTTP server


def free_port() -> int:
    """A port nobody listens on now (bound and closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def add_webhook(web: WebServer, adapter: TelegramAdapter) -> None:
    """The adapter's webhook route on the server (WebServer.add_webhook; an older aiohttp WebServer: its router)."""
    assert adapter.webhook_path is not None
    if hasattr(web, "add_webhook"):
        web.add_webhook(adapter.webhook_path, adapter.on_webhook)
        return
    router: Any = web.app.router  # before the move to FastAPI: an aiohttp application
    router.add_post(adapter.webhook_path, adapter.on_webhook)


def server_name(web: WebServer) -> str:
    """Which HTTP server this revision runs, with its versions."""
    if type(web.app).__module__.startswith("aiohttp"):
        return f"aiohttp {importlib.metadata.version('aiohttp')}"
    server: Any = getattr(web, "_server", None)
    protocol = server.config.http_protocol_class.__name__ if server is not None else "?"
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("uvicorn", "fastapi", "starlette"))
    return f"{versions}; HTTP protocol {protocol}"


@dataclass
class Rig:
    """A running bot in webhook mode, its fake Bot API and a client with one kept-alive connection."""

    fake: TimedFakeTelegram
    web: WebServer
    http: aiohttp.ClientSession
    url: str
    secret: str
    llm: FakeLLMProcess
    turns: int = 0

    def update(self) -> bytes:
        """The next private text update, as Telegram posts it."""
        n, self.turns = self.turns, self.turns + 1
        user = USERS[n % len(USERS)]
        update = self.fake.message_update(
            f"what is on my list for today? (#{n})",
            message_id=(n + 1) * MESSAGE_ID_STRIDE,
            chat_id=user,
            user_id=user,
        )
        update["update_id"] = 1_000_000 + n
        self.fake._prepare(update)  # the fake knows the message (the reply refers to it)
        return json.dumps(update).encode()

    async def post(self, body: bytes, secret: str) -> int:
        """POST one update to the webhook; the status once the whole answer is read."""
        headers = {"Content-Type": "application/json", SECRET_HEADER: secret}
        async with self.http.post(self.url, data=body, headers=headers) as resp:
            await resp.read()
            return resp.status


@asynccontextmanager
async def make_rig(db: BenchDatabase, llm: FakeLLMProcess) -> AsyncIterator[Rig]:
    """The production wiring (bot/app.py's order: the server first, then the adapter) with Telegram at the fake."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/telegram"
    async with TimedFakeTelegram() as fake:
        api = {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.base_url, "TELEGRAM_WEBHOOK_URL": url}
        async with bench_core(db.dsn, llm.base_url, settings=api) as core:
            adapter = TelegramAdapter(core, core.settings)
            web = WebServer(core, ["telegram"], port, host="127.0.0.1")
            add_webhook(web, adapter)
            await web.start()
            try:
                await adapter.start()
                freeze_startup_objects()
                try:
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
                        yield Rig(fake, web, http, url, core.settings.webhook_secret, llm)
                finally:
                    await core.drain(5.0)
                    await adapter.stop()
            finally:
                await web.stop()


# ---------------------------------------------------------------- part 1: the server alone


async def part_server(rig: Rig, requests: int, meter: CpuMeter) -> None:
    """GET /healthz and a wrong-secret POST, `requests` each back to back (after a tenth as many unmeasured)."""
    print(f"== 1. The server alone: {requests} requests each, back to back on one connection ==")
    body = rig.update()
    health = rig.url.replace("/telegram", "/healthz")

    async def healthz() -> int:
        async with rig.http.get(health) as resp:
            await resp.read()
            return resp.status

    async def forbidden() -> int:
        return await rig.post(body, "wrong")

    for label, call, status in ((HEALTHZ, healthz, 200), (FORBIDDEN, forbidden, 403)):
        for _ in range(max(1, requests // 10)):
            assert await call() == status
        ms: list[float] = []
        meter.start()
        for _ in range(requests):
            t0 = time.monotonic()
            got = await call()
            ms.append((time.monotonic() - t0) * 1000)
            assert got == status, (label, got)
        cpu = meter.stop(None)
        print(f"    {label:<34} {spread(sorted(ms))}")
        print(f"    {label:<34} CPU {cpu.bot_s * 1000 / requests:.3f} ms/request (server and client)")
    print()


# ---------------------------------------------------------------- part 2: turns through the webhook


@dataclass(frozen=True)
class Turn:
    """One turn's figures in ms from the POST."""

    stored: float  # the webhook's 200 was read
    replied: float  # the reply's sendMessage reached the fake
    after_idle: bool


async def one_turn(rig: Rig, after_idle: bool) -> Turn:
    """POST one update, read the 200, then wait for the reply at the fake."""
    body = rig.update()
    before = len(rig.fake.sent)
    t0 = time.monotonic()
    status = await rig.post(body, rig.secret)
    t200 = time.monotonic()
    assert status == 200, status
    await rig.fake.wait_sent(before + 1, timeout=REPLY_TIMEOUT_S)
    reply = rig.fake.sent[before]
    assert str(reply.get("text", "")).startswith("ok"), reply
    return Turn((t200 - t0) * 1000, (rig.fake.sent_at[before] - t0) * 1000, after_idle)


async def run_turns(rig: Rig, turns: int, burst: int, pause_s: float) -> list[Turn]:
    """`turns` turns, `burst` back to back then a pause (not timed)."""
    out: list[Turn] = []
    for i in range(turns):
        if i and i % burst == 0:
            await asyncio.sleep(pause_s)
        out.append(await one_turn(rig, after_idle=i % burst == 0))
    return out


async def part_turns(rig: Rig, args: argparse.Namespace, meter: CpuMeter) -> None:
    """The headline: the webhook's 200 and the reply, back to back and after a pause."""
    await run_turns(rig, args.warmup, args.burst, args.pause)
    await asyncio.sleep(args.pause)
    print(
        f"== 2. Turns through the webhook: {args.turns} after {args.warmup} warm-up, in bursts of {args.burst}, "
        f"{args.pause:g} s pause after each (not timed) =="
    )
    await rig.llm.stats()  # reset
    meter.start()
    turns = await run_turns(rig, args.turns, args.burst, args.pause)
    cpu = meter.stop((await rig.llm.stats()).cpu_s)
    print("  [HEADLINE]")
    for idle, (stored, replied) in ((False, (STORED, REPLIED)), (True, (STORED_IDLE, REPLIED_IDLE))):
        chosen = [t for t in turns if t.after_idle == idle]
        print(f"    {stored:<34} {spread(sorted(t.stored for t in chosen))}")
        print(f"    {replied:<34} {spread(sorted(t.replied for t in chosen))}")
    print(f"    {cpu.line(len(turns))}  (the bot process holds the fake Bot API and the client too)")
    print()


async def bench(args: argparse.Namespace) -> None:
    """Run the parts and print their figures."""
    async with bench_database() as db, FakeLLMProcess(0.0) as llm, make_rig(db, llm) as rig:
        print(f"HTTP server: {server_name(rig.web)}; client aiohttp {aiohttp.__version__}, one kept-alive connection")
        print()
        meter = CpuMeter(db.postmaster)
        if args.requests:
            await part_server(rig, args.requests, meter)
        await part_turns(rig, args, meter)


# ---------------------------------------------------------------- --compare REV: old and new side by side

_SPREAD = re.compile(r"^\s+(.+?)\s+p50\s+([\d.]+)\s+p90\s+[\d.]+\s+p99\s+([\d.]+)\s")
_CPU = re.compile(r"^\s+(.+?)\s+CPU ([\d.]+) ms/request")
_SERVER = re.compile(r"^HTTP server: (.*?);? client")


def figures(out: str) -> dict[str, float]:
    """`<label> p50` and `<label> p99` of every figure a run printed."""
    found: dict[str, float] = {}
    for line in out.splitlines():
        if (m := _SPREAD.match(line)) and m[1] in LABELS:
            found[f"{m[1]} p50"], found[f"{m[1]} p99"] = float(m[2]), float(m[3])
        elif (m := _CPU.match(line)) and m[1] in LABELS:
            found[f"{m[1]} CPU"] = float(m[2])
    return found


def export(rev: str) -> tuple[str, Path]:
    """REV's commit and its files under /tmp (`git archive`, read only for the repository), with this file in it."""
    run = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO_ROOT, capture_output=True)
    sha = run.stdout.decode().strip()
    if run.returncode or not sha:
        raise SystemExit(f"--compare: no commit {rev!r} in {REPO_ROOT}")
    tree = Path(tempfile.gettempdir()) / f"bench-webhook-{sha[:12]}"
    if not (tree / "bot" / "web.py").exists():
        archive = subprocess.run(["git", "archive", sha], cwd=REPO_ROOT, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
    shutil.copyfile(Path(__file__), tree / "bench" / "webhook_overhead.py")
    return sha, tree


def side_command(args: argparse.Namespace) -> list[str]:
    """This venv's Python running this bench (found in the side's root) with the compared options."""
    options = {"--turns": args.turns, "--warmup": args.warmup, "--burst": args.burst, "--pause": args.pause}
    options["--requests"] = args.requests
    return [sys.executable, "-m", "bench.webhook_overhead", *(str(x) for kv in options.items() for x in kv)]


def compare(args: argparse.Namespace) -> int:
    """Both sides `--compare-runs` times, interleaved (old, new, new, old, …), then their figures side by side."""
    sha, tree = export(args.compare)
    roots = {"old": tree, "new": REPO_ROOT}
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    servers: dict[str, str] = {}
    order = [side for i in range(args.compare_runs) for side in (("old", "new") if i % 2 == 0 else ("new", "old"))]
    print(f"old = {args.compare} ({sha[:12]}, exported to {tree}), new = the working tree ({REPO_ROOT})")
    for n, side in enumerate(order, start=1):
        t0 = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(roots[side])}
        done = subprocess.run(side_command(args), cwd=roots[side], env=env, capture_output=True, text=True)
        got = figures(done.stdout)
        if not all(f"{label} p50" in got for label in LABELS if args.requests or label not in (HEALTHZ, FORBIDDEN)):
            said = (done.stdout + done.stderr)[-3000:]
            print(f"run {n} ({side}) printed no figures (exit {done.returncode}):\n{said}")
            return 2
        runs[side].append(got)
        servers[side] = next((m[1] for line in done.stdout.splitlines() if (m := _SERVER.match(line))), "?")
        print(f"  run {n}: {side}  {STORED} p50 {got[f'{STORED} p50']:.2f} ms  ({time.monotonic() - t0:.0f} s)")
    for side in ("old", "new"):
        print(f"{side}: {servers[side]}")
    print(f"\n== Old and new side by side ({args.compare_runs} runs each, ms; interleaved {', '.join(order)}) ==")
    width = 7 * args.compare_runs
    print(f"  {'':42} {'old':>{width}}   {'new':>{width}}   {'new - old':>9} (medians)")
    for key in runs["new"][0]:
        old, new = [r.get(key, float("nan")) for r in runs["old"]], [r[key] for r in runs["new"]]
        cells = [" ".join(f"{v:6.2f}" for v in values) for values in (old, new)]
        delta = statistics.median(new) - statistics.median(old)
        print(f"  {key:42} {cells[0]:>{width}}   {cells[1]:>{width}}   {delta:+9.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run (or compare)."""
    p = parser("webhook_overhead", __doc__)
    p.add_argument("--requests", type=int, default=2000, help="requests of each kind in part 1 (2000; 0 skips)")
    p.add_argument("--turns", type=int, default=400, help="measured turns in part 2 (400)")
    p.add_argument("--warmup", type=int, default=40, help="warm-up turns (40)")
    p.add_argument("--burst", type=int, default=8, help="turns back to back between pauses (8)")
    p.add_argument("--pause", type=float, default=1.0, help="seconds of pause after each burst (1)")
    p.add_argument("--compare", metavar="REV", help="this bench on REV's packages and on the working tree")
    p.add_argument("--compare-runs", type=int, default=2, help="runs of each side with --compare (2)")
    args = parse(p, argv, {"requests": 300, "turns": 64, "warmup": 16})
    if args.burst < 1 or args.pause <= 0 or args.turns < 1:
        p.error("--burst and --turns must be at least 1 and --pause positive")
    if args.compare:
        return compare(args)
    quiet_logging()
    asyncio.run(bench(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
