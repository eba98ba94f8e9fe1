"""A reminder whose chat is closed for good (bot blocked, group or channel gone) goes to another private chat of the
same account, says so, and is delivered exactly once across retries, crashes and processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from adapters.discord.adapter import DiscordAdapter
from adapters.telegram import TelegramAdapter
from core.commands import Ask
from core.commands.tasks import tasks as tasks_answer
from core.front_door import Core
from core.reminders import queries
from core.reminders.engine import DeliveryRefused, Outbox, ReminderEngine
from core.reminders.messages import ReminderMessage
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import BLOCKED, KICKED, FakeTelegram
from tests.helpers import answer, incoming, run
from tests.test_reminders import create, occurrence, soon

ANN, ALICE = 1001, 2001  # one person: Ann on Telegram, Alice on Discord
NOTE_TG = "(Sent here because I can no longer write to your Telegram chat. This task's later reminders come here too.)"
BLOCKED_TEXT = "Forbidden: bot was blocked by the user"


class Chats:
    """A platform's outbox: refuses some chats for good, can fail the next sends or hold them, and sends only the
    part the platform does not have yet (one part per message), recording it as an adapter does."""

    def __init__(self, refused: dict[str, str] | None = None) -> None:
        """Nothing sent yet."""
        self.refused = refused or {}
        self.calls: list[ReminderMessage] = []
        self.sent: list[ReminderMessage] = []
        self.fail = 0
        self.hold = ""  # "before" or "after" the platform accepts it: the send hangs there (a process killed)
        self.held = asyncio.Event()

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Refuse, fail, hang or send one reminder."""
        self.calls.append(msg)
        if msg.chat_id in self.refused:
            raise DeliveryRefused(self.refused[msg.chat_id])
        if self.fail:
            self.fail -= 1
            raise ConnectionError("platform down")
        await self._hang("before")
        if msg.sent_parts >= 1:
            return None
        self.sent.append(msg)
        await msg.mark_sent(1)
        await self._hang("after")
        return f"m{len(self.sent)}"

    async def _hang(self, where: str) -> None:
        """Hang for ever here when told to."""
        if self.hold == where:
            self.held.set()
            await asyncio.Event().wait()


async def _never(_: float) -> None:
    """Lease renewal that never comes round."""
    await asyncio.Event().wait()


def engine(pool: Pool, clock: FakeClock, outboxes: dict[str, Any], name: str = "a") -> ReminderEngine:
    """An engine (a process named `name`) on the test database with the test's clock."""
    return ReminderEngine(pool, outboxes, clock, sleep=_never, instance=name)


async def killed(eng: ReminderEngine, held: asyncio.Event) -> None:
    """Run a tick until `held` is set, then kill it there (its claims stay in the database)."""
    tick = asyncio.create_task(eng.tick())
    await soon(held.wait())
    tick.cancel()
    await asyncio.gather(tick, return_exceptions=True)
    await eng.close()


async def say(core: Core, fake: FakeOpenAI, *, platform: str, user: str, chat: str, name: str) -> None:
    """`user` talks to the bot in a private chat (a turn there)."""
    fake.script(Reply(text="hi"))
    answer(await run(core, incoming("hello", user=user, chat=chat, platform=platform, name=name)))


async def link(pool: Pool, platform: str, user: str, to_platform: str, to_user: str) -> None:
    """Put an identity on another identity's account (what /link does)."""
    await pool.execute(
        "UPDATE users SET account_id = (SELECT account_id FROM users WHERE platform = $3 AND platform_user_id = $4)"
        " WHERE platform = $1 AND platform_user_id = $2",
        platform,
        user,
        to_platform,
        to_user,
    )


async def chat_of_task(pool: Pool) -> tuple[str, str]:
    """The platform and chat id where the first task's reminders go now."""
    sql = "SELECT c.platform, c.platform_chat_id FROM tasks t JOIN chats c ON c.id = t.chat_id ORDER BY t.id LIMIT 1"
    row = await pool.fetchrow(sql)
    assert row is not None
    return row["platform"], row["platform_chat_id"]


@pytest.fixture
async def ann(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> Core:
    """Ann made a daily 10:30 task in her Telegram chat (100); Alice, her linked Discord identity, talked to the bot in
    a DM (9001)."""
    core = make_core()
    await create(core, fake_llm, {"title": "Daily", "recurrence": {"kind": "cron", "time": "10:30"}})
    await say(core, fake_llm, platform="discord", user="2001", chat="9001", name="Alice")
    await link(pool, "discord", "2001", "telegram", "100")
    return core


# ---- through the real adapters against the fake Telegram and Discord


@dataclass
class Both:
    """One process running the Telegram and the Discord adapter on one core."""

    core: Core
    tg: FakeTelegram
    dc: FakeDiscord
    telegram: TelegramAdapter
    discord: DiscordAdapter

    def outboxes(self) -> dict[str, Outbox]:
        """What bot/ gives the engine."""
        return {"telegram": self.telegram, "discord": self.discord}


@pytest.fixture
async def both(tg: FakeTelegram, dc: FakeDiscord, make_core: MakeCore) -> AsyncIterator[Both]:
    """Both real adapters started against their fakes."""
    core = make_core(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        DEFAULT_TIMEZONE="Europe/Berlin",
    )
    telegram = TelegramAdapter(core, core.settings, poll_timeout=1)
    discord = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    await telegram.start()
    try:
        await discord.start()
        try:
            yield Both(core, tg, dc, telegram, discord)
        finally:
            await discord.stop()
    finally:
        await telegram.stop()


async def tg_say(b: Both, text: str, **kw: Any) -> None:
    """Ann writes to the Telegram bot and gets an answer."""
    before = len(b.tg.sent)
    b.tg.push_update(b.tg.message_update(text, **kw))
    await b.tg.wait_sent(before + 1)


async def dc_dm(b: Both, user: dict[str, Any], text: str) -> None:
    """A Discord user writes to the bot in a DM and gets an answer."""
    before = len(b.dc.sent)
    await b.dc.post_message(user, text, dm=True)
    await b.dc.wait_sent(before + 1)


def tg_sends_to(tg: FakeTelegram, chat_id: int) -> int:
    """How many sendMessage calls Telegram got for this chat (refused ones too)."""
    return sum(1 for m, body in tg.calls if m == "sendMessage" and str(body.get("chat_id")) == str(chat_id))


def button_ids(message: dict[str, Any]) -> list[str]:
    """The custom ids of a Discord message's buttons."""
    return [c["custom_id"] for row in message.get("components") or [] for c in row["components"]]


async def test_blocked_telegram_chat_sends_to_the_linked_discord_dm_where_its_buttons_work(
    both: Both, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum", "due_at": "2026-11-21T11:30"})]),
        Reply(text="Will do."),
    )
    await tg_say(both, "remind me to call mum at 11:30")
    alice, bob = both.dc.user(ALICE, "Alice"), both.dc.user(2002, "Bob")
    fake_llm.script(Reply(text="hi Alice"), Reply(text="hi Bob"))
    await dc_dm(both, alice, "hello")
    await dc_dm(both, bob, "hello")  # Bob's DM is someone else's: never a fallback for Ann
    await link(pool, "discord", str(ALICE), "telegram", str(ANN))
    both.tg.refuse_chat(ANN, BLOCKED)
    clock.advance(minutes=30)  # 11:30 in Berlin
    before = len(both.dc.sent)
    assert await engine(pool, clock, both.outboxes()).tick() == 1
    [reminder] = both.dc.sent[before:]
    assert reminder["channel_id"] == str(both.dc.dm_channel_id(ALICE))
    assert reminder["content"] == f"⏰ Call mum — due 11:30\n\n{NOTE_TG}"
    assert tg_sends_to(both.tg, ANN) == 2  # the answer, then the refused reminder
    row = await pool.fetchrow("SELECT status, error, platform_message_id FROM occurrences")
    assert row is not None and row["status"] == "delivered" and row["error"] is None
    assert row["platform_message_id"] == reminder["id"]
    assert await chat_of_task(pool) == ("discord", str(both.dc.dm_channel_id(ALICE)))
    # the buttons work for Alice (Ann's account), not for anyone else
    task_id = await pool.fetchval("SELECT id FROM tasks")
    assert button_ids(reminder) == [f"rem:done:{task_id}", f"rem:snooze10:{task_id}", f"rem:snooze60:{task_id}"]
    refused = await both.dc.click(reminder, f"rem:snooze10:{task_id}", bob)
    await refused.wait_done()
    assert "Only the person" in refused.texts()[0]
    snoozed = await both.dc.click(reminder, f"rem:snooze10:{task_id}", alice)
    await snoozed.wait_done()
    assert await pool.fetchval("SELECT due_at FROM tasks") == clock.now + timedelta(minutes=10)
    # the snoozed reminder goes straight to the DM (Telegram is not asked again), without the note, then Done
    clock.advance(minutes=10)
    assert await engine(pool, clock, both.outboxes()).tick() == 1
    again = both.dc.sent[-1]
    assert again["content"] == "⏰ Call mum — due 11:40" and tg_sends_to(both.tg, ANN) == 2
    done = await both.dc.click(again, f"rem:done:{task_id}", alice)
    await done.wait_done()
    assert await pool.fetchval("SELECT status FROM tasks") == "done"


async def test_a_telegram_group_the_bot_left_sends_to_the_owners_private_chat(
    both: Both, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    fake_llm.script(Reply(text="hi Ann"))
    await tg_say(both, "hello")  # Ann's private chat with the bot
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Standup", "due_at": "2026-11-21T11:15"})]),
        Reply(text="ok"),
    )
    await tg_say(both, "@test_bot remind me of standup at 11:15", chat_id=-300, chat_type="supergroup")
    both.tg.refuse_chat(-300, KICKED)
    clock.advance(minutes=15)
    before = len(both.tg.sent)
    assert await engine(pool, clock, both.outboxes()).tick() == 1
    [reminder] = both.tg.sent[before:]
    assert reminder["chat_id"] == ANN
    assert reminder["text"].startswith("⏰ Standup — due 11:15\n\n(Sent here because I can no longer write to the ")
    assert "Telegram group. This task's later reminders come here too.)" in reminder["text"]
    assert not reminder["text"].startswith("<a href")  # a private chat: nobody to mention
    assert await chat_of_task(pool) == ("telegram", str(ANN))
    assert (await occurrence(pool))["status"] == "delivered"


# ---- the engine's rules, with fake outboxes


async def test_no_linked_private_chat_fails_as_before(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core()
    await create(core, fake_llm, {"title": "Daily", "recurrence": {"kind": "cron", "time": "10:30"}})
    await say(core, fake_llm, platform="discord", user="2001", chat="9001", name="Alice")  # not linked
    await create(core, fake_llm, {"title": "Other"}, chat="-500", kind="group")  # a group is no fallback
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    assert await engine(pool, clock, {"telegram": tg, "discord": dc}).tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "failed" and row["error"] == BLOCKED_TEXT
    assert [m.chat_id for m in tg.calls] == ["100"] and dc.calls == []
    assert await chat_of_task(pool) == ("telegram", "100")
    tasks = await tasks_answer(Ask(incoming("/tasks"), {}, core))
    assert "could not be delivered" in tasks and BLOCKED_TEXT in tasks


async def test_a_linked_chat_on_a_platform_no_process_runs_is_no_fallback(
    ann: Core, pool: Pool, clock: FakeClock
) -> None:
    clock.advance(minutes=30)
    tg = Chats({"100": BLOCKED_TEXT})
    assert await engine(pool, clock, {"telegram": tg}).tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "failed" and row["error"] == BLOCKED_TEXT
    assert await chat_of_task(pool) == ("telegram", "100")


async def test_later_occurrences_go_to_the_new_chat_for_the_identity_there(
    ann: Core, pool: Pool, clock: FakeClock
) -> None:
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    eng = engine(pool, clock, {"telegram": tg, "discord": dc})
    assert await eng.tick() == 1
    [first] = dc.sent
    assert (first.chat_id, first.chat_kind, first.owner_id, first.owner_name) == ("9001", "private", "2001", "Alice")
    assert first.text.endswith(f"\n\n{NOTE_TG}") and first.sent_parts == 0
    clock.advance(days=1)
    assert await eng.tick() == 1
    second = dc.sent[1]
    assert second.chat_id == "9001" and second.owner_id == "2001"  # Alice's Discord id, not Ann's Telegram one
    assert second.text == "⏰ Daily — due 10:30" and len(tg.calls) == 1


async def test_every_private_chat_refused_ends_failed_with_every_reason(
    ann: Core, pool: Pool, clock: FakeClock
) -> None:
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats({"9001": "Discord: DMs closed"})
    assert await engine(pool, clock, {"telegram": tg, "discord": dc}).tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "failed" and row["error"] == f"{BLOCKED_TEXT}; Discord: DMs closed"
    assert [m.chat_id for m in tg.calls + dc.calls] == ["100", "9001"]  # each tried once: no loop back


async def test_a_retry_goes_to_the_fallback_chat_only_once_with_its_note(
    ann: Core, pool: Pool, clock: FakeClock
) -> None:
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    dc.fail = 1  # the fallback send fails once (transient)
    eng = engine(pool, clock, {"telegram": tg, "discord": dc})
    assert await eng.tick() == 0
    row = await occurrence(pool)
    assert row["status"] == "claimed" and row["error"] == "ConnectionError: platform down"
    clock.now = row["lease_until"]
    assert await eng.tick() == 1
    assert len(tg.calls) == 1  # the retry does not ask the blocked chat again
    [sent] = dc.sent
    assert sent.chat_id == "9001" and sent.text.endswith(NOTE_TG)
    assert (await occurrence(pool))["status"] == "delivered"
    assert await eng.tick() == 0 and len(dc.sent) == 1


async def test_killed_before_the_move_the_next_process_falls_back_once(
    ann: Core, pool: Pool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock.advance(minutes=30)
    looking = asyncio.Event()

    async def stuck(*_: Any) -> None:
        looking.set()
        await asyncio.Event().wait()

    with monkeypatch.context() as m:
        m.setattr(queries, "fallback_chat", stuck)
        tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
        await killed(engine(pool, clock, {"telegram": tg, "discord": dc}, "a"), looking)  # between refusal and move
    assert (await occurrence(pool))["status"] == "claimed" and dc.calls == []
    assert await chat_of_task(pool) == ("telegram", "100")
    clock.advance(minutes=5)  # past the lease
    assert await engine(pool, clock, {"telegram": tg, "discord": dc}, "b").tick() == 1
    assert [m.chat_id for m in tg.calls] == ["100", "100"]  # refused again: nothing reached Telegram
    [sent] = dc.sent
    assert sent.text.endswith(NOTE_TG) and (await occurrence(pool))["status"] == "delivered"


@pytest.mark.parametrize("hold", ["before", "after"])
async def test_killed_during_the_fallback_send_the_next_process_sends_there_once(
    ann: Core, pool: Pool, clock: FakeClock, hold: str
) -> None:
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    dc.hold = hold  # the process dies before Discord has the reminder, or after (before it is recorded delivered)
    await killed(engine(pool, clock, {"telegram": tg, "discord": dc}, "a"), dc.held)
    assert await chat_of_task(pool) == ("discord", "9001")
    clock.advance(minutes=5)  # past the lease
    dc2 = Chats()
    assert await engine(pool, clock, {"telegram": tg, "discord": dc2}, "b").tick() == 1
    assert len(tg.calls) == 1  # the blocked chat is not asked again
    assert [m.chat_id for m in dc2.calls] == ["9001"] and dc2.calls[0].text.endswith(NOTE_TG)
    assert len(dc.sent) + len(dc2.sent) == 1  # in that chat exactly once
    row = await pool.fetchrow("SELECT status, platform_message_id FROM occurrences")
    assert row is not None and row["status"] == "delivered"


async def test_parts_sent_to_the_refused_chat_do_not_count_in_the_new_one(
    ann: Core, pool: Pool, clock: FakeClock
) -> None:
    # an agent job's answer: its first part reached Telegram, then the chat was blocked
    clock.advance(minutes=30)
    await pool.execute(
        "INSERT INTO occurrences (task_id, scheduled_at, claimed_by, lease_until, sent_parts, sent_text)"
        " VALUES (1, $1, 'dead', $1, 1, 'the answer')",
        clock.now,
    )
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    dc.hold = "before"  # and this process dies before Discord has any of it
    await killed(engine(pool, clock, {"telegram": tg, "discord": dc}, "a"), dc.held)
    assert tg.calls[0].sent_parts == 1 and dc.calls[0].sent_parts == 0
    clock.advance(minutes=5)
    dc2 = Chats()
    assert await engine(pool, clock, {"telegram": tg, "discord": dc2}, "b").tick() == 1
    [sent] = dc2.sent  # all of it, in the new chat
    assert sent.sent_parts == 0 and sent.text == f"the answer\n\n{NOTE_TG}"


async def test_the_most_recently_used_private_chat_is_chosen(
    ann: Core, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    await say(ann, fake_llm, platform="discord", user="2003", chat="9003", name="Al")  # another linked identity
    await link(pool, "discord", "2003", "telegram", "100")
    await pool.execute(
        "UPDATE turns SET started_at = started_at - interval '1 day' WHERE user_id <> (SELECT id"
        " FROM users WHERE platform_user_id = '2003')"
    )
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    assert await engine(pool, clock, {"telegram": tg, "discord": dc}).tick() == 1
    [sent] = dc.sent
    assert (sent.chat_id, sent.owner_id) == ("9003", "2003")
    await pool.execute(
        "UPDATE turns SET started_at = now() + interval '1 day' WHERE chat_id = (SELECT id FROM chats"
        " WHERE platform_chat_id = '9001')"
    )
    await pool.execute("UPDATE tasks SET chat_id = (SELECT id FROM chats WHERE platform_chat_id = '100')")
    clock.advance(days=1)
    assert await engine(pool, clock, {"telegram": tg, "discord": dc}).tick() == 1
    assert (dc.sent[1].chat_id, dc.sent[1].owner_id) == ("9001", "2001")


async def test_a_process_that_lost_its_claim_does_not_fall_back(
    ann: Core, pool: Pool, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock.advance(minutes=30)
    real, found = queries.fallback_chat, list[Any]()

    async def taken_meanwhile(pool_: Pool, *args: Any) -> Any:
        # this process stalled past its lease and another one claimed the occurrence
        await pool_.execute("UPDATE occurrences SET claimed_by = 'b'")
        found.append(await real(pool_, *args))
        return found[-1]

    monkeypatch.setattr(queries, "fallback_chat", taken_meanwhile)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    eng = engine(pool, clock, {"telegram": tg, "discord": dc}, "a")
    assert await eng.tick() == 0
    assert [c["platform_chat_id"] for c in found] == ["9001"] and eng.retries == eng.failed_deliveries == 0
    assert dc.calls == [] and await chat_of_task(pool) == ("telegram", "100")
    row = await occurrence(pool)
    assert row["status"] == "claimed" and row["error"] is None  # left to the process holding it


async def test_two_processes_at_once_deliver_the_fallback_once(ann: Core, pool: Pool, clock: FakeClock) -> None:
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    ticks = [engine(pool, clock, {"telegram": tg, "discord": dc}, name).tick() for name in "ab"]
    assert sum(await asyncio.gather(*ticks)) == 1
    assert len(tg.calls) == 1 and len(dc.sent) == 1


async def test_a_fallback_platform_another_process_runs_is_sent_by_that_process(
    ann: Core, pool: Pool, clock: FakeClock
) -> None:
    await pool.execute(
        "INSERT INTO processes (id, host, pid, version, adapters) VALUES ('b', 'h', 1, 'v', '{\"discord (@bot)\"}')"
    )
    clock.advance(minutes=30)
    tg, dc = Chats({"100": BLOCKED_TEXT}), Chats()
    assert await engine(pool, clock, {"telegram": tg}, "a").tick() == 0  # this process runs only Telegram
    row = await occurrence(pool)
    assert row["status"] == "claimed" and "no discord adapter is running" in row["error"]
    assert await chat_of_task(pool) == ("discord", "9001")
    clock.now = row["lease_until"]
    assert await engine(pool, clock, {"discord": dc}, "b").tick() == 1
    [sent] = dc.sent
    assert sent.chat_id == "9001" and sent.text.endswith(NOTE_TG) and len(tg.calls) == 1
