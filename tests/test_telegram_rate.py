"""Telegram's 30 messages per second are per bot: the processes running it share them through the fleet table."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest

from adapters.telegram import TelegramAdapter
from adapters.telegram.limits import TELEGRAM_FLEET_STALE_S, TELEGRAM_RATE_WINDOW_S
from adapters.telegram.request import BOT_MESSAGES_PER_S, fleet_share
from core.front_door import Core
from core.storage import fleet
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_telegram import FakeTelegram

TELEGRAM = ("telegram (@test_bot (webhook))",)
_peer_ids = itertools.count(1)


class ManualClock:
    """A monotonic clock that moves only when the test says so; sleeps end once it has moved far enough."""

    def __init__(self) -> None:
        """Start at 1000 s with nobody sleeping."""
        self.now = 1000.0
        self.waits: list[float] = []
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._new_sleeper = asyncio.Event()

    def __call__(self) -> float:
        """The current time."""
        return self.now

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has moved `seconds` on."""
        self.waits.append(seconds)
        done = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, done))
        self._new_sleeper.set()
        await done

    async def sleeping(self) -> None:
        """Wait until someone sleeps on this clock (then forget that they did)."""
        await asyncio.wait_for(self._new_sleeper.wait(), 5)
        self._new_sleeper.clear()

    def advance(self, seconds: float) -> None:
        """Move the clock on and wake the sleepers whose time has come."""
        self.now += seconds
        due = [s for s in self._sleepers if s[0] <= self.now + 1e-9]
        self._sleepers = [s for s in self._sleepers if s not in due]
        for _, done in due:
            if not done.done():
                done.set_result(None)


async def add_peer(pool: Pool, adapters: Sequence[str] = TELEGRAM, *, seen_s_ago: float = 0.0) -> str:
    """A row of another process in the fleet table, last seen `seen_s_ago` seconds ago; its id."""
    peer = f"elsewhere:{next(_peer_ids)}:abcdef"
    await pool.execute(
        "INSERT INTO processes (id, host, pid, version, adapters, seen_at)"
        " VALUES ($1, 'elsewhere', 1, 'test', $2, now() - make_interval(secs => $3))",
        peer,
        list(adapters),
        seen_s_ago,
    )
    return peer


def telegram_core(make_core: MakeCore, tg: FakeTelegram) -> Core:
    """A core with the fake Bot API configured."""
    return make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url)


@pytest.fixture
def mono() -> ManualClock:
    """The rate limiter's clock and sleep."""
    return ManualClock()


@pytest.fixture
async def adapter(
    tg: FakeTelegram, make_core: MakeCore, pool: Pool, mono: ManualClock
) -> AsyncIterator[TelegramAdapter]:
    """An adapter (not started) whose rate limiter runs on the manual mono."""
    core = telegram_core(make_core, tg)
    made = TelegramAdapter(core, core.settings, poll_timeout=1)
    made.rate_limiter.clock, made.rate_limiter.sleep = mono, mono.sleep
    yield made
    await made.stop()  # also fine when it never started


def sent_messages(tg: FakeTelegram) -> int:
    """sendMessage calls the fake got."""
    return sum(1 for method, _ in tg.calls if method == "sendMessage")


def test_each_process_takes_a_floor_share_of_the_bots_thirty_per_second() -> None:
    assert BOT_MESSAGES_PER_S == 30
    assert fleet_share(1) == (30, TELEGRAM_RATE_WINDOW_S)
    assert fleet_share(2) == (15, TELEGRAM_RATE_WINDOW_S)
    assert fleet_share(4) == (7, TELEGRAM_RATE_WINDOW_S)  # 28 together: never over 30 in any window
    assert fleet_share(30) == (1, TELEGRAM_RATE_WINDOW_S)
    count, window = fleet_share(60)  # past 30 processes: one each per a longer window, 30 per window in all
    assert count == 1 and window == pytest.approx(2 * TELEGRAM_RATE_WINDOW_S)
    assert fleet_share(0) == fleet_share(1)


async def test_peers_are_live_processes_running_the_adapter_but_this_one(pool: Pool) -> None:
    await add_peer(pool)
    await add_peer(pool, ("discord (bot#1 in 2 server(s))", "telegram (@test_bot)"))
    await add_peer(pool, ("discord (bot#1 in 2 server(s))",))  # no Telegram there
    await add_peer(pool, seen_s_ago=300)  # killed minutes ago
    await add_peer(pool, ("telegramish (x)",))
    me = await add_peer(pool)
    assert await fleet.peers(pool, "telegram", me) == 2
    assert await fleet.peers(pool, "discord", me) == 2


async def test_four_processes_running_the_bot_each_send_a_quarter(
    adapter: TelegramAdapter, tg: FakeTelegram, pool: Pool, mono: ManualClock
) -> None:
    for _ in range(3):
        await add_peer(pool)
    await add_peer(pool, seen_s_ago=300)  # gone: does not count
    await adapter.start()
    bot = adapter.bot
    sends = [asyncio.create_task(bot.send_message(1001, f"m{i}")) for i in range(20)]
    await mono.sleeping()  # the 8th waits for a place in this process's share
    await tg.wait_sent(7)
    assert sent_messages(tg) == 7 and mono.waits == [pytest.approx(TELEGRAM_RATE_WINDOW_S)]
    mono.advance(TELEGRAM_RATE_WINDOW_S)
    await mono.sleeping()
    await tg.wait_sent(14)
    assert sent_messages(tg) == 14
    mono.advance(TELEGRAM_RATE_WINDOW_S)
    await asyncio.gather(*sends)
    assert [m["text"] for m in tg.sent] == [f"m{i}" for i in range(20)]  # first come, first served


async def test_a_process_alone_sends_the_whole_thirty(adapter: TelegramAdapter, tg: FakeTelegram) -> None:
    await adapter.start()
    await asyncio.gather(*(adapter.bot.send_message(1001, f"m{i}") for i in range(30)))
    assert sent_messages(tg) == 30 and adapter.rate_limiter.budget.free(adapter.rate_limiter.clock()) == 0


async def test_reading_the_fleet_again_changes_the_share(adapter: TelegramAdapter, pool: Pool) -> None:
    limiter = adapter.rate_limiter
    peers = [await add_peer(pool) for _ in range(3)]
    await adapter.start()
    assert (limiter.processes, limiter.budget.count) == (4, 7)
    for peer in peers[1:]:
        await fleet.leave(pool, peer)
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.count) == (2, 15)
    await fleet.leave(pool, peers[0])
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.count) == (1, 30)
    for _ in range(5):
        await add_peer(pool)
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.count) == (6, 5)


async def test_a_stale_fleet_view_halves_the_share_until_the_fleet_can_be_read(
    adapter: TelegramAdapter,
    pool: Pool,
    mono: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = adapter.rate_limiter
    await add_peer(pool)
    await adapter.start()
    assert limiter.budget.count == 15

    async def unreachable(adapter: str) -> int:
        raise ConnectionRefusedError("the database is away")

    monkeypatch.setattr(adapter.core, "fleet_peers", unreachable)
    mono.advance(TELEGRAM_FLEET_STALE_S / 2)
    await adapter.take_share()
    assert limiter.budget.count == 15  # a recent view still holds
    mono.advance(TELEGRAM_FLEET_STALE_S)
    await adapter.take_share()
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.count) == (4, 7)  # as if twice as many processes: never more
    assert [r.getMessage() for r in caplog.records if "cannot read the fleet" in r.getMessage()] == [
        "cannot read the fleet (the database is away): sending at most half this process's share of Telegram's "
        "messages until it can"
    ]
    monkeypatch.undo()
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.count) == (2, 15)


async def test_the_fake_answers_429_past_its_per_bot_flood_limit(tg: FakeTelegram, mono: ManualClock) -> None:
    tg.flood_limit, tg.flood_clock = (3, 1.0), mono
    url = f"{tg.base_url}{tg.token}/sendMessage"

    async def send(http: aiohttp.ClientSession, chat: int) -> tuple[int, dict[str, object]]:
        async with http.post(url, json={"chat_id": chat, "text": "hi"}) as r:
            return r.status, await r.json()

    async with aiohttp.ClientSession() as http:
        assert [(await send(http, chat))[0] for chat in (1, 2, 3)] == [200, 200, 200]  # any chats: per bot
        mono.advance(0.4)
        status, body = await send(http, 4)
        assert status == 429 and body["parameters"] == {"retry_after": 1}
        assert body["description"] == "Too Many Requests: retry after 1"
        mono.advance(0.6)  # the first three leave the window
        assert (await send(http, 4))[0] == 200
    assert tg.flood_429s == 1 and len(tg.sent) == 4
