"""The Discord adapter through the real discord.py against the fake REST + gateway server."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.discord import FAILED, GONE, NOT_YOURS, TEXT_ONLY, DiscordAdapter
from core.commands import StatusBoard
from core.db import Pool
from core.reminders import ReminderEngine
from core.service import Core
from tests.conftest import FakeClock, MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply

ALICE, BOB, STRANGER = 2001, 2002, 3003  # Alice is an admin, Bob is allowed, the stranger is not


@pytest.fixture
async def dc() -> AsyncIterator[FakeDiscord]:
    """The fake Discord (REST + gateway)."""
    async with FakeDiscord() as fake:
        yield fake


class Bot:
    """A running Discord adapter and its fakes."""

    def __init__(self, dc: FakeDiscord, llm: FakeOpenAI, core: Core, pool: Pool) -> None:
        """Keep the pieces together."""
        self.dc, self.llm, self.core, self.pool = dc, llm, core, pool
        self.adapter = DiscordAdapter(core, core.settings, StatusBoard(), guild_ready_timeout=0.05)
        self.alice = dc.user(ALICE, "Alice")
        self.bob = dc.user(BOB, "Bob")

    async def restart(self) -> None:
        """Stop the client and start a brand-new one (as after a process restart)."""
        await self.adapter.stop()
        self.adapter = DiscordAdapter(self.core, self.core.settings, StatusBoard(), guild_ready_timeout=0.05)
        await self.adapter.start()

    async def say(self, text: str, *, author: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
        """Post a message and wait for one more bot message; return the new ones."""
        before = len(self.dc.sent)
        await self.dc.post_message(author or self.alice, text, **kw)
        await self.dc.wait_sent(before + 1)
        return self.dc.sent[before:]


@pytest.fixture
async def bot(dc: FakeDiscord, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool) -> AsyncIterator[Bot]:
    """The real adapter, started against the fake; `other_channel_id` is a listen-to-everything channel."""
    core = make_core(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        DISCORD_CHANNELS=str(dc.other_channel_id),
        ADMINS=f"discord:{ALICE}",
        ALLOWED_USERS=f"discord:{BOB}",
        DEFAULT_TIMEZONE="Europe/Berlin",
    )
    b = Bot(dc, fake_llm, core, pool)
    await b.adapter.start()
    try:
        yield b
    finally:
        await b.adapter.stop()


def create_task_script(llm: FakeOpenAI, title: str = "Call mum", due: str = "2026-11-21T11:30") -> None:
    """The model creates a task, then answers."""
    llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": title, "due_at": due})]),
        Reply(text="Will do — I'll remind you at 11:30."),
    )


def button_ids(message: dict[str, Any]) -> list[str]:
    """The custom ids of a message's buttons."""
    return [c["custom_id"] for row in message.get("components") or [] for c in row["components"]]


async def test_guild_mention_round_trip_with_tool_call_and_steps_button(bot: Bot) -> None:
    create_task_script(bot.llm)
    [sent] = await bot.say("remind me to call mum at 11:30", mention_bot=True)
    posted_id = bot.dc.messages_in(bot.dc.channel_id)[0]["id"]
    assert sent["channel_id"] == str(bot.dc.channel_id)
    lines = sent["content"].split("\n")
    assert lines[0] == "Will do — I'll remind you at 11:30."
    assert re.fullmatch(r"-# 🔧 1 step · \d+\.\d s", lines[-1])
    turn_id = await bot.pool.fetchval("SELECT id FROM turns")
    assert button_ids(sent) == [f"steps:{turn_id}"]
    assert sent["message_reference"]["message_id"] == posted_id  # replies to the author …
    assert sent["allowed_mentions"] == {"parse": [], "replied_user": True}  # … pinging nobody else
    assert str(bot.dc.channel_id) in {str(c) for c in bot.dc.typing}
    # the shared channel conversation attributes the message to its author, without the mention
    assert bot.llm.requests[0]["messages"][-1]["content"] == "Alice: remind me to call mum at 11:30"
    assert await bot.pool.fetchval("SELECT title FROM tasks") == "Call mum"


async def test_unmentioned_own_and_other_bots_messages_are_ignored(bot: Bot) -> None:
    await bot.dc.post_message(bot.alice, "just chatting, not to the bot")
    await bot.dc.post_message(bot.dc.bot_user, "my own message", mention_bot=True)
    await bot.dc.post_message(bot.dc.user(4004, "OtherBot", bot=True), "hey bot", mention_bot=True)
    bot.llm.script(Reply(text="hello Bob"))
    [sent] = await bot.say("hi there", author=bot.bob, mention_bot=True)
    assert sent["content"] == "hello Bob"
    assert len(bot.llm.requests) == 1
    assert [m["content"] for m in bot.llm.requests[0]["messages"][1:]] == ["Bob: hi there"]


async def test_reply_to_the_bot_and_listed_channel_need_no_mention(bot: Bot) -> None:
    bot.llm.script(Reply(text="first"), Reply(text="second"), Reply(text="third"))
    [first] = await bot.say("hello", mention_bot=True)
    [second] = await bot.say("and another thing", reply_to=first)
    assert second["content"] == "second"
    [third] = await bot.say("anyone?", channel_id=bot.dc.other_channel_id)
    assert third["content"] == "third" and third["channel_id"] == str(bot.dc.other_channel_id)


async def test_thread_answer_stays_in_the_thread(bot: Bot) -> None:
    bot.llm.script(Reply(text="in the thread"))
    [sent] = await bot.say("question", channel_id=bot.dc.thread_id, mention_bot=True)
    assert sent["channel_id"] == str(bot.dc.thread_id)
    row = await bot.pool.fetchrow("SELECT platform_chat_id, thread_id FROM chats")
    assert row is not None
    assert (row["platform_chat_id"], row["thread_id"]) == (str(bot.dc.channel_id), str(bot.dc.thread_id))


async def test_dm_round_trip(bot: Bot) -> None:
    bot.llm.script(Reply(text="Hi Alice, how can I help?"))
    [sent] = await bot.say("hello", dm=True)
    assert sent["channel_id"] == str(bot.dc.dm_channel_id(ALICE))
    assert sent["content"] == "Hi Alice, how can I help?"
    assert not sent.get("message_reference")
    assert bot.llm.requests[0]["messages"][-1]["content"] == "hello"  # no name prefix in a DM


async def test_long_answer_with_code_block_is_split_without_breaking_the_fence(bot: Bot) -> None:
    code = "\n".join(f"print('line {i:03d} of a long program')" for i in range(150))
    text = f"Here is the script:\n\n```python\n{code}\n```\n\nRun it with `python script.py`."
    assert len(text) > 5000
    bot.llm.script(Reply(text=text))
    before = len(bot.dc.sent)
    await bot.dc.post_message(bot.alice, "write me a script", dm=True)
    await bot.dc.wait_sent(before + 3)
    parts = [m["content"] for m in bot.dc.sent[before:]]
    assert len(parts) == 3 and all(len(p) <= 2000 for p in parts)
    for p in parts:
        assert sum(1 for line in p.split("\n") if line.startswith("```")) % 2 == 0, "every part closes its fences"
    assert parts[1].startswith("```python\n") and parts[2].startswith("```python\n")
    # nothing lost or reordered: removing the inserted fences gives the original text back
    rebuilt = "\n".join(parts).replace("\n```\n```python\n", "\n")
    assert rebuilt == text


async def test_show_steps_after_restart_only_to_the_presser(bot: Bot) -> None:
    create_task_script(bot.llm)
    [sent] = await bot.say("remind me to call mum at 11:30", mention_bot=True)
    await bot.restart()  # a new client: the button must still work (persistent, steps from PostgreSQL)
    [custom_id] = button_ids(sent)
    pressed = await bot.dc.click(sent, custom_id, bot.alice)
    await pressed.wait_done()
    assert pressed.ephemeral
    [text] = pressed.texts()
    assert "🔧 1 step" in text and "manage\\_tasks create" in text and "Call mum" in text
    other = await bot.dc.click(sent, custom_id, bot.bob)
    await other.wait_done()
    assert other.ephemeral and other.texts() == [NOT_YOURS]
    await bot.pool.execute("DELETE FROM turns")  # the turn no longer exists: the button says so
    gone = await bot.dc.click(sent, custom_id, bot.alice)
    await gone.wait_done()
    assert gone.ephemeral and gone.texts() == [GONE]


async def test_show_steps_in_a_dm_toggles_in_place(bot: Bot) -> None:
    create_task_script(bot.llm)
    [sent] = await bot.say("remind me to call mum at 11:30", dm=True)
    [custom_id] = button_ids(sent)
    shown = await bot.dc.click(sent, custom_id, bot.alice, dm=True)
    await shown.wait_done()
    assert shown.responses[0]["type"] == 7  # the message itself is updated
    message = bot.dc.message(sent["id"])
    assert message["content"].startswith(sent["content"]) and "manage\\_tasks create" in message["content"]
    assert button_ids(message) == [f"{custom_id}:shown"]
    hidden = await bot.dc.click(message, f"{custom_id}:shown", bot.alice, dm=True)
    await hidden.wait_done()
    message = bot.dc.message(sent["id"])
    assert message["content"] == sent["content"] and button_ids(message) == [custom_id]


async def test_slash_tasks_and_commands_synced_only_when_changed(bot: Bot) -> None:
    create_task_script(bot.llm)
    await bot.say("remind me to call mum at 11:30", mention_bot=True)
    it = await bot.dc.slash("tasks", None, bot.alice)
    await it.wait_done()
    [text] = it.texts()
    assert "Call mum" in text and "Europe/Berlin" in text and it.ephemeral
    assert {c["name"] for c in bot.dc.commands} >= {"ask", "tasks", "timezone", "reset", "status"}
    assert bot.dc.command_puts == 1
    await bot.restart()
    await bot.dc.reconnect()
    await bot.dc.wait_ready()
    assert bot.dc.command_puts == 1  # unchanged set: not uploaded again


async def test_slash_ask_timezone_status_reset(bot: Bot) -> None:
    bot.llm.script(Reply(text="Answer to the slash command"))
    it = await bot.dc.slash("ask", {"message": "what's up?"}, bot.bob)
    await it.wait_done()
    assert it.responses[0]["type"] == 5 and it.texts() == ["Answer to the slash command"]
    assert bot.llm.requests[0]["messages"][-1]["content"] == "Bob: what's up?"
    tz = await bot.dc.slash("timezone", {"zone": "Asia/Tokyo"}, bot.bob)
    await tz.wait_done()
    assert "Asia/Tokyo" in tz.texts()[0]
    status = await bot.dc.slash("status", None, bot.bob)
    await status.wait_done()
    assert "discord (assistant" in status.texts()[0] and status.ephemeral
    reset = await bot.dc.slash("reset", None, bot.bob)
    await reset.wait_done()
    assert reset.texts() == ["Fresh start — I've put our earlier conversation aside."] and not reset.ephemeral
    bot.llm.script(Reply(text="fresh"))
    again = await bot.dc.slash("ask", {"message": "hello?"}, bot.bob)
    await again.wait_done()
    assert [m["content"] for m in bot.llm.requests[-1]["messages"][1:]] == ["Bob: hello?"]  # history was reset


async def test_reminder_delivered_to_guild_channel_with_owner_only_buttons(bot: Bot, clock: FakeClock) -> None:
    create_task_script(bot.llm)
    await bot.say("remind me to call mum at 11:30", mention_bot=True)
    engine = ReminderEngine(bot.pool, {"discord": bot.adapter}, clock)
    clock.advance(minutes=30)  # 11:30 in Berlin
    before = len(bot.dc.sent)
    assert await engine.tick() == 1
    reminder = bot.dc.sent[before]
    assert reminder["channel_id"] == str(bot.dc.channel_id)
    assert reminder["content"] == f"<@{ALICE}> ⏰ Call mum — due 11:30"
    assert [str(u) for u in reminder["allowed_mentions"]["users"]] == [str(ALICE)]
    task_id = await bot.pool.fetchval("SELECT id FROM tasks")
    assert button_ids(reminder) == [f"rem:done:{task_id}", f"rem:snooze10:{task_id}", f"rem:snooze60:{task_id}"]
    refused = await bot.dc.click(reminder, f"rem:done:{task_id}", bot.bob)
    await refused.wait_done()
    assert refused.ephemeral and "Only the person" in refused.texts()[0]
    assert await bot.pool.fetchval("SELECT status FROM tasks") == "pending"
    done = await bot.dc.click(reminder, f"rem:done:{task_id}", bot.alice)
    await done.wait_done()
    assert done.responses[0]["type"] == 7
    assert await bot.pool.fetchval("SELECT status FROM tasks") == "done"
    edited = bot.dc.message(reminder["id"])
    assert edited["content"].startswith(reminder["content"]) and button_ids(edited) == []


async def test_not_allowed_user_refused_once_with_id(bot: Bot) -> None:
    stranger = bot.dc.user(STRANGER, "Stranger")
    [sent] = await bot.say("hello", author=stranger, mention_bot=True)
    assert f"discord id is {STRANGER}" in sent["content"] and f"discord:{STRANGER}" in sent["content"]
    await bot.dc.post_message(stranger, "hello??", mention_bot=True)  # refused once: no second refusal
    bot.llm.script(Reply(text="hi Bob"))
    [reply] = await bot.say("hi", author=bot.bob, mention_bot=True)
    assert reply["content"] == "hi Bob"
    it = await bot.dc.slash("tasks", None, stranger)
    await it.wait_done()
    assert it.ephemeral and f"discord:{STRANGER}" in it.texts()[0]
    assert len(bot.llm.requests) == 1  # only Bob's message reached the model


async def test_attachment_without_text_gets_text_only(bot: Bot) -> None:
    attachment = {"id": "1", "filename": "cat.png", "size": 10, "url": "http://x/cat.png", "proxy_url": "http://x"}
    [sent] = await bot.say("", mention_bot=True, attachments=[attachment])
    assert sent["content"] == TEXT_ONLY
    assert bot.llm.requests == []


async def test_gateway_reconnect_and_resume_keep_answering(bot: Bot) -> None:
    await bot.dc.reconnect()
    await bot.dc.wait_ready()
    bot.llm.script(Reply(text="still here"))
    [sent] = await bot.say("are you there?", mention_bot=True)
    assert sent["content"] == "still here"
    assert bot.dc.identify_count == 1 and bot.dc.resume_count == 1


async def test_rate_limited_send_is_retried(bot: Bot) -> None:
    bot.dc.rate_limit_next("/messages")
    bot.llm.script(Reply(text="after the rate limit"))
    [sent] = await bot.say("hi", dm=True)
    assert sent["content"] == "after the rate limit"


async def test_database_hiccup_goes_through_the_error_funnel(bot: Bot, allowed_errors: list[str]) -> None:
    allowed_errors.append("Discord message handler failed")
    allowed_errors.append("Discord interaction failed")
    create_task_script(bot.llm)
    [sent] = await bot.say("remind me to call mum at 11:30", mention_bot=True)
    await bot.pool.execute("ALTER TABLE turns RENAME TO turns_away")
    [failed] = await bot.say("hello again", mention_bot=True)
    assert failed["content"] == FAILED
    pressed = await bot.dc.click(sent, button_ids(sent)[0], bot.alice)
    await pressed.wait_done()
    assert pressed.ephemeral and pressed.texts() == [FAILED]


async def test_without_the_message_content_intent_mentions_and_dms_still_work(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeDiscord(enabled_intents=0) as dc:  # the portal switch is off
        core = make_core(
            DISCORD_BOT_TOKEN=dc.token, DISCORD_API_BASE_URL=dc.api_base, DISCORD_GATEWAY_URL=dc.gateway_url,
            ALLOWED_USERS="*",
        )  # fmt: skip
        b = Bot(dc, fake_llm, core, pool)
        await b.adapter.start()
        try:
            assert "Message Content intent" in caplog.text
            fake_llm.script(Reply(text="heard you"), Reply(text="in private"))
            [sent] = await b.say("ping", mention_bot=True)
            assert sent["content"] == "heard you"
            [dm] = await b.say("secret", dm=True)
            assert dm["content"] == "in private"
            assert fake_llm.requests[0]["messages"][-1]["content"] == "Alice: ping"
        finally:
            await b.adapter.stop()
