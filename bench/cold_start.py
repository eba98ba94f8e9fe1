"""What a process costs at rest (issue 35): `import bot.__main__` (median of `--imports` fresh interpreters, and the
modules it loads), then, per mode, a real `python -m bot` process: seconds until it is ready, its RSS (VmRSS) after
`--idle` s at rest, and again at rest after `--turns` turns (a message each, answered by the instant fake model). Modes:
`terminal` (no platform token: the chat on stdin), `polling` (Telegram long polling against tests.fake_telegram),
`webhook` (Telegram webhook mode on PORT; the fake posts the updates) and `serve` (`bot serve`, turns through
/v1/chat/completions with a `bot token`). No MCP servers, no files. Last, what a first PDF, Word file and photo
pay for loading their libraries (a fresh interpreter each, the first call timed against the second).
Goals (issue 35): idle RSS <= 100 MiB for polling and serve; the import <= 0.8 s on a quiet machine.
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass

import aiohttp

from bench.common import REPO_ROOT, FakeLLMProcess, bench_database, load_average, parse, parser, quiet_logging
from bench.scale_out import free_port
from tests.fake_telegram import FakeTelegram

MODES = ("terminal", "polling", "webhook", "serve")
GOAL_RSS_MIB = 100.0
GOAL_IMPORT_S = 0.8
READY_TIMEOUT_S = 60.0
TURN_TIMEOUT_S = 30.0
POLL_S = 0.05
USER_ID = 4242
IMPORT_PROBE = (
    "import time; t = time.perf_counter(); import bot.__main__, sys; print(time.perf_counter() - t, len(sys.modules))"
)
FIRST_USE = {  # a first file of each kind: its module imported and the file read, against a second file
    "PDF": ("pdf", "from core.media.documents import extract", "extract(data, 'x.pdf', 'application/pdf')"),
    "Word": ("docx", "from core.media.documents import extract", "extract(data, 'x.docx', None)"),
    "photo": ("png", "from core.media.images import prepare", "prepare(data)"),
}
FIRST_USE_PROBE = """import asyncio, sys, time
from pathlib import Path
import core  # what a running bot has loaded already
data = Path(sys.argv[1]).read_bytes()
t0 = time.perf_counter()
{imp}
asyncio.run({call})
t1 = time.perf_counter()
asyncio.run({call})
print(t1 - t0, time.perf_counter() - t1)
"""


@dataclass
class Figures:
    """One mode's figures."""

    ready_s: float
    idle_mib: float
    after_turns_mib: float


def rss_mib(pid: int) -> float:
    """A process's resident memory now (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a bot process: no platform or model settings from outside, this checkout first."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("TELEGRAM_", "DISCORD_", "LLM_", "MCP_"))}
    base = {"PYTHONPATH": str(REPO_ROOT), "ALLOWED_USERS": "*", "DEFAULT_TIMEZONE": "UTC"}
    return {**keep, **base, "USER_MESSAGES_PER_MINUTE": "100000", **extra}  # the turns come faster than a person's


def import_figures(runs: int) -> tuple[float, list[float], int]:
    """The median seconds of `import bot.__main__` over `runs` fresh interpreters, every run, and the modules loaded."""
    times, modules = [], 0
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", IMPORT_PROBE], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        times.append(float(out[0]))
        modules = int(out[1])
    return statistics.median(times), times, modules


async def wait_for(check: object, what: str, proc: asyncio.subprocess.Process, timeout: float) -> None:
    """Poll the async `check()` until it is true; fail naming `what` if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.returncode is None:
        if await check():  # type: ignore[operator]
            return
        await asyncio.sleep(POLL_S)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s (exit {proc.returncode})")


@asynccontextmanager
async def bot_process(args: Sequence[str], env: dict[str, str], log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m bot <args>` with stdin a pipe and its output in `log`; SIGTERM (then SIGKILL) at the end."""
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", *args, env=env, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=out, stderr=out
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def http_ok(http: aiohttp.ClientSession, url: str) -> bool:
    """Whether GET url answers 200 now."""
    with suppress(aiohttp.ClientError):
        async with http.get(url) as r:
            return r.status == 200
    return False


async def measure(
    proc: asyncio.subprocess.Process, ready: object, turn: object, idle_s: float, turns: int, started: float
) -> Figures:
    """Wait until `ready()`, rest, read RSS; run `turn(i)` `turns` times, rest, read RSS again."""
    await wait_for(ready, "ready", proc, READY_TIMEOUT_S)
    ready_s = time.monotonic() - started
    await asyncio.sleep(idle_s)
    idle = rss_mib(proc.pid)
    for i in range(turns):
        await asyncio.wait_for(turn(i), TURN_TIMEOUT_S)  # type: ignore[operator]
    await asyncio.sleep(idle_s)
    return Figures(ready_s, idle, rss_mib(proc.pid))


async def run_terminal(env: dict[str, str], tmp: Path, idle_s: float, turns: int) -> Figures:
    """The terminal chat: ready at its first output; a turn is a line typed and its answer printed."""
    log = tmp / "terminal.log"
    started = time.monotonic()
    async with bot_process([], env, log) as proc:
        assert proc.stdin is not None

        async def ready() -> bool:
            return log.stat().st_size > 0

        async def turn(i: int) -> None:
            assert proc.stdin is not None
            proc.stdin.write(f"u{USER_ID} m{i}\n".encode())
            await proc.stdin.drain()

            async def answered() -> bool:
                return f"answer to u{USER_ID} m{i}" in log.read_text(errors="replace")

            await wait_for(answered, "an answer", proc, TURN_TIMEOUT_S)

        return await measure(proc, ready, turn, idle_s, turns, started)


async def run_telegram(env: dict[str, str], tmp: Path, idle_s: float, turns: int, webhook: bool) -> Figures:
    """Telegram polling or webhook mode against the fake Bot API; a turn is an update pushed and its answer sent."""
    async with FakeTelegram() as tg, aiohttp.ClientSession() as http:
        tg.set_webhook_every = 0.0
        first_update = time.time_ns() // 1_000_000  # above any update the shared database's inbox has seen
        user = first_update % 1_000_000_000  # a new chat: each mode's fake numbers its messages from 1
        extra = {"TELEGRAM_BOT_TOKEN": tg.token, "TELEGRAM_API_BASE_URL": tg.base_url}
        port = free_port()
        if webhook:
            extra |= {"TELEGRAM_WEBHOOK_URL": f"http://127.0.0.1:{port}/telegram", "PORT": str(port)}
            extra["TELEGRAM_WEBHOOK_SECRET"] = "cold-start-secret"
        started = time.monotonic()
        async with bot_process([], {**env, **extra}, tmp / f"webhook-{webhook}.log") as proc:

            async def ready() -> bool:
                if webhook:
                    return await http_ok(http, f"http://127.0.0.1:{port}/readyz")
                return any(method == "getUpdates" for method, _ in tg.calls)

            async def turn(i: int) -> None:
                before = len(tg.sent)
                update = tg.message_update(f"u{USER_ID} m{i}", chat_id=user, user_id=user)
                tg.push_update({**update, "update_id": first_update + i})  # new ids: each mode's fake starts at 1
                await tg.wait_sent(before + 1, TURN_TIMEOUT_S)

            return await measure(proc, ready, turn, idle_s, turns, started)


def api_token(env: dict[str, str]) -> str:
    """A new API token of the terminal user (`bot token`)."""
    out = subprocess.run(
        [sys.executable, "-m", "bot", "token", f"cold-{time.time_ns()}"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.strip().splitlines()[-1].strip()


async def run_serve(env: dict[str, str], tmp: Path, idle_s: float, turns: int) -> Figures:
    """`bot serve` on PORT; a turn is a /v1/chat/completions request with the terminal user's token."""
    port = free_port()
    env = {**env, "PORT": str(port)}
    token = api_token(env)
    started = time.monotonic()
    async with aiohttp.ClientSession() as http, bot_process(["serve"], env, tmp / "serve.log") as proc:
        base = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            return await http_ok(http, f"{base}/readyz")

        async def turn(i: int) -> None:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": f"u{USER_ID} m{i}"}]}
            headers = {"Authorization": f"Bearer {token}"}
            async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r:
                answer = await r.json()
            if f"answer to u{USER_ID} m{i}" not in json.dumps(answer):
                raise RuntimeError(f"serve: unexpected answer {answer}")

        return await measure(proc, ready, turn, idle_s, turns, started)


def sample_files(tmp: Path) -> dict[str, Path]:
    """A one-page PDF, a Word file and a PNG written into `tmp` (made here, so the timed process loads nothing)."""
    import docx
    from PIL import Image

    from tests.test_media_documents import pdf

    paths = {ext: tmp / f"sample.{ext}" for ext in ("pdf", "docx", "png")}
    paths["pdf"].write_bytes(pdf(["a page of text"]))
    document = docx.Document()
    document.add_paragraph("a paragraph")
    document.save(str(paths["docx"]))
    Image.new("RGB", (640, 480), (200, 30, 30)).save(paths["png"], "PNG")
    return paths


def first_use(kind: str, files: dict[str, Path]) -> tuple[float, float]:
    """Seconds of the first file of `kind` (with its module's import) and of the second, in a fresh interpreter."""
    ext, imp, call = FIRST_USE[kind]
    code = FIRST_USE_PROBE.format(imp=imp, call=call)
    out = subprocess.run(
        [sys.executable, "-c", code, str(files[ext])], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    first, second = out.stdout.split()
    return float(first), float(second)


async def run(args: object) -> None:
    """Every figure, printed as it comes."""
    quiet_logging()
    print(f"load before: {load_average()}")
    median, times, modules = import_figures(args.imports)  # type: ignore[attr-defined]
    spread = ", ".join(f"{t:.2f}" for t in times)
    print(f"import bot.__main__: median {median:.2f} s ({spread}), {modules} modules (goal <= {GOAL_IMPORT_S} s)")
    async with bench_database() as db, FakeLLMProcess(echo=True) as llm:
        base = child_env({"DATABASE_URL": db.dsn, "LLM_PROVIDER": "openai", "LLM_BASE_URL": llm.base_url})
        base |= {"LLM_API_KEY": "bench", "LLM_MODEL": "fake-model"}
        if args.no_model:  # type: ignore[attr-defined]
            base |= {"LLM_PROVIDER": "none"}  # commands and /remind only: at rest after start-up, no turns
            args.turns = 0  # type: ignore[attr-defined]
        print(f"{'mode':10} {'ready':>8} {'idle RSS':>10} {f'after {args.turns} turns':>16}")  # type: ignore[attr-defined]
        for mode in args.modes:  # type: ignore[attr-defined]
            with tempfile.TemporaryDirectory(prefix=f"cold-{mode}-") as d:
                env = {**base, "DATA_DIR": d}
                idle, turns = args.idle, args.turns  # type: ignore[attr-defined]
                if mode == "terminal":
                    f = await run_terminal(env, Path(d), idle, turns)
                elif mode == "serve":
                    f = await run_serve(env, Path(d), idle, turns)
                else:
                    f = await run_telegram(env, Path(d), idle, turns, webhook=mode == "webhook")
            goal = f" (goal <= {GOAL_RSS_MIB:.0f})" if mode in ("polling", "serve") else ""
            print(f"{mode:10} {f.ready_s:7.2f}s {f.idle_mib:7.1f} MiB {f.after_turns_mib:12.1f} MiB{goal}")
    with tempfile.TemporaryDirectory(prefix="cold-files-") as d:
        files = sample_files(Path(d))
        for kind in FIRST_USE:
            first, second = first_use(kind, files)
            print(f"first {kind}: {first * 1000:.0f} ms with its module's import, the next {second * 1000:.0f} ms")
    print(f"load after: {load_average()}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the bench."""
    p = parser("cold_start", __doc__)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="which modes to start")
    p.add_argument("--imports", type=int, default=7, help="fresh interpreters timing the import")
    p.add_argument("--idle", type=float, default=3.0, help="seconds at rest before reading RSS")
    p.add_argument("--turns", type=int, default=20, help="turns before the second reading")
    p.add_argument("--no-model", action="store_true", help="LLM_PROVIDER=none: at rest after start-up only")
    asyncio.run(run(parse(p, argv, {"imports": 3, "idle": 1.0, "turns": 5})))


if __name__ == "__main__":
    main()
