"""kill -9 of a real bot process mid-turn: the Telegram update it held is answered once by another process.

The first worker is `python -m bot` in webhook mode (a real OS process on the test database, the fake Telegram and
the fake model of this test). The process that takes the update over runs in this test process (tests/test_inbox.py's
start_proc) in the first test, and is `python -m bot` too in the second.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from core.storage.db import Pool
from tests.conftest import MakeSettings
from tests.fake_openai import FakeOpenAI
from tests.fake_telegram import FakeTelegram
from tests.test_inbox import Hold, StartProc, start_proc
from tests.test_web import free_port

__all__ = ["start_proc"]  # the fixture, imported for pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 15.0  # the process is ready, the model is asked, the row is done within this (all take ~1 s)
POLL_S = 0.05  # polling interval of the bounded waits


async def wait_ready(proc: asyncio.subprocess.Process, url: str, log: Path) -> None:
    """Poll GET /readyz until 200 (failing with the process's log if it exits or TIMEOUT_S passes)."""
    deadline = time.monotonic() + TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while time.monotonic() < deadline:
            assert proc.returncode is None, f"the bot exited with {proc.returncode}: {log.read_text()}"
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass  # not listening yet
            await asyncio.sleep(POLL_S)
    raise TimeoutError(f"{url} not ready within {TIMEOUT_S}s: {log.read_text()}")


async def wait_db(pool: Pool, query: str) -> None:
    """Poll until the query returns true (failing after TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not await pool.fetchval(query):
        assert time.monotonic() < deadline, f"not within {TIMEOUT_S}s: {query}"
        await asyncio.sleep(POLL_S)


@dataclass
class Bot:
    """One `python -m bot` process in webhook mode."""

    proc: asyncio.subprocess.Process
    url: str  # its webhook
    log: Path  # its stdout and stderr

    async def kill(self) -> None:
        """kill -9, and wait until it is gone."""
        self.proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(self.proc.wait(), TIMEOUT_S) == -signal.SIGKILL

    async def stop(self) -> str:
        """SIGTERM (a rolling deploy), wait for exit 0 and return its log."""
        self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), TIMEOUT_S)
        assert code == 0, self.log.read_text()
        return self.log.read_text()


SpawnBot = Callable[[], Awaitable[Bot]]


@pytest.fixture
async def spawn_bot(db_dsn: str, tg: FakeTelegram, fake_llm: FakeOpenAI, tmp_path: Path) -> AsyncIterator[SpawnBot]:
    """Start `python -m bot` processes in Telegram webhook mode, each ready (/readyz 200); killed at the end."""
    tg.set_webhook_every = 0  # every process sets the webhook
    started: list[Bot] = []

    async def spawn() -> Bot:
        n = len(started)
        port = free_port()
        url = f"http://127.0.0.1:{port}/telegram"
        env = {  # from scratch: nothing of this environment that could point at real services
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "PYTHONPATH": str(REPO_ROOT),
            "DATABASE_URL": db_dsn,
            "DATA_DIR": str(tmp_path / f"bot-{n}"),
            "TELEGRAM_BOT_TOKEN": tg.token,
            "TELEGRAM_API_BASE_URL": tg.base_url,
            "TELEGRAM_WEBHOOK_URL": url,
            "PORT": str(port),
            "LLM_BASE_URL": fake_llm.base_url,
            "LLM_API_KEY": "test",
            "LLM_MODEL": "fake-model",
            "ALLOWED_USERS": "*",
        }
        log = tmp_path / f"bot-{n}.log"
        with log.open("wb") as out:
            # cwd: an empty directory, so that no developer's .env in the repo root is read
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bot",
                cwd=tmp_path,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        bot = Bot(proc, url, log)
        started.append(bot)
        await wait_ready(proc, f"http://127.0.0.1:{port}/readyz", log)
        return bot

    try:
        yield spawn
    finally:
        for bot in started:
            if bot.proc.returncode is None:
                bot.proc.kill()
            await bot.proc.wait()


async def caught_mid_turn(spawn_bot: SpawnBot, make_settings: MakeSettings, tg: FakeTelegram, hold: Hold) -> Bot:
    """A bot process whose turn on "are you there?" waits for the model (the Hold)."""
    bot = await spawn_bot()
    secret = make_settings(TELEGRAM_BOT_TOKEN=tg.token).webhook_secret
    assert await tg.post_webhook(tg.message_update("are you there?"), secret=secret, url=bot.url) == 200  # stored
    await asyncio.wait_for(hold.asked.wait(), TIMEOUT_S)
    return bot


async def answered_once(pool: Pool, tg: FakeTelegram, hold: Hold) -> None:
    """After the kill: one answer, from the second process, and the update done after two attempts."""
    [sent] = await tg.wait_sent(1, timeout=TIMEOUT_S)
    assert sent["text"] == "re: are you there?"
    hold.release.set()  # the dead worker's model call ends: nobody is there to send its answer
    await wait_db(pool, "SELECT done_at IS NOT NULL FROM inbox")
    with pytest.raises(TimeoutError):
        await tg.wait_sent(2, timeout=0.5)  # room for a wrong second answer
    assert [s["text"] for s in tg.sent] == ["re: are you there?"]
    assert await pool.fetchval("SELECT attempts FROM inbox") == 2
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 1
    assert [r["status"] for r in await pool.fetch("SELECT status FROM turns")] == ["done"]


async def test_a_bot_process_killed_mid_turn_is_answered_once_by_another(
    spawn_bot: SpawnBot,
    start_proc: StartProc,
    make_settings: MakeSettings,
    tg: FakeTelegram,
    fake_llm: FakeOpenAI,
    pool: Pool,
) -> None:
    fake_llm.default = hold = Hold()
    first = await caught_mid_turn(spawn_bot, make_settings, tg, hold)
    await first.kill()
    assert "Traceback" not in first.log.read_text()
    assert tg.sent == []
    assert await pool.fetchval("SELECT lease_until > now() AND done_at IS NULL FROM inbox")  # still the dead one's
    await pool.execute("UPDATE inbox SET lease_until = now()")  # the dead worker's lease runs out
    await start_proc(lease_s=0.5)  # another process (here, in this test process) takes it
    await answered_once(pool, tg, hold)


async def test_a_second_bot_process_answers_for_a_killed_one_and_stops_cleanly(
    spawn_bot: SpawnBot, make_settings: MakeSettings, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = hold = Hold()
    first = await caught_mid_turn(spawn_bot, make_settings, tg, hold)
    await first.kill()
    await pool.execute("UPDATE inbox SET lease_until = now()")  # the dead worker's lease runs out
    second = await spawn_bot()  # a real process again, as in a deploy: it starts and takes the update
    await answered_once(pool, tg, hold)
    log = await second.stop()  # SIGTERM: it drains and exits 0
    assert "Traceback" not in log and " ERROR " not in log, log
