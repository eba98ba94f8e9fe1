"""Several processes on one database: capability changes reach every Core within a second; refusal notices once."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import core.storage.listen
from core.capabilities.manager import CHANNEL
from core.front_door import Core
from core.storage.db import Pool, connect_like
from core.storage.listen import ChangeListener
from core.types import Error
from tests.conftest import MakeCore, MakeSettings
from tests.fake_openai import FakeOpenAI
from tests.helpers import incoming, run
from tests.test_capabilities import ADMIN, admin_core, call, write

ROOT = Path(__file__).resolve().parent.parent
SEEN_WITHIN_S = 1.0  # the promise: a change made in one process reaches the others within a second
GREET = "async def greet(params):\n    return 'hello one'\n"
GREET_TWO = "async def greet(params):\n    return 'hello two'\n"


@pytest.fixture
def core_b(
    pool_b: Pool, make_settings: MakeSettings, make_llm: Callable[..., Any], tmp_path: Path
) -> Callable[..., Core]:
    """Builds the second Core: its own pool and its own capabilities directory."""

    def make(**overrides: Any) -> Core:
        settings = make_settings(**overrides)
        return Core(settings, pool_b, make_llm(settings), capabilities_dir=tmp_path / "capabilities_b")

    return make


async def eventually(check: Callable[[], bool], within: float = SEEN_WITHIN_S) -> float:
    """Seconds until `check()` holds (polled every few milliseconds); fails the test after `within`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < within, f"not seen within {within} s"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


def version_of(c: Core, name: str) -> int | None:
    """The version of a capability this Core offers (None: not offered)."""
    loaded = c.capabilities.loaded.get(name)
    offered = name in {t.name for t in c.registry.offered(True)}
    assert (loaded is not None) == offered
    return None if loaded is None else loaded.version


async def listening(c: Core) -> ChangeListener:
    """Wait until the Core's listener is following (LISTEN done, caught up)."""
    await asyncio.wait_for(c.capabilities.listener.listening.wait(), 10)
    return c.capabilities.listener


async def test_a_capability_changed_through_one_core_is_offered_by_another_within_a_second(
    make_core: MakeCore, core_b: Callable[..., Core], fake_llm: FakeOpenAI
) -> None:
    a = admin_core(make_core)
    b = core_b(ADMINS=f"telegram:{ADMIN}", ALLOWED_USERS="*")
    async with a.capabilities.following(), b.capabilities.following():
        await listening(a)
        await listening(b)
        assert (await write(a, fake_llm, "greet", GREET))["ok"]
        await eventually(lambda: version_of(b, "greet") == 1)
        assert (await call(b, fake_llm, "greet"))["result"] == "hello one"  # B runs it (its own materialised copy)
        assert (await write(a, fake_llm, "greet", GREET_TWO))["ok"]
        await eventually(lambda: version_of(b, "greet") == 2)
        assert (await call(b, fake_llm, "greet"))["result"] == "hello two"
        # a change made through B reaches A the same way
        await call(b, fake_llm, "manage_capability", {"action": "rollback", "name": "greet", "version": 1})
        await eventually(lambda: version_of(a, "greet") == 1)
        assert (await call(a, fake_llm, "greet"))["result"] == "hello one"
        await call(a, fake_llm, "manage_capability", {"action": "disable", "name": "greet"})
        await eventually(lambda: version_of(b, "greet") is None)
        gone = await call(b, fake_llm, "greet")
        assert gone["error"]["code"] == "unknown_function"
        await call(a, fake_llm, "manage_capability", {"action": "enable", "name": "greet"})
        await eventually(lambda: version_of(b, "greet") == 1)
        # its own notifications came back to A too, and changed nothing there
        assert version_of(a, "greet") == 1
        assert (await call(a, fake_llm, "greet"))["result"] == "hello one"
    assert not b.capabilities.listener.listening.is_set()


async def test_a_change_made_before_the_listener_started_is_loaded_when_it_starts(
    make_core: MakeCore, core_b: Callable[..., Core], fake_llm: FakeOpenAI
) -> None:
    a = admin_core(make_core)
    b = core_b()
    await b.capabilities.load_all()
    assert (await write(a, fake_llm, "greet", GREET))["ok"]  # after B's load_all, before its LISTEN
    async with b.capabilities.following():
        await listening(b)
        assert version_of(b, "greet") == 1


async def test_a_dropped_listener_connection_reconnects_and_catches_up(
    make_core: MakeCore,
    core_b: Callable[..., Core],
    fake_llm: FakeOpenAI,
    pool: Pool,
    pool_b: Pool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(core.storage.listen, "LISTEN_RETRY_S", 0.01)
    a = admin_core(make_core)
    b = core_b()
    may_connect = asyncio.Event()
    may_connect.set()
    pids: list[int] = []

    async def gated() -> asyncpg.Connection:
        """B's listener connects only while the test lets it (so a change lands while it is away)."""
        await may_connect.wait()
        conn = await connect_like(pool_b)
        pids.append(conn.get_server_pid())
        return conn

    b.capabilities.listener = ChangeListener(CHANNEL, gated, b.capabilities.notified)
    async with b.capabilities.following() as listener:
        await listening(b)
        may_connect.clear()
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", pids[-1])
        await eventually(lambda: not listener.listening.is_set(), within=5)
        assert (await write(a, fake_llm, "greet", GREET))["ok"]  # notified while B listens nowhere
        assert version_of(b, "greet") is None
        may_connect.set()
        await eventually(lambda: version_of(b, "greet") == 1, within=5)  # the catch-up after reconnecting
        assert listener.connections == 2
        # and it follows again
        await call(a, fake_llm, "manage_capability", {"action": "disable", "name": "greet"})
        await eventually(lambda: version_of(b, "greet") is None)
    assert any("capability_changed listener lost its connection" in r.getMessage() for r in caplog.records)


async def test_an_unreachable_database_never_stops_the_listener(
    core_b: Callable[..., Core], monkeypatch: pytest.MonkeyPatch, pool_b: Pool
) -> None:
    monkeypatch.setattr(core.storage.listen, "LISTEN_RETRY_S", 0.01)
    b = core_b()
    attempts: list[int] = []

    async def refused() -> asyncpg.Connection:
        """The first two connects fail as with a database that is down, then it is back."""
        attempts.append(1)
        if len(attempts) <= 2:
            raise ConnectionRefusedError("connection refused")
        return await connect_like(pool_b)

    b.capabilities.listener = ChangeListener(CHANNEL, refused, b.capabilities.notified)
    async with b.capabilities.following():
        await listening(b)
    assert len(attempts) == 3


WATCHER = """
import asyncio, sys
from pathlib import Path
from core.capabilities.manager import CapabilityManager
from core.storage.db import create_pool
from core.timeutil import system_clock
from core.tools.framework import ToolRegistry

async def main() -> None:
    pool = await create_pool(sys.argv[1], min_size=1, max_size=2)
    manager = CapabilityManager(pool, ToolRegistry(), Path(sys.argv[2]), 5.0, system_clock)
    async with manager.following() as listener:
        await listener.listening.wait()
        print("ready", flush=True)
        shown = None
        while shown != "greet 2":
            now = " ".join(f"{c.name} {c.version}" for c in manager.loaded.values()) or "-"
            if now != shown:
                print(now, flush=True)
                shown = now
            await asyncio.sleep(0.005)
    await pool.close()

asyncio.run(main())
"""


async def test_a_second_real_process_sees_the_change(
    make_core: MakeCore, fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path
) -> None:
    a = admin_core(make_core)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WATCHER, db_dsn, str(tmp_path / "watcher"), cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    stdout = proc.stdout
    assert stdout is not None

    async def line() -> str:
        return (await asyncio.wait_for(stdout.readline(), 30)).decode().strip()

    try:
        assert await line() == "ready"
        assert await line() == "-"
        for code, expected in ((GREET, "greet 1"), (GREET_TWO, "greet 2")):
            assert (await write(a, fake_llm, "greet", code))["ok"]
            started = time.monotonic()
            assert await line() == expected
            assert time.monotonic() - started < SEEN_WITHIN_S
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_refused_user_writing_to_two_cores_is_told_once(
    make_core: MakeCore, core_b: Callable[..., Core], pool: Pool
) -> None:
    a = make_core(ADMINS="telegram:1", ALLOWED_USERS="telegram:2")
    b = core_b(ADMINS="telegram:1", ALLOWED_USERS="telegram:2")
    told = [await run(a, incoming("hi", user="666")), await run(b, incoming("hi", user="666"))]
    assert [len(events) for events in told] == [1, 0]
    assert isinstance(told[0][0], Error) and told[0][0].code == "not_allowed"
    assert await b.command(incoming("/tasks", user="666"), "tasks") is None  # a command counts too
    # at the same moment on both: still one notice (the row is claimed atomically)
    both = await asyncio.gather(*(c.refusal(incoming("x", user="777")) for c in (a, b, a, b)))
    assert len([r for r in both if r is not None]) == 1
    # another chat is told on its own; a chat told over an hour ago is told again
    assert await b.refusal(incoming("hi", user="888")) is not None
    await pool.execute(
        "UPDATE refusal_notices SET told_at = told_at - interval '61 minutes' WHERE chat_key LIKE 'telegram:666:%'"
    )
    assert len(await run(b, incoming("hi", user="666"))) == 1
    assert await run(a, incoming("hi", user="666")) == []
