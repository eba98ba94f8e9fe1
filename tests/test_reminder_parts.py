"""A reminder of several parts: a retry after a failed later part sends only the parts the platform lacks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.discord.adapter import DiscordAdapter
from adapters.telegram import TelegramAdapter
from core.front_door import Core
from core.reminders.engine import Outbox, ReminderEngine
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import BLOCKED, FakeTelegram, parse_html
from tests.helpers import answer, incoming, run

ANN, ALICE = "1001", "2001"
LONG = "\n".join(f"Line {i:03}: something worth reading about the day ahead." for i in range(120))  # ~7,000 chars


async def _never(_: float) -> None:
    """Lease renewal that never comes round (the test clock does not move while a send runs)."""
    await asyncio.Event().wait()


def engine(pool: Pool, clock: FakeClock, platform: str, outbox: Outbox, core: Core) -> ReminderEngine:
    """A fresh engine (a process of its own) on the test database, sending through the real adapter."""
    return ReminderEngine(pool, {platform: outbox}, clock, agent=core.answer_text, sleep=_never)


async def create(core: Core, llm: FakeOpenAI, args: dict[str, Any], **where: Any) -> None:
    """Have the model create a task due at 10:01, then move the clock to that minute."""
    llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "due_at": "2026-11-21T10:01", **args})]),
        Reply(text="ok"),
    )
    answer(await run(core, incoming("task", **where)))


async def occurrence(pool: Pool) -> Any:
    """The only occurrence row."""
    row = await pool.fetchrow("SELECT status, sent_parts, sent_text, error, lease_until FROM occurrences")
    assert row is not None
    return row


@pytest.fixture
async def telegram(tg: FakeTelegram, make_core: MakeCore) -> AsyncIterator[tuple[Core, TelegramAdapter]]:
    """The real Telegram adapter against the fake Bot API; user 1001 may use the bot."""
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, ADMINS=f"telegram:{ANN}")
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    await adapter.start()
    try:
        yield core, adapter
    finally:
        await adapter.stop()


@pytest.fixture
async def discord_bot(dc: FakeDiscord, make_core: MakeCore) -> AsyncIterator[tuple[Core, DiscordAdapter]]:
    """The real Discord adapter against the fake REST + gateway; Alice may use the bot."""
    core = make_core(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        ADMINS=f"discord:{ALICE}",
    )
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    await adapter.start()
    try:
        yield core, adapter
    finally:
        await adapter.stop()


def visible(parts: list[dict[str, Any]]) -> str:
    """The text Telegram shows for these messages, joined."""
    return "\n".join(parse_html(p["text"])[0] for p in parts)


async def test_telegram_agent_job_failing_on_its_second_part_resends_only_that_part(
    telegram: tuple[Core, TelegramAdapter], tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core, adapter = telegram
    await create(core, fake_llm, {"title": "Morning summary", "job": "summarise my day"}, user=ANN)
    clock.advance(minutes=1)
    fake_llm.script(Reply(text=LONG))
    tg.fail_next("sendMessage", status=500, description="Internal Server Error", retry_after=None, after=1)
    first = engine(pool, clock, "telegram", adapter, core)
    await first.tick()
    assert await first.drain() == 0
    row = await occurrence(pool)
    assert row["status"] == "claimed" and row["sent_parts"] == 1 and "Internal Server Error" in row["error"]
    assert len(tg.sent) == 1 and "reply_markup" not in tg.sent[0]
    requests = len(fake_llm.requests)
    clock.now = row["lease_until"]
    second = engine(pool, clock, "telegram", adapter, core)  # another process takes the retry
    assert await second.tick() == 1
    assert await second.drain() == 0  # the answer is not asked for again …
    assert len(fake_llm.requests) == requests
    part1, part2 = tg.sent  # … and part 1 is not sent again
    assert sum(1 for m, _ in tg.calls if m == "sendMessage") == 3  # part 1, part 2 failing, part 2
    assert visible([part1, part2]) == f"⏰ Morning summary\n\n{LONG}"
    assert "reply_markup" not in part1
    assert [b["callback_data"] for b in part2["reply_markup"]["inline_keyboard"][0]] == [
        "rem:done:1",
        "rem:snooze10:1",
        "rem:snooze60:1",
    ]
    row = await occurrence(pool)
    assert row["status"] == "delivered" and row["sent_parts"] == 2 and row["sent_text"] is None


async def test_telegram_refusal_on_a_later_part_ends_the_reminder_as_failed(
    telegram: tuple[Core, TelegramAdapter], tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core, adapter = telegram
    await create(core, fake_llm, {"title": "Morning summary", "job": "summarise my day"}, user=ANN)
    clock.advance(minutes=1)
    fake_llm.script(Reply(text=LONG))
    tg.fail_next("sendMessage", status=403, description=BLOCKED, retry_after=None, after=1)
    eng = engine(pool, clock, "telegram", adapter, core)
    await eng.tick()
    assert await eng.drain() == 0
    row = await occurrence(pool)
    assert row["status"] == "failed" and "blocked" in row["error"] and row["sent_text"] is None
    assert len(tg.sent) == 1 and eng.failed_deliveries == 1


async def test_telegram_retry_after_every_part_was_sent_sends_nothing(
    telegram: tuple[Core, TelegramAdapter], tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core, adapter = telegram
    await create(core, fake_llm, {"title": "Stretch"}, user=ANN)
    clock.advance(minutes=1)
    # a process sent the whole reminder and died before recording its delivery
    await pool.execute(
        "INSERT INTO occurrences (task_id, scheduled_at, claimed_by, lease_until, sent_parts, sent_text)"
        " SELECT id, due_at, 'dead', $1, 1, '⏰ Stretch — due 10:01' FROM tasks",
        clock.now,
    )
    assert await engine(pool, clock, "telegram", adapter, core).tick() == 1
    assert tg.sent == [] and (await occurrence(pool))["status"] == "delivered"


async def test_discord_reminder_failing_on_its_second_part_resends_only_that_part(
    discord_bot: tuple[Core, DiscordAdapter], dc: FakeDiscord, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core, adapter = discord_bot
    channel = str(dc.channel_id)
    where = {"platform": "discord", "user": ALICE, "chat": channel, "kind": "group", "name": "Alice"}
    await create(core, fake_llm, {"title": "Read this", "details": LONG[:3500]}, **where)
    clock.advance(minutes=1)
    dc.fail_next("/messages", 503, 0, "upstream connect error", after=1)
    assert await engine(pool, clock, "discord", adapter, core).tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "claimed" and row["sent_parts"] == 1
    assert len(dc.sent) == 1 and not dc.sent[0].get("components")
    clock.advance(minutes=2)  # past the lease and the "late" mark: the wording must not change mid-reminder
    assert await engine(pool, clock, "discord", adapter, core).tick() == 1
    part1, part2 = dc.sent
    assert part1["content"].startswith(f"<@{ALICE}> ⏰ Read this — due 10:01\n")
    assert LONG[:3500].endswith(part2["content"].strip())
    assert [c["custom_id"].split(":")[1] for row in part2["components"] for c in row["components"]] == [
        "done",
        "snooze10",
        "snooze60",
    ]
    assert dc.failed == [f"POST /channels/{channel}/messages"]
    assert (await occurrence(pool))["status"] == "delivered"


async def test_telegram_agent_job_whose_first_part_failed_sends_its_answer_on_retry_not_the_fallback(
    telegram: tuple[Core, TelegramAdapter], tg: FakeTelegram, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core, adapter = telegram
    await create(core, fake_llm, {"title": "Morning summary", "job": "summarise my day"}, user=ANN)
    clock.advance(minutes=1)
    fake_llm.script(Reply(text="Two meetings and a dentist."))
    tg.fail_next("sendMessage", status=500, description="Internal Server Error", retry_after=None)
    first = engine(pool, clock, "telegram", adapter, core)
    await first.tick()
    assert await first.drain() == 0 and tg.sent == []
    clock.now = (await occurrence(pool))["lease_until"]
    second = engine(pool, clock, "telegram", adapter, core)
    assert await second.tick() == 1
    (sent,) = tg.sent
    assert visible([sent]) == "⏰ Morning summary\n\nTwo meetings and a dentist."
