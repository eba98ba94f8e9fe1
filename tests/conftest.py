"""Shared fixtures: a real PostgreSQL (embedded), a fresh database per test, the fake LLM, the core; and the run's
guards: every test under a timeout that fails with one line, its temporary folders where another test run cannot take
them away, and no PostgreSQL of this run left running at its end."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from core.agent.llm import LLM
from core.front_door import Core
from core.inbox import DEFAULT_PACE, Pace
from core.settings import Settings, StartupError, load_settings
from core.storage.db import Pool, create_pool
from core.storage.embedded import start_embedded
from core.storage.migrations import migrate
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI
from tests.fake_telegram import FakeTelegram

TEMPLATE_DB = "bot_test_template"
_counter = itertools.count()
ROOT = Path(__file__).resolve().parent.parent
CONNECT_TIMEOUT_S = 30.0  # a connection of the fixtures to the test server (asyncpg's own default is 60 s)
COMMAND_TIMEOUT_S = 60.0  # one statement of the fixtures (CREATE DATABASE on a loaded machine takes ~1 s)
TAKE_TIMEOUT_S = 60.0  # a test's fresh database (ready ahead, ~0.3 s to make): below the run's per-test timeout
AFTER_TIMEOUT_S = 20.0  # a test's teardown stuck after its timeout is interrupted again every this many seconds
STOP_WAIT_S = 10.0  # a PostgreSQL server left running: fast shutdown (SIGINT), then SIGKILL after this long

# Folders this run made (its servers' data, its tests' temporary files); checked and removed when the run ends.
_FOLDERS: list[Path] = []


def own_folder(prefix: str) -> Path:
    """A new folder in the system's temporary directory, kept apart from other test runs and removed at the end.

    Not under pytest's per-user folder (/tmp/pytest-of-USER): every pytest run tightens its permissions to 0700, and an
    embedded server (running as another user when we are root) would then lose its own data mid-run."""
    folder = Path(tempfile.mkdtemp(prefix=prefix)).resolve()
    folder.chmod(0o755)
    _FOLDERS.append(folder)
    return folder


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Give this run's tmp_path folders a base of their own (unless --basetemp chose one)."""
    if config.option.basetemp is None:
        base = own_folder("bot-test-tmp-")
        config.option.basetemp = str(base / "run")
        config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))  # runs without a session too (--help)


def postgres_servers(under: Path) -> list[int]:
    """Pids of the PostgreSQL servers (postmasters) whose data directory is in `under`, zombies left out."""
    pids: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and args[0].endswith(b"postgres") and "-D" in (a.decode(errors="replace") for a in args):
            data = args[args.index(b"-D") + 1].decode(errors="replace")
            if Path(data) == under or Path(data).is_relative_to(under):
                pids.append(int(proc.name))
    return pids


def stop_postgres(pids: list[int]) -> list[int]:
    """Stop servers: fast shutdown, then SIGKILL for those still there after STOP_WAIT_S; the pids that survive."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_WAIT_S
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = [p for p in pids if _alive(p)]
    return pids


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_LEFT_BEHIND = pytest.StashKey[list[str]]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No PostgreSQL of this run may outlive it, nor its folders: stop and remove them, and fail the run loudly."""
    problems: list[str] = []
    for folder in _FOLDERS:
        left = postgres_servers(folder)
        if left:
            survivors = stop_postgres(left)
            problems.append(
                f"PostgreSQL left running on {folder} (pids {left}; "
                + (f"{survivors} could not be stopped)" if survivors else "stopped now)")
            )
        shutil.rmtree(folder, ignore_errors=True)
        if folder.exists():
            problems.append(f"{folder} could not be removed")
    _FOLDERS.clear()
    if problems:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        session.config.stash[_LEFT_BEHIND] = problems


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say what the run left behind (found by pytest_sessionfinish, which makes the run fail)."""
    problems = config.stash.get(_LEFT_BEHIND, [])
    if problems:
        terminalreporter.section("left behind by this run", sep="!", red=True, bold=True)
        for problem in problems:
            terminalreporter.line(f"FAILED: {problem}", red=True, bold=True)


def _waiting_at(frame: FrameType | None) -> str:
    """Where a timed-out test waits: the innermost line of the project's code in the main thread and in each task."""

    def ours(f: FrameType) -> bool:
        name = f.f_code.co_filename
        return name.startswith(str(ROOT)) and "/.venv/" not in name

    def spot(frames: list[FrameType]) -> str | None:
        mine = [f for f in frames if ours(f)]
        if not mine:
            return None
        f = mine[-1]
        return f"{Path(f.f_code.co_filename).relative_to(ROOT)}:{f.f_lineno} ({f.f_code.co_name})"

    stack: list[FrameType] = []
    while frame is not None:
        stack.insert(0, frame)
        frame = frame.f_back
    spots = [spot(stack)]
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        tasks = set()
    for task in tasks:
        chain: list[FrameType] = []
        coro: Any = task.get_coro()
        while coro is not None and getattr(coro, "cr_frame", None) is not None:
            chain.append(coro.cr_frame)
            coro = coro.cr_await
        spots.append(spot(chain))
    found = sorted({s for s in spots if s}, key=lambda s: not s.startswith("tests/test_"))
    return f"; waiting at {', '.join(found[:4])}" if found else ""


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's signal timer, failing with one line that says where the test waits.

    Unlike pytest-timeout's own, it keeps running after a failure (pytest-timeout stops it at the first exception, for
    --pdb's sake), and fires again every AFTER_TIMEOUT_S while the test's teardown is stuck: no fixture waits for ever,
    after a failure or a timeout either."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own
    from pytest_timeout import is_debugging  # type: ignore[import-untyped]

    fired = 0

    def fire(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not settings.disable_debugger_detection and is_debugging():
            return
        fired += 1
        signal.setitimer(signal.ITIMER_REAL, AFTER_TIMEOUT_S)
        after = "" if fired == 1 else f", and still not done {(fired - 1) * AFTER_TIMEOUT_S:g} s later"
        pytest.fail(f"Timeout: over {settings.timeout:g} s (pytest-timeout){after}{_waiting_at(frame)}", pytrace=False)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def cancel_for_pdb() -> None:
        if item.config.getoption("usepdb"):
            cancel()

    item.stash[_CANCEL_TIMER] = cancel
    setattr(item, "cancel_timeout", cancel_for_pdb)  # noqa: B010 - what pytest-timeout calls (untyped attribute)
    signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


_CANCEL_TIMER = pytest.StashKey[Callable[[], None]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Stop the test's timer once it is done (setup, call and teardown)."""
    try:
        return (yield)
    finally:
        if (cancel := item.stash.get(_CANCEL_TIMER, None)) is not None:
            cancel()


def fail_in_one_line(message: str) -> NoReturn:
    """Fail the test (or fixture) with `message` alone: no traceback, no exception it was handling."""
    raise pytest.fail.Exception(message, pytrace=False) from None


def with_database(dsn: str, name: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server for the whole session: TEST_DATABASE_URL, or an embedded one (stopped at the end, or the
    run fails: see pytest_sessionfinish)."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    home = own_folder("bot-test-pg-")
    try:
        server = start_embedded(home, delete_on_stop=True)
    except StartupError as e:
        fail_in_one_line(str(e))
    try:
        yield server.uri
    finally:
        try:
            server.stop()
        except Exception:  # the library failing to stop a server that died on its own: the tests said so already
            pass
        left = postgres_servers(home)
        assert not left, f"the test server on {home} still runs after its stop (pids {left})"


def server_log_end(server: str) -> str:
    """The last line of our embedded server's log, for a failure message (nothing for another server)."""
    socket_dir = Path(dict(p.split("=", 1) for p in urlsplit(server).query.split("&") if "=" in p).get("host", "/-"))
    log = socket_dir / "log"  # the embedded server's socket is in its data directory, next to its log
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f"; its log ({log}) ends: {lines[-1]!r}" if lines else ""


async def connect_server(server: str) -> asyncpg.Connection:
    """A connection of the fixtures, or the test fails with one line."""
    try:
        return await asyncpg.connect(server, timeout=CONNECT_TIMEOUT_S, command_timeout=COMMAND_TIMEOUT_S)
    except (OSError, TimeoutError, asyncpg.PostgresError) as e:
        fail_in_one_line(f"test database server: cannot connect ({type(e).__name__}: {e}){server_log_end(server)}")


@pytest.fixture(scope="session")
def template_dsn(pg_server: str) -> str:
    """A migrated template database that every test database is copied from."""

    async def build() -> None:
        conn = await connect_server(pg_server)
        try:
            if not os.environ.get("TEST_DATABASE_URL"):  # our throwaway server: durability is not needed
                await conn.execute("ALTER SYSTEM SET fsync = off")
                await conn.execute("ALTER SYSTEM SET synchronous_commit = off")
                await conn.execute("ALTER SYSTEM SET full_page_writes = off")
                await conn.execute("SELECT pg_reload_conf()")
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
            await conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
        finally:
            await conn.close()
        pool = await asyncio.wait_for(
            create_pool(with_database(pg_server, TEMPLATE_DB), min_size=1, max_size=2), CONNECT_TIMEOUT_S
        )
        try:
            await migrate(pool)
        finally:
            await pool.close()

    asyncio.run(build())
    return with_database(pg_server, TEMPLATE_DB)


class DatabaseStock:
    """Fresh copies of the template, made ahead by a thread of their own while tests run, and dropped there after use.

    Copying a database takes ~0.1-0.3 s of mostly waiting inside PostgreSQL; made two at a time in the background,
    the next test's database is ready when it starts instead of costing every test that wait. Once a copy fails (the
    server died, say) every later test fails at once with that reason instead of waiting."""

    AHEAD = 4  # databases kept ready
    MAKERS = 2  # made at the same time

    def __init__(self, server: str) -> None:
        """Start making copies on `server`."""
        self.server = server
        self.ready: queue.Queue[str | None] = queue.Queue()  # None: the makers failed, see self.failure
        self.failure = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test databases", daemon=True)
        self._thread.start()
        self._room = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    async def _start(self) -> asyncio.Semaphore:
        """The makers, each keeping the stock topped up."""
        room = asyncio.Semaphore(self.AHEAD)
        self._makers = [self._loop.create_task(self._make(room)) for _ in range(self.MAKERS)]
        return room

    async def _make(self, room: asyncio.Semaphore) -> None:
        """Make a copy whenever the stock has room; on a failure, say why to every later test."""
        try:
            conn = await asyncpg.connect(self.server, timeout=CONNECT_TIMEOUT_S, command_timeout=COMMAND_TIMEOUT_S)
            try:
                while True:
                    await room.acquire()
                    name = f"bot_test_{os.getpid()}_{next(_counter)}"
                    await conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB} STRATEGY FILE_COPY")
                    self.ready.put(name)
            finally:
                await conn.close(timeout=5)
        except Exception as e:  # whatever it is, the tests must hear of it instead of waiting
            self.failure = self.failure or f"{type(e).__name__}: {e}".splitlines()[0]
            self.ready.put(None)

    def take(self) -> str:
        """A fresh database's name (waits for one when the stock is empty); the test fails when there is none."""
        try:
            name = self.ready.get(timeout=TAKE_TIMEOUT_S)
        except queue.Empty:
            fail_in_one_line(f"no fresh test database within {TAKE_TIMEOUT_S:g} s{server_log_end(self.server)}")
        if name is None:
            self.ready.put(None)  # for the next test too
            fail_in_one_line(
                f"no fresh test database: copying the template failed ({self.failure}){server_log_end(self.server)}"
            )
        self._loop.call_soon_threadsafe(self._room.release)
        return name

    def drop(self, name: str) -> None:
        """Drop a used database in the background."""
        asyncio.run_coroutine_threadsafe(self._drop(name), self._loop)

    async def _drop(self, name: str) -> None:
        """Drop one database (its test's connections are closed by then, or forced)."""
        conn = await asyncpg.connect(self.server, timeout=CONNECT_TIMEOUT_S, command_timeout=COMMAND_TIMEOUT_S)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close(timeout=5)

    def close(self) -> None:
        """Stop making copies and drop the ones left, then stop the thread (within a minute, or it says so)."""

        async def stop() -> None:
            for task in self._makers:
                task.cancel()
            await asyncio.gather(*self._makers, return_exceptions=True)
            while not self.ready.empty():
                name = self.ready.get_nowait()
                if name is not None:
                    await self._drop(name)

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=COMMAND_TIMEOUT_S)
        except Exception as e:
            if not self.failure:  # the server is gone: nothing to drop, and it said so already
                fail_in_one_line(f"test databases: the stock did not close ({type(e).__name__}: {e})")
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


@pytest.fixture(scope="session")
def database_stock(pg_server: str, template_dsn: str) -> Iterator[DatabaseStock]:
    """The session's stock of fresh databases."""
    stock = DatabaseStock(pg_server)
    try:
        yield stock
    finally:
        stock.close()


@pytest.fixture
async def db_dsn(pg_server: str, database_stock: DatabaseStock) -> AsyncIterator[str]:
    """A fresh, migrated database for one test (dropped afterwards)."""
    name = await asyncio.to_thread(database_stock.take)
    yield with_database(pg_server, name)
    database_stock.drop(name)


async def open_pool(dsn: str, *, min_size: int, max_size: int) -> Pool:
    """A pool on a test database, or the test fails with one line."""
    try:
        return await asyncio.wait_for(create_pool(dsn, min_size=min_size, max_size=max_size), CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, asyncpg.PostgresError) as e:
        fail_in_one_line(f"test database: no pool ({type(e).__name__}: {e}){server_log_end(dsn)}")


@pytest.fixture
async def pool(db_dsn: str) -> AsyncIterator[Pool]:
    """An asyncpg pool on the test's database."""
    p = await open_pool(db_dsn, min_size=1, max_size=10)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def pool_b(db_dsn: str) -> AsyncIterator[Pool]:
    """A second pool on the test's database, as another process would have."""
    p = await open_pool(db_dsn, min_size=1, max_size=4)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeOpenAI]:
    """The fake OpenAI-compatible server, started for one test."""
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    """The fake Telegram Bot API server, started for one test."""
    async with FakeTelegram() as fake:
        yield fake


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    """The fake Discord (REST + gateway), started for one test."""
    async with FakeDiscord() as fake:
        yield fake


class FakeClock:
    """A settable clock for tests."""

    def __init__(self, now: datetime) -> None:
        """Start at `now`."""
        self.now = now

    def __call__(self) -> datetime:
        """The current fake time."""
        return self.now

    def advance(self, **kw: float) -> None:
        """Move time forward."""
        self.now += timedelta(**kw)


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at Sat 2026-11-21 10:00 UTC."""
    return FakeClock(datetime(2026, 11, 21, 10, 0, tzinfo=UTC))


MakeSettings = Callable[..., Settings]


@pytest.fixture
def make_settings(fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MakeSettings:
    """Settings pointed at the fake LLM; keyword overrides use the variable names."""
    monkeypatch.chdir(tmp_path)  # no stray .env from the developer's tree
    for name in Settings.model_fields:
        monkeypatch.delenv(name, raising=False)

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "LLM_BASE_URL": fake_llm.base_url,
            "LLM_API_KEY": "test",
            "LLM_MODEL": "fake-model",
            "DATA_DIR": str(tmp_path / "data"),
            "ALLOWED_USERS": "*",
        }
        values.update(overrides)
        return load_settings(**values)

    return make


MakeCore = Callable[..., Core]


@pytest.fixture
async def make_llm(make_settings: MakeSettings) -> AsyncIterator[Callable[[Settings], LLM]]:
    """LLM clients for the test (closed afterwards); one SDK retry keeps failure tests quick."""
    made: list[LLM] = []

    def make(settings: Settings, max_retries: int = 1) -> LLM:
        llm = LLM.from_settings(settings, max_retries=max_retries)
        made.append(llm)
        return llm

    yield make
    for llm in made:
        await llm.aclose()


@pytest.fixture
async def make_core(
    pool: Pool, make_settings: MakeSettings, clock: FakeClock, make_llm: Callable[..., LLM]
) -> AsyncIterator[MakeCore]:
    """A Core on the test database and the fake LLM; drained at the end (its inbox stops), as bot/ does."""
    made: list[Core] = []

    def make(inbox_pace: Pace = DEFAULT_PACE, **overrides: Any) -> Core:
        settings = make_settings(**overrides)
        made.append(Core(settings, pool, make_llm(settings), clock=clock, inbox_pace=inbox_pace))
        return made[-1]

    yield make
    for core in made:
        await core.drain(0)
        await core.close()


@pytest.fixture
def allowed_errors() -> list[str]:
    """Substrings of ERROR logs a test expects (append to it)."""
    return []


@pytest.fixture(autouse=True)
def fail_on_logged_errors(caplog: pytest.LogCaptureFixture, allowed_errors: list[str]) -> Iterator[None]:
    """Libraries only log handler exceptions: an ERROR log fails the test unless it expects it."""
    caplog.set_level(logging.WARNING)
    yield
    # asyncpg closes a connection that a fault test dropped in a task nobody awaits; it may be collected during a later
    # test. The bot logs it as one warning (bot/app.py quiet_dropped_connections, tested in tests/test_faults.py).
    allowed = [*allowed_errors, "coro=<Connection.close() done"]
    # caplog.records here holds only this teardown's records: the test's own phases are asked for by name
    seen = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    bad = [r for r in seen if r.levelno >= logging.ERROR and not any(a in r.getMessage() for a in allowed)]
    assert not bad, f"unexpected error logs: {[r.getMessage() for r in bad]}"


@pytest.fixture
def capabilities_dir(tmp_path: Path) -> Path:
    """Where cores built by make_core materialise capabilities: under their temporary DATA_DIR."""
    from core.capabilities.manager import materialised_dir

    return materialised_dir(tmp_path / "data")
