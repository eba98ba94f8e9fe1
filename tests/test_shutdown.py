"""Stopping and restarting: other chats' running answers finish first, within SHUTDOWN_GRACE_SECONDS."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.app import run_platforms
from core.service import Core
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram

ADMIN, MEMBER = 1001, 1002


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    """The fake Bot API server."""
    async with FakeTelegram() as fake:
        yield fake


def model(release: asyncio.Event) -> Any:
    """The fake model: "slow" waits for `release`; "restart" calls restart(mode=full), then says so."""

    async def respond(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return Reply(text="Restarting now.")
        if "slow" in last["content"]:
            await release.wait()
            return Reply(text="The slow answer.")
        return Reply(tool_calls=[("restart", {"mode": "full"})])

    return respond


def texts_to(tg: FakeTelegram, chat: int) -> list[str]:
    """Texts the bot sent to one chat."""
    return [s["text"] for s in tg.sent if s["chat_id"] == chat]


async def start(tg: FakeTelegram, make_core: MakeCore, grace: float) -> tuple[Core, asyncio.Task[int]]:
    """run_platforms with the real Telegram adapter against the fake; member's slow answer already running."""
    core = make_core(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        ADMINS=f"telegram:{ADMIN}",
        ALLOWED_USERS=f"telegram:{MEMBER}",
        SHUTDOWN_GRACE_SECONDS=grace,
    )
    run = asyncio.create_task(run_platforms(core.settings, core))
    await tg.wait_for(lambda: tg.commands is not None)  # started: the commands are registered
    return core, run


async def restart_while_member_waits(tg: FakeTelegram, fake_llm: FakeOpenAI) -> None:
    """Member asks something slow; once the model has it, the admin asks for a full restart."""
    tg.push_update(tg.message_update("something slow please", chat_id=MEMBER, user_id=MEMBER))
    await tg.wait_for(lambda: len(fake_llm.requests) == 1)
    tg.push_update(tg.message_update("restart the bot", chat_id=ADMIN, user_id=ADMIN))
    await tg.wait_for(lambda: any("Restarting now." in t for t in texts_to(tg, ADMIN)))


async def test_full_restart_lets_other_chats_answers_finish(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore
) -> None:
    release = asyncio.Event()
    fake_llm.default = model(release)
    core, run = await start(tg, make_core, grace=30)
    await restart_while_member_waits(tg, fake_llm)
    await asyncio.sleep(0.05)  # a tiny wait: the exit was requested, the bot must still be draining
    assert not run.done() and core.draining
    tg.push_update(tg.message_update("one more thing", chat_id=ADMIN, user_id=ADMIN))  # new turns are turned away
    await tg.wait_for(lambda: any("restarting" in t for t in texts_to(tg, ADMIN)))
    release.set()
    assert await asyncio.wait_for(run, 10) == 42
    assert texts_to(tg, MEMBER) == ["The slow answer."]  # finished and sent before the adapter stopped
    assert len(fake_llm.requests) == 3  # slow, restart, tool result: the turned-away message never reached it


async def test_answer_slower_than_the_grace_does_not_hold_the_exit(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore
) -> None:
    release = asyncio.Event()
    fake_llm.default = model(release)
    _, run = await start(tg, make_core, grace=0.2)
    await restart_while_member_waits(tg, fake_llm)
    try:
        assert await asyncio.wait_for(run, 5) == 42  # the grace, then the slow answer is cut
    finally:
        release.set()
    assert texts_to(tg, MEMBER) == []
