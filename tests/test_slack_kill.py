"""kill -9 of a real Slack bot process mid-turn (`python -m bot` in Socket Mode, on the test database, the fake Slack
and the fake model of this test): the message it had stored and acked is answered once by another process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from core.storage.db import Pool
from tests.fake_openai import FakeOpenAI
from tests.fake_slack import FakeSlack
from tests.helpers import WAIT_S
from tests.test_inbox import Hold
from tests.test_slack import ALICE, StartProc, sl, start_proc

__all__ = ["sl", "start_proc"]  # the fixtures, imported for pytest

ROOT = Path(__file__).resolve().parent.parent


async def wait_db(pool: Pool, query: str) -> None:
    """Poll until the query returns true, within WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not await pool.fetchval(query):
        assert time.monotonic() < deadline, f"not within {WAIT_S}s: {query}"
        await asyncio.sleep(0.05)


async def test_a_slack_bot_process_killed_mid_turn_is_answered_once_by_another(
    sl: FakeSlack, start_proc: StartProc, fake_llm: FakeOpenAI, pool: Pool, db_dsn: str, tmp_path: Path
) -> None:
    fake_llm.default = hold = Hold()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_", "SLACK_"))}
    env = base | {
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_dsn,
        "DATA_DIR": str(tmp_path / "data"),
        "ALLOWED_USERS": "*",
        "LLM_BASE_URL": fake_llm.base_url,
        "LLM_API_KEY": "test",
        "LLM_MODEL": "fake-model",
        "SLACK_BOT_TOKEN": sl.token,
        "SLACK_APP_TOKEN": sl.app_token,
        "SLACK_API_BASE_URL": sl.api_base,
    }
    log = tmp_path / "bot.log"
    with log.open("wb") as out:
        bot = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", env=env, cwd=str(tmp_path), stdout=out, stderr=out
        )
    try:
        await sl.wait_for(lambda: bool(sl.sockets), WAIT_S * 3, what=f"the bot's socket; {log.read_text()}")
        envelope = await sl.push("events_api", sl.post(ALICE, "are you there?", channel=sl.dm_of(ALICE)))
        await asyncio.wait_for(hold.asked.wait(), WAIT_S)  # mid-turn: the model was asked
        assert envelope in sl.acks  # stored, then acked
    finally:
        if bot.returncode is None:
            bot.send_signal(signal.SIGKILL)
        await bot.wait()
    assert bot.returncode == -signal.SIGKILL and "Traceback" not in log.read_text()
    assert sl.sent == []
    await pool.execute("UPDATE inbox SET lease_until = now()")  # the dead process's lease runs out
    await start_proc(lease_s=0.5)  # another process (here, in this test process) takes it
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer of the second process")
    hold.release.set()
    await wait_db(pool, "SELECT done_at IS NOT NULL FROM inbox")
    assert [m["text"] for m in sl.sent] == ["re: are you there?"]
    assert await pool.fetchval("SELECT attempts FROM inbox") == 2
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 1
