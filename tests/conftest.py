"""Shared fixtures: a real PostgreSQL (embedded), a fresh database per test, the fake LLM, the core."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from core.agent.llm import LLM
from core.front_door import Core
from core.settings import Settings, load_settings
from core.storage.db import Pool, create_pool
from core.storage.embedded import start_embedded
from core.storage.migrations import migrate
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI
from tests.fake_telegram import FakeTelegram

TEMPLATE_DB = "bot_test_template"
_counter = itertools.count()


def with_database(dsn: str, name: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server for the whole session: TEST_DATABASE_URL, or an embedded one."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    # Not under pytest's per-user temp folder: another pytest run by the same user tightens its permissions, and the
    # embedded server (running as another user when we are root) could then no longer reach its own data.
    home = Path(tempfile.mkdtemp(prefix="bot-test-pg-"))
    home.chmod(0o755)
    try:
        server = start_embedded(home, delete_on_stop=True)
        try:
            yield server.uri
        finally:
            server.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def template_dsn(pg_server: str) -> str:
    """A migrated template database that every test database is copied from."""

    async def build() -> None:
        conn = await asyncpg.connect(pg_server)
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
        pool = await create_pool(with_database(pg_server, TEMPLATE_DB), min_size=1, max_size=2)
        try:
            await migrate(pool)
        finally:
            await pool.close()

    asyncio.run(build())
    return with_database(pg_server, TEMPLATE_DB)


class DatabaseStock:
    """Fresh copies of the template, made ahead by a thread of their own while tests run, and dropped there after use.

    Copying a database takes ~0.1-0.3 s of mostly waiting inside PostgreSQL; made two at a time in the background,
    the next test's database is ready when it starts instead of costing every test that wait."""

    AHEAD = 4  # databases kept ready
    MAKERS = 2  # made at the same time

    def __init__(self, server: str) -> None:
        """Start making copies on `server`."""
        self.server = server
        self.ready: queue.Queue[str] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test databases", daemon=True)
        self._thread.start()
        self._room = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()

    async def _start(self) -> asyncio.Semaphore:
        """The makers, each keeping the stock topped up."""
        room = asyncio.Semaphore(self.AHEAD)
        self._makers = [self._loop.create_task(self._make(room)) for _ in range(self.MAKERS)]
        return room

    async def _make(self, room: asyncio.Semaphore) -> None:
        """Make a copy whenever the stock has room."""
        conn = await asyncpg.connect(self.server)
        try:
            while True:
                await room.acquire()
                name = f"bot_test_{os.getpid()}_{next(_counter)}"
                await conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB} STRATEGY FILE_COPY")
                self.ready.put(name)
        finally:
            await conn.close()

    def take(self) -> str:
        """A fresh database's name (waits for one when the stock is empty)."""
        name = self.ready.get(timeout=120)
        self._loop.call_soon_threadsafe(self._room.release)
        return name

    def drop(self, name: str) -> None:
        """Drop a used database in the background."""
        asyncio.run_coroutine_threadsafe(self._drop(name), self._loop)

    async def _drop(self, name: str) -> None:
        """Drop one database (its test's connections are closed by then, or forced)."""
        conn = await asyncpg.connect(self.server)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()

    def close(self) -> None:
        """Stop making copies and drop the ones left, then stop the thread."""

        async def stop() -> None:
            for task in self._makers:
                task.cancel()
            await asyncio.gather(*self._makers, return_exceptions=True)
            while not self.ready.empty():
                await self._drop(self.ready.get_nowait())

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=60)
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


@pytest.fixture
async def pool(db_dsn: str) -> AsyncIterator[Pool]:
    """An asyncpg pool on the test's database."""
    p = await create_pool(db_dsn, min_size=1, max_size=10)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def pool_b(db_dsn: str) -> AsyncIterator[Pool]:
    """A second pool on the test's database, as another process would have."""
    p = await create_pool(db_dsn, min_size=1, max_size=4)
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

    def make(**overrides: Any) -> Core:
        settings = make_settings(**overrides)
        made.append(Core(settings, pool, make_llm(settings), clock=clock))
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
