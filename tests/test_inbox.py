"""Telegram webhook mode and the inbox: the secret, redeliveries, per-chat order across processes, a dead worker,
hand-back on SIGTERM. Each "process" is a Core with its Telegram adapter and HTTP server on the one test database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from adapters.telegram import TelegramAdapter
from adapters.telegram.receive import SECRET_HEADER
from bot.web import WebServer
from core.constants import INBOX_CONCURRENCY
from core.front_door import Core
from core.inbox import Pace
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import die
from tests.test_web import free_port

StartProc = Callable[..., Awaitable["Proc"]]


@dataclass
class Proc:
    """One bot process in webhook mode."""

    core: Core
    adapter: TelegramAdapter
    url: str

    async def post(self, tg: FakeTelegram, update: dict[str, Any]) -> int:
        """POST an update to this process as Telegram does (with the secret)."""
        return await tg.post_webhook(update, secret=self.core.settings.webhook_secret, url=self.url)


@pytest.fixture
async def start_proc(tg: FakeTelegram, make_core: MakeCore) -> AsyncIterator[StartProc]:
    """Start webhook-mode processes (stopped at the end); `lease_s` shortens the inbox lease."""
    tg.set_webhook_every = 0  # several processes set the same webhook at start
    async with AsyncExitStack() as stack:

        async def start(
            lease_s: float = 30.0, poll_s: float = 0.05, concurrency: int = INBOX_CONCURRENCY, **overrides: Any
        ) -> Proc:
            port = free_port()
            url = f"http://127.0.0.1:{port}/telegram"
            core = make_core(
                TELEGRAM_BOT_TOKEN=tg.token,
                TELEGRAM_API_BASE_URL=tg.base_url,
                TELEGRAM_WEBHOOK_URL=url,
                ALLOWED_USERS="*",
                inbox_pace=Pace(concurrency, lease_s, poll_s),
                **overrides,
            )
            adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
            web = WebServer(core, ["telegram"], port, host="127.0.0.1")
            assert adapter.webhook_path == "/telegram"
            web.add_webhook(adapter.webhook_path, adapter.on_webhook)
            await web.start()
            stack.push_async_callback(web.stop)
            await adapter.start()
            stack.push_async_callback(adapter.stop)
            return Proc(core, adapter, url)

        yield start


def echo(delay: float = 0.0) -> Callable[[dict[str, Any]], Reply]:
    """A model that answers "re: <the last user message>"."""

    def respond(body: dict[str, Any]) -> Reply:
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        return Reply(text=f"re: {last}", delay=delay)

    return respond


class Hold:
    """A model whose first request waits until released (a turn caught in the middle); later ones echo."""

    def __init__(self) -> None:
        """Nothing asked yet."""
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, body: dict[str, Any]) -> Reply:
        """Hold the first request."""
        if not self.asked.is_set():
            self.asked.set()
            await self.release.wait()
            return Reply(text="from the first worker")
        return echo()(body)


async def caught_mid_turn(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, text: str, **proc_args: Any
) -> tuple[Proc, Hold]:
    """A new process whose turn on a message `text` waits for the model (until the Hold is released)."""
    hold = Hold()
    fake_llm.default = hold
    proc = await start_proc(**proc_args)
    assert await proc.post(tg, tg.message_update(text)) == 200
    await asyncio.wait_for(hold.asked.wait(), 5)
    return proc, hold


async def test_webhook_is_set_with_a_secret_and_a_wrong_secret_gets_403(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    p = await start_proc()
    assert tg.webhook is not None
    assert tg.webhook["url"] == p.url and tg.webhook["secret_token"] == p.core.settings.webhook_secret
    assert tg.webhook["allowed_updates"] == ["message", "callback_query"] and tg.webhook["max_connections"] == 40
    assert len(p.core.settings.webhook_secret) == 64  # derived from the bot token, the same in every process
    for secret in ("wrong", None, p.core.settings.webhook_secret[:-1]):
        assert await tg.post_webhook(tg.message_update("sneaky"), secret=secret, url=p.url) == 403
    assert await pool.fetchval("SELECT count(*) FROM inbox") == 0
    fake_llm.default = echo()
    tg.push_update(tg.message_update("hello"))  # the fake delivers it to the webhook with the secret
    [sent] = await tg.wait_sent(1)
    assert sent["text"] == "re: hello"
    assert not any(m["content"] == "sneaky" for r in fake_llm.requests for m in r["messages"])


async def test_a_webhook_post_that_is_no_update_is_a_dead_letter_and_one_that_cannot_be_stored_503(
    start_proc: StartProc, tg: FakeTelegram, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = await start_proc()
    headers = {SECRET_HEADER: p.core.settings.webhook_secret}

    async def database_away(*args: Any) -> None:
        raise ConnectionRefusedError("the database is away")

    async with aiohttp.ClientSession() as http:
        bodies = (b"", b"{not json", b"[1, 2]", "\u00e9".encode("latin-1"))
        for body in bodies:  # with the right secret it is Telegram's: kept, never asked for again
            async with http.post(p.url, data=body, headers=headers) as resp:
                assert (resp.status, await resp.text()) == (200, "ok"), body
        assert await pool.fetchval("SELECT count(*) FROM dead_letters") == len(bodies)
        monkeypatch.setattr(p.core, "receive", database_away)
        update = tg.message_update("hello") | {"update_id": 1}
        async with http.post(p.url, json=update, headers=headers) as resp:
            assert (resp.status, await resp.text()) == (503, "try again later")  # Telegram delivers it again later
    assert await pool.fetchval("SELECT count(*) FROM inbox") == 0


async def test_a_redelivered_update_is_stored_once_and_answered_once(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    await start_proc()
    fake_llm.default = echo()
    update_id = tg.push_update(tg.message_update("one"))
    await tg.wait_sent(1)
    assert await tg.redeliver(update_id) == 200  # Telegram did not see our 200 and sends it again
    tg.push_update(tg.message_update("two"))
    await tg.wait_sent(2)
    await asyncio.sleep(0.1)  # room for a wrong third answer
    assert [s["text"] for s in tg.sent] == ["re: one", "re: two"]
    assert await pool.fetchval("SELECT count(*) FROM inbox WHERE done_at IS NOT NULL") == 2


async def test_one_chat_is_answered_in_order_across_two_processes(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    a, b = await start_proc(), await start_proc()
    fake_llm.default = echo(delay=0.1)
    for n in range(1, 4):  # three messages of each chat, alternating between the processes, all stored at once
        for chat in (1001, 1002):
            proc = a if (n + chat) % 2 else b
            assert await proc.post(tg, tg.message_update(f"{chat}-{n}", chat_id=chat, user_id=chat)) == 200
    await tg.wait_sent(6)
    for chat in (1001, 1002):
        assert [s["text"] for s in tg.sent if s["chat_id"] == chat] == [f"re: {chat}-{n}" for n in range(1, 4)]
    # one at a time per chat: each request already saw the answer to the message before
    for chat in (1001, 1002):
        asked = [r["messages"] for r in fake_llm.requests if f"{chat}-" in r["messages"][-1]["content"]]
        assert [m["content"] for m in asked[2] if m["role"] == "assistant"] == [f"re: {chat}-1", f"re: {chat}-2"]


async def test_without_polling_each_update_is_taken_at_once_when_stored_or_when_a_slot_frees(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    # no poll to fall back on: only the notification of a stored update, and the end of an update whose chat has
    # another one waiting (or that held the last free slot), may wake the taker
    p = await start_proc(poll_s=3600.0, concurrency=2)
    fake_llm.default = echo(delay=0.05)
    for n in range(1, 4):
        for chat in (1001, 1002, 1003):  # three chats, two slots: one chat waits for a slot, each for its turn
            assert await p.post(tg, tg.message_update(f"{chat}-{n}", chat_id=chat, user_id=chat)) == 200
    await tg.wait_sent(9)
    for chat in (1001, 1002, 1003):
        assert [s["text"] for s in tg.sent if s["chat_id"] == chat] == [f"re: {chat}-{n}" for n in range(1, 4)]
    assert await p.post(tg, tg.message_update("later", chat_id=1004, user_id=1004)) == 200  # the taker was idle
    await tg.wait_sent(10)


async def test_a_worker_that_dies_mid_turn_loses_nothing_and_the_answer_comes_once(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    a, hold = await caught_mid_turn(start_proc, tg, fake_llm, "are you there?", lease_s=0.5)
    await die(a.core)
    await start_proc(lease_s=0.5)  # another process takes it once the lease has run out
    [sent] = await tg.wait_sent(1)
    assert sent["text"] == "re: are you there?"
    hold.release.set()
    await asyncio.sleep(0.1)
    assert len(tg.sent) == 1
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 1
    assert await pool.fetchval("SELECT status FROM turns") == "done"
    assert await pool.fetchval("SELECT attempts FROM inbox") == 2


async def test_an_answer_stored_before_the_worker_died_is_sent_not_recomputed(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo()
    a = await start_proc(lease_s=0.5)
    tg.fail_next("sendMessage", status=429, retry_after=60)  # the answer is stored, its send waits out a 429
    assert await a.post(tg, tg.message_update("remember me")) == 200
    await tg.wait_for(lambda: any(m == "sendMessage" for m, _ in tg.calls))
    await die(a.core)
    await start_proc(lease_s=0.5)
    [sent] = await tg.wait_sent(1)
    assert sent["text"] == "re: remember me"
    assert len(fake_llm.requests) == 1  # the stored answer was sent; the model was not asked again


async def test_sigterm_hands_a_running_update_back_to_another_process_at_once(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    # the default 30 s lease: only a hand-back lets b answer within the test
    a, _ = await caught_mid_turn(start_proc, tg, fake_llm, "quick question")
    await start_proc()
    assert await a.core.inbox.stop(0.05) == 1  # SIGTERM: the grace is over, the update goes back
    [sent] = await tg.wait_sent(1)
    assert sent["text"] == "re: quick question"
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 1
    assert a.core.inbox.held == 0


async def test_an_update_that_took_down_three_processes_is_given_up(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    fake_llm.default = echo()
    p = await start_proc()
    await p.core.inbox.stop(0)  # not taking updates while the poisoned one is planted
    assert await p.post(tg, tg.message_update("poison")) == 200
    await pool.execute("UPDATE inbox SET attempts = 3")  # three processes died handling it
    p.core.inbox.serve(p.adapter.source, p.adapter.receiver.parse, p.adapter.routes.route)
    for _ in range(250):  # the row is marked done without a handler run (nothing to wait on but the database)
        if await pool.fetchval("SELECT done_at IS NOT NULL FROM inbox"):
            break
        await asyncio.sleep(0.02)
    assert any("given up after 3 attempts" in r.getMessage() for r in caplog.records)
    assert tg.sent == [] and fake_llm.requests == []


async def test_an_answer_sent_before_the_worker_died_is_not_sent_again(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    a, hold = await caught_mid_turn(start_proc, tg, fake_llm, "ping", lease_s=0.5)
    async with pool.acquire() as con, con.transaction():
        await con.execute("SELECT 1 FROM inbox FOR UPDATE")  # the worker cannot mark the update done…
        hold.release.set()
        [sent] = await tg.wait_sent(1)
        for _ in range(250):  # …but it records the sent answer right after Telegram took it
            if await pool.fetchval("SELECT sent_parts FROM turns") == 1:
                break
            await asyncio.sleep(0.02)
        await die(a.core)  # and dies before the inbox knows
    assert await pool.fetchval("SELECT done_at IS NULL FROM inbox")
    await start_proc(lease_s=0.5)
    for _ in range(250):
        if await pool.fetchval("SELECT done_at IS NOT NULL FROM inbox"):
            break
        await asyncio.sleep(0.02)
    assert await pool.fetchval("SELECT attempts FROM inbox") == 2  # taken again by the second process…
    assert [s["text"] for s in tg.sent] == [sent["text"]] == ["from the first worker"]  # …which sent nothing more
    assert len(fake_llm.requests) == 1


async def test_only_the_parts_not_yet_sent_are_sent_by_the_next_worker(
    start_proc: StartProc, tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    long_answer = "first half. " * 400 + "second half. " * 100  # 6,100 characters: two Telegram messages
    fake_llm.default = Reply(text=long_answer)
    a = await start_proc(lease_s=0.5)
    tg.fail_next("sendMessage", status=429, retry_after=60, after=1)  # part 2 waits out a long 429
    assert await a.post(tg, tg.message_update("tell me a long story")) == 200
    await tg.wait_for(lambda: sum(m == "sendMessage" for m, _ in tg.calls) == 2)
    assert await pool.fetchval("SELECT sent_parts FROM turns") == 1
    await die(a.core)
    await start_proc(lease_s=0.5)
    await tg.wait_sent(2)
    await asyncio.sleep(0.1)  # room for a wrong third message
    first, second = (s["text"] for s in tg.sent)
    assert first.startswith("first half.") and second.rstrip().endswith("second half.")
    assert len(tg.sent) == 2 and len(fake_llm.requests) == 1
    assert await pool.fetchval("SELECT sent_parts FROM turns") == 2
