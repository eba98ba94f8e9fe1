"""kill -9 of a real Matrix bot process (`python -m bot` on the test database, the fake homeserver and the fake model
of this test, reached by URL on 127.0.0.1), and another `python -m bot` started on the same database after it:

- killed mid-turn (the model holds the answer): the second process answers the message once, syncs on from the kept
  token (nothing replayed, nothing skipped: the next message is answered once too) and stops cleanly;
- killed after the homeserver accepted the answer but before the core recorded it sent: the second process sends it
  again with the same transaction id, which the homeserver answers with the same event: still one answer."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from core.storage.db import Pool
from tests.fake_matrix import BOT, TOKEN, FakeMatrix, Room
from tests.fake_openai import FakeOpenAI
from tests.helpers import WAIT_S
from tests.test_inbox import Hold, echo
from tests.test_matrix import ALICE, answers

REPO_ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.05  # polling interval of the bounded waits on the database


class HoldingMatrix(FakeMatrix):
    """The fake homeserver, able to take one send and never answer it (its client dies waiting)."""

    def __init__(self) -> None:
        """Nothing held."""
        super().__init__()
        self.hold_txn: str | None = None  # the next send whose txnId ends so is stored, and its answer held
        self.accepted = asyncio.Event()  # that send was stored
        self.txn_ids: list[str] = []  # of every send, in order

    async def _send(self, request: web.Request) -> web.Response:
        self.txn_ids.append(request.match_info["txn"])
        response = await super()._send(request)
        if self.hold_txn is not None and request.match_info["txn"].endswith(self.hold_txn):
            assert response.status == 200, response.text
            self.hold_txn = None
            self.accepted.set()
            await asyncio.get_running_loop().create_future()  # until the client's connection closes
        return response


@pytest.fixture
async def mx() -> AsyncIterator[HoldingMatrix]:
    """A fake homeserver with Alice."""
    async with HoldingMatrix() as fake:
        fake.person(ALICE, "Alice")
        yield fake


@dataclass
class Bot:
    """One `python -m bot` process on Matrix."""

    proc: asyncio.subprocess.Process
    log: Path  # its stdout and stderr

    async def wait_for(self, mx: FakeMatrix, predicate: Callable[[], bool], what: str) -> None:
        """Wait until the process made `predicate()` hold on the homeserver (its start included); failing with its
        log."""
        try:
            await mx.wait_for(predicate, WAIT_S * 2, what=what)
        except TimeoutError as e:
            code, log = self.proc.returncode, self.log.read_text()
            raise AssertionError(f"{e}; the bot's exit code {code}, its log: {log}") from None

    async def kill(self) -> None:
        """kill -9, and wait until it is gone (it left no traceback)."""
        self.proc.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(self.proc.wait(), WAIT_S) == -signal.SIGKILL
        assert "Traceback" not in self.log.read_text()

    async def stop(self) -> None:
        """SIGTERM (a rolling deploy): it exits 0, with no traceback and no error logged."""
        self.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(self.proc.wait(), WAIT_S) == 0, self.log.read_text()
        log = self.log.read_text()
        assert "Traceback" not in log and " ERROR " not in log, log


SpawnBot = Callable[[], Awaitable[Bot]]


@pytest.fixture
async def spawn_bot(db_dsn: str, mx: HoldingMatrix, fake_llm: FakeOpenAI, tmp_path: Path) -> AsyncIterator[SpawnBot]:
    """Start `python -m bot` processes on Matrix (killed at the end)."""
    started: list[Bot] = []

    async def spawn() -> Bot:
        n = len(started)
        env = {  # from scratch: nothing of this environment that could point at real services
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "PYTHONPATH": str(REPO_ROOT),
            "DATABASE_URL": db_dsn,
            "DATA_DIR": str(tmp_path / f"bot-{n}"),
            "MATRIX_HOMESERVER": mx.origin,
            "MATRIX_USER_ID": BOT,
            "MATRIX_ACCESS_TOKEN": TOKEN,
            "LLM_BASE_URL": fake_llm.base_url,
            "LLM_API_KEY": "test",
            "LLM_MODEL": "fake-model",
            "ALLOWED_USERS": f"matrix:{ALICE}",
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
        bot = Bot(proc, log)
        started.append(bot)
        return bot

    try:
        yield spawn
    finally:
        for bot in started:
            if bot.proc.returncode is None:
                bot.proc.kill()
            await bot.proc.wait()


async def wait_db(pool: Pool, query: str) -> None:
    """Poll until the query returns true (failing after WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while not await pool.fetchval(query):
        assert time.monotonic() < deadline, f"not within {WAIT_S}s: {query}"
        await asyncio.sleep(POLL_S)


async def in_a_direct_chat(mx: FakeMatrix, bot: Bot) -> Room:
    """Alice opens a direct chat with the new bot process; the room once it joined."""
    room = mx.direct(ALICE)
    await bot.wait_for(mx, lambda: BOT in room.members, "the bot joining")
    return room


async def taken_over(spawn_bot: SpawnBot, mx: FakeMatrix, pool: Pool) -> Bot:
    """The dead process's lease runs out; a second process starts on the same database, syncing on from the token
    the first one kept (from the first /sync on: no event before it again)."""
    assert await pool.fetchval("SELECT lease_until > now() AND done_at IS NULL FROM inbox")  # still the dead one's
    await pool.execute("UPDATE inbox SET lease_until = now()")
    kept = await pool.fetchval("SELECT value FROM platform_state WHERE key LIKE '%:next_batch'")
    syncs = len(mx.syncs)
    second = await spawn_bot()
    await second.wait_for(mx, lambda: len(mx.syncs) > syncs, "its first sync")
    assert kept is not None and mx.syncs[syncs].get("since") == kept
    return second


async def answered_once_and_on(mx: FakeMatrix, room: Room, pool: Pool, second: Bot, first_answer: str) -> None:
    """The message is answered once; the next one Alice says is answered once too; the second process stops."""
    await wait_db(pool, "SELECT done_at IS NOT NULL FROM inbox")
    mx.say(room, ALICE, "still there?")
    await mx.wait_for(lambda: len(answers(mx, room.id)) >= 2, WAIT_S, what="the next answer")
    await wait_db(pool, "SELECT count(*) = 2 AND bool_and(done_at IS NOT NULL) FROM inbox")
    assert answers(mx, room.id) == [first_answer, "re: still there?"]
    assert [e["type"] for e in mx.sent] == ["m.room.message"] * 2
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 2
    assert [r["status"] for r in await pool.fetch("SELECT status FROM turns")] == ["done", "done"]
    await second.stop()


async def test_a_matrix_bot_process_killed_mid_turn_is_answered_once_by_another(
    spawn_bot: SpawnBot, mx: HoldingMatrix, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = hold = Hold()
    first = await spawn_bot()
    room = await in_a_direct_chat(mx, first)
    mx.say(room, ALICE, "are you there?")
    await asyncio.wait_for(hold.asked.wait(), WAIT_S)  # mid-turn: the message stored, the model asked
    await first.kill()
    assert answers(mx, room.id) == []
    second = await taken_over(spawn_bot, mx, pool)
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the second process's answer")
    hold.release.set()  # the first process's model call ends: nobody is there to send its answer
    await answered_once_and_on(mx, room, pool, second, "re: are you there?")
    assert await pool.fetchval("SELECT attempts FROM inbox ORDER BY received_at LIMIT 1") == 2


async def test_a_matrix_answer_the_homeserver_took_before_the_kill_is_not_sent_twice(
    spawn_bot: SpawnBot, mx: HoldingMatrix, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo()
    first = await spawn_bot()
    room = await in_a_direct_chat(mx, first)
    mx.hold_txn = ".answer.0"  # the answer is stored by the homeserver; the process never hears so
    asked = mx.say(room, ALICE, "are you there?")
    await asyncio.wait_for(mx.accepted.wait(), WAIT_S)
    await first.kill()  # before the core recorded the part as sent
    assert answers(mx, room.id) == ["re: are you there?"]
    assert await pool.fetchval("SELECT sent_parts FROM turns") == 0
    second = await taken_over(spawn_bot, mx, pool)
    await answered_once_and_on(mx, room, pool, second, "re: are you there?")
    assert await pool.fetchval("SELECT attempts FROM inbox ORDER BY received_at LIMIT 1") == 2
    assert await pool.fetchval("SELECT sent_parts FROM turns ORDER BY id LIMIT 1") == 1  # the send's answer, now
    assert mx.txn_ids.count(f"{asked}.answer.0") == 2  # sent by both processes: one event
    assert len([r for r in fake_llm.requests if "messages" in r]) == 2  # the stored answer sent again, not asked anew
