"""Stopping and restarting: other chats' running answers finish first, within SHUTDOWN_GRACE_SECONDS."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.app import run_platforms
from core.front_door import Core
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import until

ADMIN, MEMBER = 1001, 1002
WAIT_S = 10.0  # a step of the bot (quiet: well under 1 s); room for a machine whose cores are busy
CUT_S = 10.0  # an exit that must not wait for the slow answer (it never ends by itself) nor the 30 s grace


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    """The fake Bot API server."""
    async with FakeTelegram() as fake:
        yield fake


class Model:
    """The fake model: "slow" waits for `release`; "restart" calls restart(mode=full), then says so."""

    def __init__(self) -> None:
        """Nothing asked yet."""
        self.slow_asked = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> Reply:
        """Answer one request."""
        last = body["messages"][-1]
        if last["role"] == "tool":
            return Reply(text="Restarting now.")
        if "slow" in last["content"]:
            self.slow_asked.set()
            await self.release.wait()
            return Reply(text="The slow answer.")
        return Reply(tool_calls=[("restart", {"mode": "full"})])


def texts_to(tg: FakeTelegram, chat: int) -> list[str]:
    """Texts the bot sent to one chat."""
    return [s["text"] for s in tg.sent if s["chat_id"] == chat]


async def start(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore, grace: float
) -> tuple[Core, asyncio.Task[int], Model]:
    """run_platforms with the real Telegram adapter against the fake, and the member's slow answer running."""
    model = Model()
    fake_llm.default = model
    core = make_core(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        ADMINS=f"telegram:{ADMIN}",
        ALLOWED_USERS=f"telegram:{MEMBER}",
        SHUTDOWN_GRACE_SECONDS=grace,
    )
    run = asyncio.create_task(run_platforms(core.settings, core))
    await tg.wait_for(lambda: tg.commands is not None)  # started: the commands are registered
    tg.push_update(tg.message_update("something slow please", chat_id=MEMBER, user_id=MEMBER))
    await asyncio.wait_for(model.slow_asked.wait(), WAIT_S)
    return core, run, model


async def restart(tg: FakeTelegram) -> None:
    """The admin asks for a full restart and is answered."""
    tg.push_update(tg.message_update("restart the bot", chat_id=ADMIN, user_id=ADMIN))
    await tg.wait_for(lambda: any("Restarting now." in t for t in texts_to(tg, ADMIN)))


async def test_full_restart_lets_other_chats_answers_finish(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore
) -> None:
    core, run, model = await start(tg, fake_llm, make_core, grace=30)
    await restart(tg)
    await until(lambda: core.draining)  # the exit was requested: the bot drains instead of stopping
    assert not run.done()
    # a message arriving now is stored, not taken: the next start (or another process) answers it
    tg.push_update(tg.message_update("one more thing", chat_id=ADMIN, user_id=ADMIN))
    waiting = "SELECT count(*) FROM inbox WHERE done_at IS NULL AND owner IS NULL"
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while await core.pool.fetchval(waiting) != 1:
        assert asyncio.get_running_loop().time() < deadline, "the message was not stored"
        await asyncio.sleep(0.01)
    model.release.set()
    assert await asyncio.wait_for(run, WAIT_S) == 42
    assert texts_to(tg, MEMBER) == ["The slow answer."]  # finished and sent before the adapter stopped
    assert len(fake_llm.requests) == 3  # slow, restart, tool result: the waiting message never reached it
    assert await core.pool.fetchval("SELECT payload->'message'->>'text' FROM inbox WHERE done_at IS NULL") == (
        "one more thing"
    )
    assert run.done()


async def test_answer_slower_than_the_grace_does_not_hold_the_exit(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore
) -> None:
    _, run, model = await start(tg, fake_llm, make_core, grace=0.2)
    await restart(tg)
    try:
        assert await asyncio.wait_for(run, CUT_S) == 42  # the grace, then the slow answer is cut
    finally:
        model.release.set()
    assert texts_to(tg, MEMBER) == []


async def test_sigterm_drains_running_answers_too(tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore) -> None:
    core, run, model = await start(tg, fake_llm, make_core, grace=30)
    os.kill(os.getpid(), signal.SIGTERM)  # run_platforms handles it: stop after draining
    await until(lambda: core.draining)
    assert not run.done()
    model.release.set()
    assert await asyncio.wait_for(run, WAIT_S) == 0
    assert texts_to(tg, MEMBER) == ["The slow answer."]


async def test_second_signal_cuts_the_drain_short(tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore) -> None:
    core, run, model = await start(tg, fake_llm, make_core, grace=30)
    os.kill(os.getpid(), signal.SIGTERM)
    await until(lambda: core.draining)
    os.kill(os.getpid(), signal.SIGINT)  # the operator does not want to wait
    try:
        assert await asyncio.wait_for(run, CUT_S) == 0  # not the 30 s grace
    finally:
        model.release.set()
    assert texts_to(tg, MEMBER) == []
