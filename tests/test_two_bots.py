"""Two Telegram bots (two tokens) on one database, one after the other and side by side: update ids and the message
ids of a private chat count per bot, so each bot's updates and messages are keyed by its own id; and a database used
by one bot before they were keeps working for it. Discord's messages are keyed by the bot that received them too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.discord.adapter import DiscordAdapter
from adapters.discord.incoming import StoredMessage
from adapters.telegram import TelegramAdapter
from bot.web import WebServer
from core import Incoming
from core.front_door import Core
from core.storage import inbox_table
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import answer, incoming, run
from tests.test_web import free_port

OTHER_TOKEN = "456:AAHother-Token_for-the-tests-0123456789"  # a second bot (id 456); the `tg` fixture's is 123
USER = 1001  # the person, in a private chat with each bot (its chat id is their user id, for both bots)


@dataclass
class Running:
    """One process running one bot: its core, its adapter, and its webhook URL (None: long polling)."""

    core: Core
    adapter: TelegramAdapter
    url: str | None = None

    async def post(self, tg: FakeTelegram, update: dict[str, Any]) -> int:
        """POST an update to this process's webhook as Telegram does (also again: a redelivery)."""
        assert self.url is not None
        return await tg.post_webhook(update, secret=self.core.settings.webhook_secret, url=self.url)

    async def stop(self) -> None:
        """Stop as bot/ does: drain the core, then the adapter."""
        await self.core.drain(1.0)
        await self.adapter.stop()


Start = Callable[..., Awaitable[Running]]


def echo(body: dict[str, Any]) -> Reply:
    """A model that answers "re: <the last user message>"."""
    return Reply(text=f"re: {[m for m in body['messages'] if m['role'] == 'user'][-1]['content']}")


@pytest.fixture
async def tg_b() -> AsyncIterator[FakeTelegram]:
    """A second bot's fake Bot API server: its update ids and a chat's message ids start at 1 like the first's."""
    async with FakeTelegram(OTHER_TOKEN, bot_id=456, bot_username="other_bot") as fake:
        yield fake


@pytest.fixture
async def start(make_core: MakeCore, fake_llm: FakeOpenAI) -> AsyncIterator[Start]:
    """Start a process running the bot of a fake (by long polling, or by webhook); stopped at the end."""
    fake_llm.default = echo
    async with AsyncExitStack() as stack:

        async def start_bot(tg: FakeTelegram, *, base_url: str | None = None, webhook: bool = False) -> Running:
            port = free_port()
            url = f"http://127.0.0.1:{port}/telegram" if webhook else None
            core = make_core(
                TELEGRAM_BOT_TOKEN=tg.token,
                TELEGRAM_API_BASE_URL=base_url or tg.base_url,
                TELEGRAM_WEBHOOK_URL=url,
                ALLOWED_USERS="*",
            )
            adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
            if url is not None:
                web = WebServer(core, ["telegram"], port, host="127.0.0.1")
                web.add_webhook("/telegram", adapter.on_webhook)
                await web.start()
                stack.push_async_callback(web.stop)
            await adapter.start()
            stack.push_async_callback(adapter.stop)
            return Running(core, adapter, url)

        yield start_bot


async def say(tg: FakeTelegram, text: str) -> dict[str, Any]:
    """The person writes to the bot of `tg` in their private chat; returns the update once the bot answered it."""
    before = len(tg.sent)
    update = tg.message_update(text, chat_id=USER, user_id=USER)
    tg.push_update(update)
    await tg.wait_sent(before + 1)
    return update


def texts(tg: FakeTelegram) -> list[str]:
    """What the bot of `tg` sent, in order."""
    return [s["text"] for s in tg.sent]


async def message_keys(pool: Pool) -> list[str]:
    """The platform message ids of the stored turns, in order."""
    return [r[0] for r in await pool.fetch("SELECT platform_message_id FROM turns ORDER BY id")]


async def test_a_new_token_on_a_used_database_answers_its_first_messages(
    start: Start, tg: FakeTelegram, tg_b: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    a = await start(tg)  # TELEGRAM_API_BASE_URL as PTB writes it: http://127.0.0.1:PORT/bot
    first = [await say(tg, "a1"), await say(tg, "a2")]
    await a.stop()
    await start(tg_b, base_url=tg_b.origin)  # …and as a local Bot API server's docs give it: http://127.0.0.1:PORT
    second = [await say(tg_b, "b1"), await say(tg_b, "b2")]
    assert [u["update_id"] for u in second] == [u["update_id"] for u in first]  # update ids count per bot…
    ids = [u["message"]["message_id"] for u in first]
    assert [u["message"]["message_id"] for u in second] == ids  # …and so do a private chat's message ids
    assert texts(tg) == ["re: a1", "re: a2"] and texts(tg_b) == ["re: b1", "re: b2"]  # none dropped as a duplicate
    assert await message_keys(pool) == [f"{bot}:{i}" for bot in (123, 456) for i in ids]
    assert len(fake_llm.requests) == 4


async def test_two_bots_side_by_side_each_answer_their_own_and_a_redelivery_once(
    start: Start, tg: FakeTelegram, tg_b: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    a, b = await start(tg, webhook=True), await start(tg_b, webhook=True)
    a1 = tg.message_update("a1", chat_id=USER, user_id=USER)
    b1 = tg_b.message_update("b1", chat_id=USER, user_id=USER)
    assert await a.post(tg, a1) == 200 and await b.post(tg_b, b1) == 200
    await tg.wait_sent(1)
    await tg_b.wait_sent(1)
    assert a1["update_id"] == b1["update_id"] and a1["message"]["message_id"] == b1["message"]["message_id"]
    assert await a.post(tg, a1) == 200 and await b.post(tg_b, b1) == 200  # each delivered again: stored once
    assert await a.post(tg, tg.message_update("a2", chat_id=USER, user_id=USER)) == 200
    assert await b.post(tg_b, tg_b.message_update("b2", chat_id=USER, user_id=USER)) == 200
    await tg.wait_sent(2)
    await tg_b.wait_sent(2)  # a chat's updates run in order: a redelivery answered again would have come first
    assert texts(tg) == ["re: a1", "re: a2"] and texts(tg_b) == ["re: b1", "re: b2"]
    assert len(fake_llm.requests) == 4
    rows = await pool.fetch("SELECT platform, count(*) AS n FROM inbox GROUP BY platform ORDER BY platform")
    assert [(r["platform"], r["n"]) for r in rows] == [("telegram:123", 2), ("telegram:456", 2)]


async def test_a_database_used_before_bots_were_told_apart_keeps_working(
    start: Start, tg: FakeTelegram, make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo
    old = make_core()  # what the version before stored: plain message ids, updates under "telegram"
    answer(await run(old, incoming("my name is Ann", user=str(USER), message_id="40")))
    left = tg.message_update("still there?", chat_id=USER, user_id=USER)
    left["update_id"] = 7
    await inbox_table.receive(pool, "telegram", 7, f"telegram:{USER}", left, None, 30.0)  # stored, not handled
    await start(tg)
    [sent] = await tg.wait_sent(1)
    assert sent["text"] == "re: still there?"
    said = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "user"]
    assert said == ["my name is Ann", "still there?"]  # the conversation goes on
    await say(tg, "and now?")
    assert texts(tg) == ["re: still there?", "re: and now?"]
    assert await message_keys(pool) == ["40", f"123:{left['message']['message_id']}", "123:3"]


async def test_discord_messages_are_keyed_by_the_bot_and_old_ones_still_answered(
    dc: FakeDiscord, make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo
    alice = dc.user(USER, "Alice")
    unanswered = await dc.post_message(alice, "still there?")  # not for the bot: stored below as the version before
    old = Incoming(
        "discord", str(USER), dc.channel_id, "still there?", "Alice", chat_kind="group", message_id=unanswered["id"]
    )
    stored = StoredMessage(old, int(dc.channel_id), int(dc.guild_id))
    await inbox_table.receive(pool, "discord", stored.message_id, old.chat_key, stored.payload(), None, 30.0)
    core = make_core(DISCORD_BOT_TOKEN=dc.token, DISCORD_API_BASE_URL=dc.api_base, DISCORD_GATEWAY_URL=dc.gateway_url)
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    await adapter.start()
    try:
        await dc.wait_sent(1)
        posted = await dc.post_message(alice, "hello", mention_bot=True)
        await dc.wait_sent(2)
    finally:
        await adapter.stop()
    assert [m["content"] for m in dc.sent] == ["re: Alice: still there?", "re: Alice: hello"]
    bot_id = dc.bot_user["id"]
    rows = await pool.fetch("SELECT platform, update_id FROM inbox ORDER BY received_at")
    assert [(r["platform"], str(r["update_id"])) for r in rows] == [
        ("discord", unanswered["id"]),
        (f"discord:{bot_id}", posted["id"]),
    ]
    assert await message_keys(pool) == [unanswered["id"], f"{bot_id}:{posted['id']}"]
