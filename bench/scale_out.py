"""Scale-out: Telegram webhooks pushed round-robin to 1, 2 and 4 real `python -m bot` processes on one PostgreSQL,
against the fake Bot API (tests.fake_telegram) with the fake model in its own process answering every turn after 1 s
with a text naming the message it answers. The bench plays Telegram: it POSTs each update to the next process's
/telegram with the secret header (on a non-200 or a connection error, to the one after), and sends a user's next
message only once the previous POST got its 200. Every (chat, message) must be answered exactly once and each chat's
answers in order; wall time runs from the first POST to the last answer. A last run SIGKILLs one of 4 processes midway:
its held updates come back after the inbox lease and must still be answered once. The fake Bot API answers 429 past
Telegram's 30 sendMessage a second per bot, whichever process sends them: 30 at once, then 30 a second, as PTB's
AIORateLimiter reads Telegram's limit (`--strict-flood`: 30 in any 1 s instead); the goal is no 429 (the processes
share the 30 through the fleet table, each a leaky bucket of 27/n at once and 27/n a second) and, when the bot's own
CPU is the limit (`--cpu-per-process 0.15` caps each process with a cgroup, as root), 4 processes answering at least 3
times as fast as one.
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio
import itertools
import os
import signal
import socket
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
from telegram.constants import FloodLimit

from adapters.telegram.limits import TELEGRAM_FLEET_REFRESH_S, TELEGRAM_SEND_SHARE
from bench.common import REPO_ROOT, TAG, FakeLLMProcess, bench_database, parse, parser, proc_cpu, quiet_logging
from core.constants import FLEET_ALIVE_S, INBOX_CONCURRENCY, INBOX_LEASE_S
from tests.fake_telegram import FakeTelegram

USERS = 1000
MESSAGES = 3
MODEL_DELAY_S = 1.0
PROCESS_COUNTS = (1, 2, 4)
KILL_PROCESSES = 4
GOAL_SPEEDUP = 3.0  # 4 processes vs one (unless one process already answers at the bot's Telegram rate)
BUDGET_HELD = 0.8  # a run at this share of the bot's Telegram rate or more is held by it
SECRET = "scale-out-bench-secret"
USER_BASE = 500_000  # chat id == user id (private chats); each run takes the next block of ids
PUSH_CONNECTIONS = 100  # the bench's open POSTs at most (Telegram: max_connections per bot)
READY_TIMEOUT_S = 60.0
READY_POLL_S = 0.1
RETRY_PAUSE_S = 0.05
STOP_TIMEOUT_S = 40.0
DRAIN_TIMEOUT_S = 15.0
ANSWER_TIMEOUT_S = 600.0
BOT_RATE = int(FloodLimit.MESSAGES_PER_SECOND)  # Telegram's sendMessages per second per bot (all processes together)
SETTLE_S = TELEGRAM_FLEET_REFRESH_S + 0.5  # after start, until every process has counted the others in its share
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PERIOD_US = 100_000  # --cpu-per-process: the quota is this period's share


# ---------------------------------------------------------------- the fake Bot API


class CountingTelegram(FakeTelegram):
    """FakeTelegram that remembers when each sendMessage arrived, lets every process set its webhook and answers 429
    past Telegram's per-bot flood limit."""

    def __init__(self, strict_flood: bool) -> None:
        """The default test bot; setWebhook is never refused for coming too soon; 429 past 30 at once and 30 a second
        (`strict_flood`: past 30 in any 1 s)."""
        super().__init__()
        self.set_webhook_every = 0.0
        self.limit_floods(strict=strict_flood)
        self.sent_at: list[float] = []

    async def _send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        """Record the arrival time in step with `sent`."""
        result = await super()._send_message(params)
        self.sent_at.append(time.monotonic())
        return result

    def reset(self) -> None:
        """Forget what was sent and the 429s (between runs)."""
        self.sent.clear()
        self.sent_at.clear()
        self.flood_429s = self.flood_peak = 0


# ---------------------------------------------------------------- bot processes


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Bot:
    """One `python -m bot` process in webhook mode."""

    proc: asyncio.subprocess.Process
    port: int
    log: Path
    cpu_mark: float = 0.0
    cgroup: Path | None = None  # --cpu-per-process: the cgroup capping its CPU

    @property
    def url(self) -> str:
        """Where Telegram (the bench) posts updates."""
        return f"http://127.0.0.1:{self.port}/telegram"

    def cpu_since_mark(self) -> float | None:
        """CPU seconds since `mark_cpu`."""
        now = proc_cpu(self.proc.pid)
        return None if now is None else now - self.cpu_mark

    def mark_cpu(self) -> None:
        """Remember the CPU used so far."""
        self.cpu_mark = proc_cpu(self.proc.pid) or 0.0


def cap_cpu(pid: int, cores: float) -> Path:
    """Put a process in a cgroup of its own that lets it use at most `cores` CPUs (v1 `cpu` or v2; needs root)."""
    quota = str(int(cores * CGROUP_PERIOD_US))
    v1 = CGROUP_ROOT / "cpu"
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            group = v1 / f"bench-bot-{pid}"
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text(str(CGROUP_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(quota)
        else:
            group = CGROUP_ROOT / f"bench-bot-{pid}"
            group.mkdir()
            (group / "cpu.max").write_text(f"{quota} {CGROUP_PERIOD_US}")
        (group / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        raise SystemExit(f"--cpu-per-process needs a writable cgroup cpu controller (root): {e}") from None
    return group


async def start_bot(dsn: str, tg: FakeTelegram, llm_url: str, tmp: Path, index: int, cores: float | None) -> Bot:
    """Launch one bot process (its log in tmp), capped at `cores` CPUs when given."""
    port = free_port()
    data = tmp / f"data-{index}"
    data.mkdir(parents=True, exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TELEGRAM_", "DISCORD_", "LLM_"))},
        "DATABASE_URL": dsn,
        "DATA_DIR": str(data),
        "TELEGRAM_BOT_TOKEN": tg.token,
        "TELEGRAM_API_BASE_URL": tg.base_url,
        "TELEGRAM_WEBHOOK_URL": f"http://127.0.0.1:{port}/telegram",
        "TELEGRAM_WEBHOOK_SECRET": SECRET,
        "PORT": str(port),
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": llm_url,
        "LLM_API_KEY": "bench",
        "LLM_MODEL": "fake-model",
        "ALLOWED_USERS": "*",
        "ADMINS": "",
        "DEFAULT_TIMEZONE": "UTC",
    }
    log = tmp / f"bot-{index}.log"
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "bot"),
            cwd=str(tmp),
            env={**env, "PYTHONPATH": str(REPO_ROOT)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    return Bot(proc, port, log, cgroup=None if cores is None else cap_cpu(proc.pid, cores))


async def wait_ready(http: aiohttp.ClientSession, bot: Bot) -> None:
    """Poll GET /readyz until 200; fail with the process's log tail if it exits or takes too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if bot.proc.returncode is not None:
            break
        with suppress(aiohttp.ClientError):
            async with http.get(f"http://127.0.0.1:{bot.port}/readyz") as r:
                if r.status == 200:
                    return
        await asyncio.sleep(READY_POLL_S)
    tail = bot.log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"bot on port {bot.port} not ready (exit {bot.proc.returncode}):\n{tail}")


async def stop_bot(bot: Bot) -> None:
    """SIGTERM (a graceful stop), SIGKILL if it lingers."""
    if bot.proc.returncode is None:
        with suppress(ProcessLookupError):
            bot.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(bot.proc.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with suppress(ProcessLookupError):
                bot.proc.kill()
    await bot.proc.wait()
    if bot.cgroup is not None:
        with suppress(OSError):
            bot.cgroup.rmdir()


# ---------------------------------------------------------------- one run


@dataclass
class Outcome:
    """What one run measured."""

    processes: int
    expected: int
    wall_s: float
    answered: int  # distinct (chat, message) answered
    lost: int
    duplicated: int
    out_of_order: int  # chats whose answers came in another order
    post_retries: int
    flood_429s: int  # 429s the fake Bot API answered for going over the bot's 30 messages per second
    peak: int  # the most messages the fake counted within one second
    cpu_s: list[float | None] = field(default_factory=list)
    killed: bool = False
    retaken: int = 0  # updates taken more than once (the killed process's, after its lease)

    @property
    def rate(self) -> float:
        """Answers per second over the wall time."""
        return self.answered / self.wall_s if self.wall_s > 0 else 0.0


class Pusher:
    """Plays Telegram: POSTs updates round-robin, retrying on the next process until a 200."""

    def __init__(self, http: aiohttp.ClientSession, tg: FakeTelegram, bots: Sequence[Bot], ids: itertools.count[int]):
        """Push to `bots` with update ids from `ids`."""
        self.http, self.tg, self.bots, self.ids = http, tg, list(bots), ids
        self.turn = itertools.count()
        self.retries = 0
        self.update_ids: list[int] = []

    async def post(self, update: dict[str, Any]) -> None:
        """Deliver one update (stored durably once a process says 200)."""
        while True:
            bot = self.bots[next(self.turn) % len(self.bots)]
            try:
                async with self.http.post(
                    bot.url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}
                ) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, OSError):
                pass
            self.retries += 1
            await asyncio.sleep(RETRY_PAUSE_S)

    async def user(self, uid: int, index: int) -> None:
        """One user's messages in order, each after the previous one was acknowledged."""
        for n in range(1, MESSAGES + 1):
            update = self.tg.message_update(f"u{index} m{n}", chat_id=uid, user_id=uid, first_name=f"U{index}")
            update["update_id"] = next(self.ids)
            self.update_ids.append(update["update_id"])
            await self.post(update)


def check(tg: CountingTelegram, uids: Sequence[int]) -> tuple[int, int, int, int]:
    """(answered, lost, duplicated, chats out of order) from the fake's sendMessages to these chats."""
    wanted = set(uids)
    per_chat: dict[int, list[int]] = defaultdict(list)
    for entry in tg.sent:
        chat = int(entry["chat_id"])
        found = TAG.search(str(entry.get("text", "")))
        if chat in wanted and found:
            per_chat[chat].append(int(found.group(2)))
    answered = sum(len(set(v)) for v in per_chat.values())
    duplicated = sum(len(v) - len(set(v)) for v in per_chat.values())
    out_of_order = sum(1 for v in per_chat.values() if v != sorted(v))
    return answered, len(uids) * MESSAGES - answered, duplicated, out_of_order


async def retaken_once_drained(dsn: str, update_ids: list[int]) -> int:
    """Wait (at most DRAIN_TIMEOUT_S) until every stored update was handled (a late duplicate would come before), then
    count these updates that were taken more than once."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if not await conn.fetchval("SELECT count(*) FROM inbox WHERE done_at IS NULL"):
                break
            await asyncio.sleep(READY_POLL_S)
        sql = "SELECT count(*) FROM inbox WHERE update_id = ANY($1::bigint[]) AND attempts > 1"
        return int(await conn.fetchval(sql, update_ids))
    finally:
        await conn.close()


@dataclass
class Fleet:
    """What every run shares: the database, the fake Bot API and model, update ids, the CPU cap."""

    dsn: str
    tg: CountingTelegram
    llm_url: str
    users: int
    cores: float | None
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


async def run(fleet: Fleet, procs: int, block: int, *, kill: bool = False) -> Outcome:
    """Start `procs` bots, push users × MESSAGES updates, wait for every answer (killing one bot midway if asked)."""
    dsn, tg, users = fleet.dsn, fleet.tg, fleet.users
    uids = [USER_BASE + block * users + i for i in range(users)]
    expected = users * MESSAGES
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp_name:
        tmp = Path(tmp_name)
        bots = await asyncio.gather(*(start_bot(dsn, tg, fleet.llm_url, tmp, i, fleet.cores) for i in range(procs)))
        connector = aiohttp.TCPConnector(limit=PUSH_CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector) as http:
            try:
                await asyncio.gather(*(wait_ready(http, b) for b in bots))
                await asyncio.sleep(SETTLE_S)  # every process has counted the others (a deploy's first seconds)
                tg.reset()
                for b in bots:
                    b.mark_cpu()
                pusher = Pusher(http, tg, bots, fleet.ids)
                t0 = time.monotonic()
                pushing = asyncio.gather(*(pusher.user(uid, i) for i, uid in enumerate(uids)))
                cpu: list[float | None] = []
                if kill:
                    await tg.wait_for(lambda: len(tg.sent) >= expected // 2, ANSWER_TIMEOUT_S, what="half the answers")
                    cpu = [b.cpu_since_mark() for b in bots]
                    bots[-1].proc.kill()
                    await bots[-1].proc.wait()
                    pusher.bots = bots[:-1]
                await pushing
                await tg.wait_for(
                    lambda: len(tg.sent) >= expected and check(tg, uids)[1] == 0, ANSWER_TIMEOUT_S, what="every answer"
                )
                wall = tg.sent_at[-1] - t0
                live = [b.cpu_since_mark() for b in bots if b.proc.returncode is None]
                cpu = [*live, cpu[-1]] if kill else live
                again = await retaken_once_drained(dsn, pusher.update_ids)
                answered, lost, duplicated, disorder = check(tg, uids)
                counts = (pusher.retries, tg.flood_429s, tg.flood_peak)
                return Outcome(procs, expected, wall, answered, lost, duplicated, disorder, *counts, cpu, kill, again)
            finally:
                await asyncio.gather(*(stop_bot(b) for b in bots))


# ---------------------------------------------------------------- report


def fmt_cpu(cpu: Sequence[float | None], wall: float) -> str:
    """CPU seconds per process and its share of one core over the wall time."""
    return ", ".join("?" if c is None else f"{c:.1f}s ({100 * c / wall:.0f}%)" for c in cpu)


def report(outcomes: Sequence[Outcome], cores: float | None) -> None:
    """Print the side-by-side table and the verdicts."""
    head = ("procs", "answers", "wall s", "ans/s", "speedup", "lost", "dup", "order", "retry", "429s", "peak/s")
    print("\n" + " ".join(f"{h:>7}" for h in head) + "  CPU per process (share of one core)")
    base = next((o.rate for o in outcomes if o.processes == 1 and not o.killed), 0.0)
    for o in outcomes:
        speed = f"{o.rate / base:.2f}x" if base else "-"
        cells: tuple[object, ...] = (f"{o.processes}{'*' if o.killed else ''}", o.answered, f"{o.wall_s:.1f}")
        cells += (f"{o.rate:.1f}", speed, o.lost, o.duplicated, o.out_of_order, o.post_retries, o.flood_429s, o.peak)
        print(" ".join(f"{c:>7}" for c in cells) + f"  {fmt_cpu(o.cpu_s, o.wall_s)}")
    for o in outcomes:
        if o.killed:
            print(
                f"  * one of {KILL_PROCESSES} processes SIGKILLed at half the answers (its CPU is the last figure, up "
                f"to the kill); its held updates came back after the {INBOX_LEASE_S:g} s lease: {o.retaken} taken "
                f"again; the survivors count it in their Telegram share for up to {FLEET_ALIVE_S:g} s"
            )
    budget = BOT_RATE * TELEGRAM_SEND_SHARE
    print(
        f"ceilings: per process {INBOX_CONCURRENCY} chats at once / {MODEL_DELAY_S:g} s model = "
        f"{INBOX_CONCURRENCY / MODEL_DELAY_S:g} answers/s; the fleet's share of Telegram's {BOT_RATE} sendMessage a "
        f"second = {budget:g}/s for all processes together (and {budget:g} at once)"
        + ("" if cores is None else f"; CPU {cores:g} core per process (cgroup)")
    )
    ok = all(o.lost == 0 and o.duplicated == 0 and o.out_of_order == 0 for o in outcomes)
    print(f"exactly once, in order: {'ok' if ok else 'FAILED'}")
    floods = sum(o.flood_429s for o in outcomes)
    print(f"Telegram's {BOT_RATE} messages/s per bot kept (no 429s): {'ok' if floods == 0 else f'{floods} 429s'}")
    four = next((o.rate for o in outcomes if o.processes == 4 and not o.killed), None)
    if base and four is not None:
        held = base >= BUDGET_HELD * budget  # one process already sends at the bot's rate: more cannot send faster
        verdict = "held by Telegram's rate per bot" if held else "ok" if four / base >= GOAL_SPEEDUP else "MISSED"
        print(f"4 processes vs 1: {four / base:.2f}x (goal >= {GOAL_SPEEDUP:g}x): {verdict}")


async def bench(users: int, counts: Sequence[int], kill: bool, cores: float | None, strict_flood: bool) -> None:
    """Every run on one database, one fake Bot API and one fake model."""
    fake = CountingTelegram(strict_flood)
    async with bench_database() as db, FakeLLMProcess(MODEL_DELAY_S, echo=True) as llm, fake as tg:
        capped = "" if cores is None else f", each bot process capped at {cores:g} core"
        print(
            f"{users} users x {MESSAGES} messages, model {MODEL_DELAY_S:g} s per answer, {INBOX_CONCURRENCY} chats at "
            f"once per process{capped}"
        )
        fleet = Fleet(db.dsn, tg, llm.base_url, users, cores)
        outcomes: list[Outcome] = []
        for block, procs in enumerate(counts):
            outcomes.append(await run(fleet, procs, block))
            print(f"  {procs} process(es): {outcomes[-1].wall_s:.1f} s", flush=True)
        if kill:
            outcomes.append(await run(fleet, KILL_PROCESSES, len(counts), kill=True))
            print(f"  {KILL_PROCESSES} processes, one killed: {outcomes[-1].wall_s:.1f} s", flush=True)
        report(outcomes, cores)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run."""
    p = parser("scale_out", __doc__)
    p.add_argument("--users", type=int, default=USERS, help=f"users, each sending {MESSAGES} messages ({USERS})")
    p.add_argument("--procs", type=int, nargs="+", default=list(PROCESS_COUNTS), help="process counts (1 2 4)")
    p.add_argument("--no-kill", action="store_true", help="skip the SIGKILL run")
    p.add_argument(
        "--cpu-per-process",
        type=float,
        metavar="CORES",
        help="cap each bot process at CORES CPUs with a cgroup (root), so that the bot's own CPU is the limit",
    )
    p.add_argument("--strict-flood", action="store_true", help="the fake answers 429 past 30 sendMessage in any 1 s")
    args = parse(p, argv, {"users": 60, "procs": [1, 2]})
    quiet_logging()
    asyncio.run(bench(args.users, args.procs, not args.no_kill, args.cpu_per_process, args.strict_flood))


if __name__ == "__main__":
    main()
