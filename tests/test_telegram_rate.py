"""Telegram's 30 messages per second are per bot: the processes running it share them through the fleet table."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator, Sequence

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.telegram import TelegramAdapter
from adapters.telegram.limits import TELEGRAM_FLEET_STALE_S
from adapters.telegram.request import BOT_MESSAGES_PER_S, SendBucket, fleet_share
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


def test_each_process_takes_an_nth_of_the_fleets_bucket() -> None:
    assert BOT_MESSAGES_PER_S == 30
    assert fleet_share(1) == pytest.approx((27, 27))  # 27 at once, 27 a second: a tenth under Telegram's 30
    assert fleet_share(2) == pytest.approx((13.5, 13.5))
    assert fleet_share(4) == pytest.approx((6.75, 6.75))  # 27 at once and 27 a second together
    assert fleet_share(27) == pytest.approx((1, 1))
    assert fleet_share(54) == pytest.approx((1, 0.5))  # one at a time at least, 27 a second together
    assert fleet_share(0) == fleet_share(1)


def test_the_bucket_lets_its_burst_out_at_once_then_its_rate() -> None:
    bucket = SendBucket(3, 2.0)
    assert bucket.free(10.0) == 3 and bucket.wait_s(10.0) == 0
    for _ in range(3):
        bucket.record(10.0)
    assert bucket.free(10.0) == 0 and bucket.wait_s(10.0) == pytest.approx(0.5)
    assert bucket.free(10.5) == 1  # one has leaked out
    bucket.record(10.5)
    assert bucket.wait_s(10.5) == pytest.approx(0.5)
    assert bucket.free(12.0) == 3  # empty again
    bucket.record(12.0)
    bucket.resize(1.5, 1.0, 12.0)  # a smaller share: the send just made still counts
    assert bucket.wait_s(12.0) == pytest.approx(0.5)
    bucket.resize(0.2, 1.0, 12.0)  # never under one send at a time
    assert bucket.burst == 1 and bucket.wait_s(12.0) == pytest.approx(1.0)


def paced(bucket: SendBucket, wants: list[float]) -> list[float]:
    """When a process whose share is `bucket` sends messages wanted at `wants` (sorted), first come, first served."""
    sent, t = [], 0.0
    for want in wants:
        t = max(t, want)
        t += bucket.wait_s(t)
        assert bucket.wait_s(t) == 0
        bucket.record(t)
        sent.append(t)
    return sent


JITTER_S = 0.1  # what TELEGRAM_SEND_SHARE leaves room for: a send reaching Telegram up to this late
# when a process's answers are ready: crowds of up to 40 at the same moment (often the same moment in every process)
schedules = st.lists(st.tuples(st.sampled_from((0.0, 1.0)) | st.floats(0, 3), st.integers(1, 40)), max_size=3).map(
    lambda crowds: sorted(t for t, size in crowds for _ in range(size))
)


def most_over(sends: list[float], burst: float, rate: float, jitter: float) -> float:
    """The most by which some run of `sends` (sorted) exceeds burst + rate·t, t its span shortened by `jitter` (0 at
    most: the run of sends i..j may reach the other end within t_j - t_i - jitter, or at once)."""
    worst, lowest, first, near = -math.inf, math.inf, 0, 0
    for j, t in enumerate(sends):
        while sends[near] < t - jitter:  # sends[near:j + 1] may arrive at the same moment
            near += 1
        worst = max(worst, j - near + 1 - burst)
        while sends[first] < t - jitter:  # lowest: min over these i of i - rate·(t_i + jitter)
            lowest = min(lowest, first - rate * (sends[first] + jitter))
            first += 1
        worst = max(worst, j + 1 - rate * t - lowest - burst)
    return worst


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 27).flatmap(lambda n: st.lists(schedules, min_size=n, max_size=n)), st.data())
def test_a_fleet_never_sends_past_its_bucket_nor_past_telegrams_with_jitter(
    schedule: list[list[float]], data: st.DataObject
) -> None:
    """n processes, each wanting its messages sent at any times: together they send at most 27 + 27·t in any t
    seconds, and however each send is delayed on its way (0 to JITTER_S) Telegram never sees more than 30 + 30·t in
    any t seconds, so the fake's bucket of 30 at once and 30 a second never answers 429."""
    n = len(schedule)
    sends = sorted(t for wants in schedule for t in paced(SendBucket(*fleet_share(n)), wants))
    burst, rate = (n * x for x in fleet_share(n))
    assert most_over(sends, burst, rate, 0.0) <= 1e-6
    assert most_over(sends, BOT_MESSAGES_PER_S, BOT_MESSAGES_PER_S, JITTER_S) <= 1e-6
    if not sends:
        return
    tg, clock = FakeTelegram(), ManualClock()
    tg.flood_bucket, tg.flood_clock = (BOT_MESSAGES_PER_S, float(BOT_MESSAGES_PER_S)), clock
    bunch = data.draw(st.sampled_from(sends))  # one such delay: every send up to JITTER_S before it arrives with it
    for clock.now in sorted(min(t + JITTER_S, max(t, bunch)) for t in sends):
        assert tg._flooded() is None


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
    await mono.sleeping()  # the 7th waits for room in this process's bucket: 6.75 at once, 6.75 a second
    await tg.wait_sent(6)
    assert sent_messages(tg) == 6 and mono.waits == [pytest.approx(0.25 / 6.75)]
    mono.advance(0.25 / 6.75)
    for sent in range(7, 20):  # then one every 1 / 6.75 s: the 20th 14 sends after the 6th
        await mono.sleeping()
        await tg.wait_sent(sent)
        assert sent_messages(tg) == sent and mono.waits[-1] == pytest.approx(1 / 6.75)
        mono.advance(1 / 6.75)
    await asyncio.gather(*sends)
    assert [m["text"] for m in tg.sent] == [f"m{i}" for i in range(20)]  # first come, first served
    assert mono.now - 1000 == pytest.approx((20 - 6.75) / 6.75)


async def test_a_process_alone_sends_twenty_seven_at_once_then_twenty_seven_a_second(
    adapter: TelegramAdapter, tg: FakeTelegram, mono: ManualClock
) -> None:
    await adapter.start()
    await asyncio.gather(*(adapter.bot.send_message(1001, f"m{i}") for i in range(27)))
    limiter = adapter.rate_limiter
    assert sent_messages(tg) == 27 and limiter.budget.free(limiter.clock()) == 0 and mono.waits == []
    last = asyncio.create_task(adapter.bot.send_message(1001, "m27"))
    await mono.sleeping()
    assert mono.waits == [pytest.approx(1 / 27)]
    mono.advance(1 / 27)
    await last
    assert sent_messages(tg) == 28


async def test_reading_the_fleet_again_changes_the_share(adapter: TelegramAdapter, pool: Pool) -> None:
    limiter = adapter.rate_limiter
    peers = [await add_peer(pool) for _ in range(3)]
    await adapter.start()
    assert (limiter.processes, limiter.budget.burst, limiter.budget.rate) == (4, 6.75, 6.75)
    for peer in peers[1:]:
        await fleet.leave(pool, peer)
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.burst, limiter.budget.rate) == (2, 13.5, 13.5)
    await fleet.leave(pool, peers[0])
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.burst, limiter.budget.rate) == (1, 27, 27)
    for _ in range(5):
        await add_peer(pool)
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.burst) == (6, 4.5)


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
    assert limiter.budget.burst == 13.5

    async def unreachable(adapter: str) -> int:
        raise ConnectionRefusedError("the database is away")

    monkeypatch.setattr(adapter.core, "fleet_peers", unreachable)
    mono.advance(TELEGRAM_FLEET_STALE_S / 2)
    await adapter.take_share()
    assert limiter.budget.burst == 13.5  # a recent view still holds
    mono.advance(TELEGRAM_FLEET_STALE_S)
    await adapter.take_share()
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.burst) == (4, 6.75)  # as if twice as many processes: never more
    assert [r.getMessage() for r in caplog.records if "cannot read the fleet" in r.getMessage()] == [
        "cannot read the fleet (the database is away): sending at most half this process's share of Telegram's "
        "messages until it can"
    ]
    monkeypatch.undo()
    await adapter.take_share()
    assert (limiter.processes, limiter.budget.burst) == (2, 13.5)


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


async def test_the_fakes_token_bucket_lets_a_burst_through_then_its_rate(tg: FakeTelegram, mono: ManualClock) -> None:
    tg.flood_bucket, tg.flood_clock = (3, 2.0), mono
    url = f"{tg.base_url}{tg.token}/sendMessage"

    async def send(http: aiohttp.ClientSession, chat: int) -> tuple[int, dict[str, object]]:
        async with http.post(url, json={"chat_id": chat, "text": "hi"}) as r:
            return r.status, await r.json()

    async with aiohttp.ClientSession() as http:
        assert [(await send(http, chat))[0] for chat in (1, 2, 3)] == [200, 200, 200]
        status, body = await send(http, 4)
        assert status == 429 and body["parameters"] == {"retry_after": 1}
        mono.advance(0.5)  # one token back
        assert [(await send(http, chat))[0] for chat in (4, 5)] == [200, 429]
        mono.advance(10)  # full again: 3 at once, not 20
        assert [(await send(http, chat))[0] for chat in (6, 7, 8, 9)] == [200, 200, 200, 429]
    assert tg.flood_429s == 3 and len(tg.sent) == 7 and tg.flood_peak == 4  # 4 within a second (0.5 s apart)
