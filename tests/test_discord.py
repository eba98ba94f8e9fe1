"""The Discord adapter through the real discord.py against the fake REST + gateway server."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import discord
import pytest
import yarl

from adapters.discord.adapter import DiscordAdapter
from adapters.discord.limits import DISCORD_IDENTIFY_SPACING_S, DISCORD_READY_TIMEOUT_S
from core import CUT_SHORT, FAILED, TEXT_ONLY
from core.front_door import Core
from core.reminders.engine import DeliveryRefused, ReminderEngine
from core.reminders.messages import ReminderMessage
from core.settings import EXIT_CONFIG, EXIT_UNREACHABLE, SettingsError, StartupError
from core.storage.db import Pool
from core.texts import RESTARTING, STEPS_GONE, STEPS_NOT_YOURS
from core.types import Incoming
from tests.conftest import FakeClock, MakeCore, MakeSettings
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply

ALICE, BOB, STRANGER = 2001, 2002, 3003  # Alice is an admin, Bob is allowed, the stranger is not


class Bot:
    """A running Discord adapter and its fakes."""

    def __init__(self, dc: FakeDiscord, llm: FakeOpenAI, core: Core, pool: Pool) -> None:
        """Keep the pieces together."""
        self.dc, self.llm, self.core, self.pool = dc, llm, core, pool
        self.adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
        self.alice = dc.user(ALICE, "Alice")
        self.bob = dc.user(BOB, "Bob")

    async def restart(self) -> None:
        """Stop the client and start a brand-new one (as after a process restart)."""
        await self.adapter.stop()
        self.adapter = DiscordAdapter(self.core, self.core.settings, guild_ready_timeout=0.05)
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
    assert sent["allowed_mentions"] == {"parse": []} and sent["mentions"] == []  # … pinging nobody, not even them
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
    assert other.ephemeral and other.texts() == [STEPS_NOT_YOURS]
    stranger = await bot.dc.click(sent, custom_id, bot.dc.user(STRANGER, "Stranger"))
    await stranger.wait_done()
    assert stranger.ephemeral and f"discord:{STRANGER}" in stranger.texts()[0]
    await bot.pool.execute("DELETE FROM turns")  # the turn no longer exists: the button says so
    gone = await bot.dc.click(sent, custom_id, bot.alice)
    await gone.wait_done()
    assert gone.ephemeral and gone.texts() == [STEPS_GONE]


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
    assert {c["name"] for c in bot.dc.commands} >= {"ask", "tasks", "timezone", "memory", "reset", "status"}
    assert bot.dc.command_puts == 1
    await bot.restart()
    await bot.dc.reconnect()
    await bot.dc.wait_ready()
    assert bot.dc.command_puts == 1  # unchanged set: not uploaded again


async def test_slash_remind_with_when_and_what_and_an_undo_only_its_owner_can_press(bot: Bot) -> None:
    made = await (
        await bot.dc.slash("remind", {"when": "demain 9h", "what": "Boulangerie"}, bot.bob, locale="fr")
    ).wait_done()
    task_id = await bot.pool.fetchval("SELECT id FROM tasks")
    assert made.texts() == [f"⏰ #{task_id} Boulangerie — Sun 22 Nov 09:00 CET"] and not made.ephemeral
    assert made.message is not None and button_ids(made.message) == [f"rem:undo:{task_id}"]
    refused = await (await bot.dc.click(made.message, f"rem:undo:{task_id}", bot.alice)).wait_done()
    assert refused.ephemeral and "Only the person" in refused.texts()[0]
    undone = await (await bot.dc.click(made.message, f"rem:undo:{task_id}", bot.bob)).wait_done()
    assert undone.responses[0]["type"] == 7 and f"↩️ Undone: #{task_id} Boulangerie is deleted." in undone.texts()[0]
    assert await bot.pool.fetchval("SELECT count(*) FROM tasks") == 0
    vague = await (await bot.dc.slash("remind", {"when": "tomorrow", "what": "Bread"}, bot.bob)).wait_done()
    assert vague.texts() == ["“tomorrow” needs a time of day too, e.g. /remind tomorrow 9:00 Bread"]
    repeating = await (
        await bot.dc.slash("remind", {"when": "every monday 10:00", "what": "Standup"}, bot.bob)
    ).wait_done()
    assert "Standup — Mon 23 Nov 10:00 CET 🔁 every mon at 10:00" in repeating.texts()[0]
    assert bot.llm.requests == []


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
    # an image of a type the core does not read (a PNG is a photo: test_media_photos_stickers.py)
    attachment = {"id": "1", "filename": "cat.svg", "size": 10, "url": "http://x/cat.svg", "proxy_url": "http://x"}
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
    assert bot.core.status_board.adapters["discord"].endswith("in 1 server(s)")  # /status: connected again


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
            DISCORD_BOT_TOKEN=dc.token,
            DISCORD_API_BASE_URL=dc.api_base,
            DISCORD_GATEWAY_URL=dc.gateway_url,
            ALLOWED_USERS="*",
        )
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


# ---- issue 10: no pings, shutdown drain, a gateway that dies, per-client endpoints, refusals, start-up ----


def content_payloads(dc: FakeDiscord) -> list[tuple[str, str, dict[str, Any]]]:
    """Every REST body that sends or edits message content (interaction callbacks: their data)."""
    found = []
    for method, path, body in dc.requests:
        data = body.get("data") if isinstance(body, dict) and path.endswith("/callback") else body
        if isinstance(data, dict) and "content" in data:
            found.append((method, path, data))
    return found


async def test_no_send_pings_anyone_but_a_reminder_its_owner(bot: Bot, clock: FakeClock) -> None:
    owner = bot.dc.owner["id"]  # a known guild member: a ping of them would show in the message's mentions
    create_task_script(bot.llm)
    [answer] = await bot.say("remind me to call mum at 11:30", mention_bot=True)  # a reply in the guild
    create_task_script(bot.llm, "Water plants", "2026-11-21T11:30")
    await bot.say("remind me to water the plants at 11:30", dm=True)
    bot.llm.script(Reply(text=f"Hello @everyone, @here and <@{owner}> — " + "long " * 500))  # two parts
    before = len(bot.dc.sent)
    await bot.dc.post_message(bot.alice, "say hi to everyone", mention_bot=True)
    pinged = await bot.dc.wait_sent(before + 2)
    bot.llm.script(Reply(status=400, text="This model's maximum context length is 4096 tokens"))
    await bot.say("a turn that ends in an error", mention_bot=True)
    await bot.say("hello", author=bot.dc.user(STRANGER, "Stranger"), mention_bot=True)  # the refusal
    bot.llm.script(Reply(text=f"an /ask answer for <@{owner}>"))
    for name, options, who in [
        ("ask", {"message": "ping them"}, bot.bob),
        ("status", None, bot.bob),
        ("reset", None, bot.bob),
        ("tasks", None, bot.dc.user(STRANGER, "Stranger")),
    ]:
        await (await bot.dc.slash(name, options, who)).wait_done()
    for who in (bot.alice, bot.bob):  # Show steps: the steps, and "only the person who asked"
        await (await bot.dc.click(answer, button_ids(answer)[0], who)).wait_done()
    engine = ReminderEngine(bot.pool, {"discord": bot.adapter}, clock)
    clock.advance(minutes=30)
    before = len(bot.dc.sent)
    assert await engine.tick() == 2
    reminders = (await bot.dc.wait_sent(before + 2))[before:]
    assert all(m["mention_everyone"] is False for m in pinged[-2:])

    payloads = content_payloads(bot.dc)
    owner_pings = [p for _, _, p in payloads if p.get("allowed_mentions", {}).get("users")]
    others = [(m, path, p) for m, path, p in payloads if not p.get("allowed_mentions", {}).get("users")]
    assert len(others) >= 12, others
    assert [(m, path) for m, path, p in others if p.get("allowed_mentions") != {"parse": []}] == []
    assert [p["allowed_mentions"] for p in owner_pings] == [{"parse": [], "users": [ALICE]}]
    assert {tuple(sorted(m.get("allowed_mentions", {}))) for m in reminders} == {("parse",), ("parse", "users")}
    assert all(m["mentions"] == [] for m in bot.dc.sent[:before])  # nobody was notified by an answer


async def test_stop_lets_a_running_answer_finish_and_turns_new_messages_away(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, dc: FakeDiscord
) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(body: dict[str, Any]) -> Reply:
        started.set()
        await release.wait()
        return Reply(text="the slow answer")

    core = make_core(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        ALLOWED_USERS="*",
        SHUTDOWN_GRACE_SECONDS=30,
    )
    b = Bot(dc, fake_llm, core, pool)
    await b.adapter.start()
    fake_llm.script(slow)
    await dc.post_message(b.alice, "take your time", dm=True)
    await asyncio.wait_for(started.wait(), 5)
    stopping = asyncio.create_task(b.adapter.stop())
    await asyncio.sleep(0)  # stop() runs up to its wait for the running answer
    assert b.adapter.running.stopping and not stopping.done()
    [late] = await b.say("one more thing", author=b.bob, dm=True)  # arrives while draining: not taken
    assert late["content"] == RESTARTING and len(fake_llm.requests) == 1
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert [m["content"] for m in dc.sent] == [RESTARTING, "the slow answer"]
    assert not dc.connected


async def test_stop_cuts_an_answer_that_outlasts_the_grace(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, dc: FakeDiscord
) -> None:
    started = asyncio.Event()

    async def never(body: dict[str, Any]) -> Reply:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    core = make_core(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        ALLOWED_USERS="*",
        SHUTDOWN_GRACE_SECONDS=0.05,
    )
    b = Bot(dc, fake_llm, core, pool)
    await b.adapter.start()
    fake_llm.script(never)
    await dc.post_message(b.alice, "this will take forever", mention_bot=True)
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(b.adapter.stop(), 5)  # bounded by the grace (plus the short note), never hangs
    assert [m["content"] for m in dc.sent] == [CUT_SHORT]
    assert dc.sent[0]["allowed_mentions"] == {"parse": []}
    assert b.adapter.running.tasks == set() and not dc.connected


class Pauses:
    """An injectable sleep for the reconnection pauses: records them and waits until released."""

    def __init__(self) -> None:
        """Nothing paused yet."""
        self.delays: list[float] = []
        self.paused = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        """Record a pause and wait until the test releases it."""
        self.delays.append(seconds)
        self.paused.set()
        await self.go.wait()
        self.go.clear()


@pytest.mark.parametrize("death", ["fatal close code", "gateway task crashes"])
async def test_a_gateway_that_dies_after_ready_is_replaced_and_status_says_so(
    death: str, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, dc: FakeDiscord, allowed_errors: list[str]
) -> None:
    allowed_errors += ["Discord connection lost", "Discord gateway task failed"]
    core = make_core(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        ALLOWED_USERS="*",
    )
    pauses = Pauses()
    board = core.status_board
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05, sleep=pauses)
    await adapter.start()
    try:
        assert board.adapters["discord"].endswith("in 1 server(s)")
        first_client = adapter.client
        if death == "fatal close code":
            await dc.disconnect(4004)  # discord.py does not reconnect after this: connect() raises
            why = "the gateway closed the connection with code 4004"
        else:
            await dc.dispatch("MESSAGE_CREATE", {"id": "1"})  # a parser error escapes connect() and ends its task
            why = "KeyError"
        await asyncio.wait_for(pauses.paused.wait(), 5)
        status = await core.command(Incoming(platform="discord", user_id=str(BOB), chat_id="1", text=""), "status")
        assert isinstance(status, str)
        assert f"discord (disconnected since 2026-11-21 10:00 UTC: {why}" in status, status
        assert await core.not_ready(["discord"]) == "discord: disconnected"  # /readyz: 503 meanwhile
        assert first_client.is_closed() and pauses.delays == [2.0]
        pauses.go.set()
        await dc.wait_ready()
        await asyncio.wait_for(adapter.client.wait_until_ready(), 5)
        await asyncio.sleep(0)  # the on_ready task was scheduled together with that wake-up
        assert board.adapters["discord"].endswith("in 1 server(s)")
        assert await core.not_ready(["discord"]) is None
        assert adapter.client is not first_client and dc.identify_count == 2
        fake_llm.script(Reply(text="back again"))
        before = len(dc.sent)
        await dc.post_message(dc.user(BOB, "Bob"), "are you back?", dm=True)
        assert (await dc.wait_sent(before + 1))[-1]["content"] == "back again"
    finally:
        await adapter.stop()
    assert "discord" not in board.adapters


async def test_endpoints_are_per_client_and_discord_py_class_attributes_stay_untouched(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, dc: FakeDiscord
) -> None:
    base, gateway = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    assert base.startswith("https://discord.com/") and gateway == yarl.URL("wss://gateway.discord.gg/")
    async with FakeDiscord() as other_dc:  # two bots in one process, each on its own Discord
        bots = []
        for fake in (dc, other_dc):
            core = make_core(
                DISCORD_BOT_TOKEN=fake.token,
                DISCORD_API_BASE_URL=fake.api_base,
                DISCORD_GATEWAY_URL=fake.gateway_url,
                ALLOWED_USERS="*",
            )
            bots.append(Bot(fake, fake_llm, core, pool))
            await bots[-1].adapter.start()
        try:
            assert discord.http.Route.BASE == base and discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY == gateway
            fake_llm.script(Reply(text="from the first"), Reply(text="from the second"))
            for b in bots:
                [sent] = await b.say("hi", dm=True)
                assert sent["content"] == ("from the first" if b.dc is dc else "from the second")
            it = await other_dc.slash("status", None, bots[1].bob)  # interaction answers: the webhook adapter
            await it.wait_done()
            assert it.ephemeral and "Status" in it.texts()[0]
            assert [len(dc.sent), len(other_dc.sent)] == [1, 1]
        finally:
            for b in bots:
                await b.adapter.stop()


def _reminder(chat_id: str, kind: str = "group") -> ReminderMessage:
    """A reminder for Alice in a channel."""
    return ReminderMessage(
        task_id=1,
        scheduled_at=datetime(2026, 11, 21, 10, 30, tzinfo=UTC),
        platform="discord",
        chat_id=chat_id,
        thread_id="",
        chat_kind=kind,
        owner_id=str(ALICE),
        owner_name="Alice",
        text="⏰ Call mum",
    )


@pytest.mark.parametrize(
    ("status", "code", "text", "reason"),
    [
        (403, 50001, "Missing Access", "no access"),
        (403, 50013, "Missing Permissions", "lacks permission"),
        (403, 50007, "Cannot send messages to this user", "does not accept direct messages"),
    ],
)
async def test_a_permanently_refused_reminder_raises_delivery_refused(
    bot: Bot, status: int, code: int, text: str, reason: str
) -> None:
    bot.dc.fail_next("/messages", status, code, text)
    with pytest.raises(DeliveryRefused, match=reason) as refused:
        await bot.adapter.send_reminder(_reminder(str(bot.dc.channel_id)))
    assert str(code) in str(refused.value)


async def test_reminder_to_a_deleted_channel_is_refused_other_failures_are_transient(bot: Bot) -> None:
    with pytest.raises(DeliveryRefused, match="no longer exists"):
        await bot.adapter.send_reminder(_reminder("1099511627776"))  # Unknown Channel (10003)
    bot.dc.fail_next("/messages", 503, 0, "upstream connect error")
    with pytest.raises(discord.DiscordServerError):
        await bot.adapter.send_reminder(_reminder(str(bot.dc.channel_id)))
    bot.dc.fail_next("/messages", 403, 20001, "Bots cannot use this endpoint")  # a 403 that is not a refusal
    with pytest.raises(discord.Forbidden):
        await bot.adapter.send_reminder(_reminder(str(bot.dc.channel_id)))
    assert await bot.adapter.send_reminder(_reminder(str(bot.dc.channel_id))) is not None  # and then it works


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_start_with_a_rejected_token_is_one_line_naming_the_variable(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, dc: FakeDiscord
) -> None:
    secret = "MTA4-not-the-right-token.Gx1234.abcdefghijklmnopqrstuvwxyz"
    core = make_core(DISCORD_BOT_TOKEN=secret, DISCORD_API_BASE_URL=dc.api_base, DISCORD_GATEWAY_URL=dc.gateway_url)
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    with pytest.raises(StartupError) as failed:
        await adapter.start()
    line = str(failed.value)
    assert line.startswith("DISCORD_BOT_TOKEN: rejected by Discord at ") and secret not in line and "\n" not in line
    assert failed.value.__cause__ is None and failed.value.__suppress_context__  # no traceback chain to print
    assert failed.value.exit_code == EXIT_CONFIG
    assert adapter.client.is_closed() and dc.gateway_connections == []


@pytest.mark.parametrize("down", ["api", "gateway"])
async def test_start_with_discord_unreachable_is_one_line_naming_the_host(
    down: str, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, dc: FakeDiscord
) -> None:
    port = _closed_port()
    api = f"http://127.0.0.1:{port}/api/v10" if down == "api" else dc.api_base
    gateway = f"ws://127.0.0.1:{port}/" if down == "gateway" else dc.gateway_url
    core = make_core(DISCORD_BOT_TOKEN=dc.token, DISCORD_API_BASE_URL=api, DISCORD_GATEWAY_URL=gateway)
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    with pytest.raises(StartupError) as failed:
        await asyncio.wait_for(adapter.start(), 10)  # at once: no minute of retries before READY_TIMEOUT_S
    line = str(failed.value)
    assert f"cannot reach the {'API' if down == 'api' else 'gateway'} at 127.0.0.1:{port}" in line, line
    assert ("DISCORD_API_BASE_URL" if down == "api" else "DISCORD_GATEWAY_URL") in line and "\n" not in line
    assert dc.token not in line and failed.value.__cause__ is None and failed.value.exit_code == EXIT_UNREACHABLE
    assert adapter.client.is_closed() and adapter.gateway.runner is None


async def alice_remembers(bot: Bot) -> int:
    """Alice has two lines in [human] and one archival entry; returns her user id."""
    from tests.test_memory_command import remember

    alice = Incoming(platform="discord", user_id=str(ALICE), chat_id="dm", text="", user_name="Alice")
    return await remember(bot.core, alice, ["Name: Alice", "Works at: Google"], ["likes oat milk"])


async def test_slash_memory_is_ephemeral_per_person_and_forgets_a_line(bot: Bot) -> None:
    await alice_remembers(bot)
    it = await (await bot.dc.slash("memory", None, bot.alice)).wait_done()
    [text] = it.texts()
    assert it.ephemeral and "1: Name: Alice" in text and "2: Works at: Google" in text
    assert "Archival memory: 1 entry" in text
    other = await (await bot.dc.slash("memory", None, bot.bob)).wait_done()
    assert other.ephemeral and "Alice" not in other.texts()[0] and "Google" not in other.texts()[0]
    forgot = await (
        await bot.dc.slash("memory", {"action": "forget", "block": "human", "line": 2}, bot.alice)
    ).wait_done()
    assert forgot.ephemeral and forgot.texts() == ["Forgot line 2 of [human]: “Works at: Google”."]
    bad = await (await bot.dc.slash("memory", {"action": "forget", "block": "human", "line": 5}, bot.alice)).wait_done()
    assert bad.texts() == ["line 5 does not exist in [human]; valid lines: 1-1"]
    assert bot.llm.requests == []
    stranger = await (await bot.dc.slash("memory", None, bot.dc.user(STRANGER, "Stranger"))).wait_done()
    assert stranger.ephemeral and f"discord:{STRANGER}" in stranger.texts()[0] and "Alice" not in stranger.texts()[0]


async def test_slash_memory_wipe_asks_and_only_its_person_can_confirm(bot: Bot) -> None:
    alice = await alice_remembers(bot)
    ask = await (await bot.dc.slash("memory", {"action": "wipe"}, bot.alice)).wait_done()
    assert ask.ephemeral and "2 lines and 1 archival entry" in ask.texts()[0] and "confirm:True" in ask.texts()[0]
    assert ask.message is not None and button_ids(ask.message) == [f"mem:wipe:{ALICE}"]
    refused = await (await bot.dc.click(ask.message, f"mem:wipe:{ALICE}", bot.bob)).wait_done()
    assert refused.ephemeral and "not for you" in refused.texts()[0]
    assert await bot.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", alice) == 1
    done = await (await bot.dc.click(ask.message, f"mem:wipe:{ALICE}", bot.alice)).wait_done()
    assert done.responses[0]["type"] == 7 and "I erased 2 lines and 1 archival entry" in done.texts()[0]
    assert await bot.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", alice) == 0
    assert await bot.pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", alice) == 0
    bob = await (await bot.dc.slash("memory", {"action": "wipe", "confirm": True}, bot.bob)).wait_done()
    assert bob.ephemeral and bob.texts()[0].startswith("Done — I erased 0 lines and 0 archival entries.")
    assert bob.message is not None and button_ids(bob.message) == []


async def test_two_processes_split_two_shards_only_shard_0_syncs_and_each_message_is_answered_once(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool
) -> None:
    """DISCORD_SHARD_COUNT=2 with ids 0 and 1 in two "processes" (cores + adapters) on one fake Discord whose
    guild shard 1 owns: each identifies as its shard, only shard 0 uploads the slash commands, the guild's
    message reaches (and is answered by) shard 1 alone, a DM shard 0 alone."""
    async with FakeDiscord(guild_shard=(1, 2)) as dc:
        common = dict(
            DISCORD_BOT_TOKEN=dc.token,
            DISCORD_API_BASE_URL=dc.api_base,
            DISCORD_GATEWAY_URL=dc.gateway_url,
            DISCORD_SHARD_COUNT="2",
        )
        core0, core1 = make_core(**common, DISCORD_SHARD_IDS="0"), make_core(**common, DISCORD_SHARD_IDS="1")
        one = DiscordAdapter(core1, core1.settings, guild_ready_timeout=0.05)
        zero = DiscordAdapter(core0, core0.settings, guild_ready_timeout=0.05)
        try:
            assert one.ready_timeout == zero.ready_timeout == DISCORD_READY_TIMEOUT_S  # one shard each
            await one.start()  # first: had it synced, shard 0 would find the commands equal and upload nothing
            assert dc.identified_shards == [[1, 2]] and dc.command_puts == 0
            assert not [r for r in dc.requests if "/commands" in r[1]]
            await zero.start()
            assert dc.identified_shards == [[1, 2], [0, 2]] and dc.command_puts == 1
            assert {c["name"] for c in dc.commands} >= {"ask", "tasks", "status"}
            assert core1.status_board.adapters["discord"] == "assistant in 1 server(s), shards 1 of 2"
            assert core0.status_board.adapters["discord"] == "assistant in 0 server(s), shards 0 of 2"
            asking = Incoming(platform="discord", user_id=str(ALICE), chat_id="1", text="")
            status = await core1.command(asking, "status")
            assert isinstance(status, str) and "discord (assistant in 1 server(s), shards 1 of 2)" in status, status
            alice = dc.user(ALICE, "Alice")
            fake_llm.script(Reply(text="from the guild's shard"), Reply(text="from shard 0"))
            await dc.post_message(alice, "hello in the guild", mention_bot=True)
            await dc.wait_sent(1)
            await dc.post_message(alice, "hello in a dm", dm=True)
            await dc.wait_sent(2)
            assert [(m["channel_id"], m["content"]) for m in dc.sent] == [
                (dc.channel_id, "from the guild's shard"),
                (dc.dm_channel_id(ALICE), "from shard 0"),
            ]
            assert len(fake_llm.requests) == 2  # each message was one turn: nobody answered twice
            # while shard 1 is down, shard 0 never sees the guild's message; the new shard 1 answers it
            await one.stop()
            fake_llm.script(Reply(text="dm again"), Reply(text="guild, late"))
            await dc.post_message(alice, "anyone in the guild?", mention_bot=True)
            await dc.post_message(alice, "still there?", dm=True)
            await dc.wait_sent(3)
            assert dc.sent[2]["content"] == "dm again" and len(fake_llm.requests) == 3
            one = DiscordAdapter(core1, core1.settings, guild_ready_timeout=0.05)
            await one.start()
            await dc.wait_sent(4)
            assert dc.sent[3]["content"] == "guild, late" and dc.sent[3]["channel_id"] == dc.channel_id
            assert dc.command_puts == 1
        finally:
            await one.stop()
            await zero.stop()


async def test_sharded_start_with_the_gateway_unreachable_is_one_line_at_once(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, dc: FakeDiscord
) -> None:
    port = _closed_port()
    core = make_core(
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=f"ws://127.0.0.1:{port}/",
        DISCORD_SHARD_COUNT="4",
        DISCORD_SHARD_IDS="2-3",
    )
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    with pytest.raises(StartupError) as failed:
        await asyncio.wait_for(adapter.start(), 10)  # discord.py alone retries a shard every 5 s, logging errors
    line = str(failed.value)
    assert f"cannot reach the gateway at 127.0.0.1:{port}" in line and "DISCORD_GATEWAY_URL" in line, line
    assert failed.value.exit_code == EXIT_UNREACHABLE and adapter.client.is_closed() and adapter.gateway.runner is None


async def test_a_shard_that_identifies_again_is_connected_again_in_status(
    fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both shards in one process; shard 0's session is invalidated: /status says disconnected, then (after
    discord.py's identify pause) connected again, though on_ready does not come again for one shard."""

    async def no_pause(self: discord.Client, shard_id: int | None, *, initial: bool = False) -> None:
        """discord.py's hook waits 5 s of real time before each further IDENTIFY: not in a test."""

    monkeypatch.setattr(discord.Client, "before_identify_hook", no_pause)
    async with FakeDiscord(guild_shard=(1, 2)) as dc:
        core = make_core(
            DISCORD_BOT_TOKEN=dc.token,
            DISCORD_API_BASE_URL=dc.api_base,
            DISCORD_GATEWAY_URL=dc.gateway_url,
            DISCORD_SHARD_COUNT="2",
        )
        adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
        # discord.py identifies a process's shards 5 s apart: start() waits that much longer for each further one
        assert adapter.ready_timeout == DISCORD_READY_TIMEOUT_S + DISCORD_IDENTIFY_SPACING_S
        await adapter.start()
        try:
            assert core.status_board.adapters["discord"] == "assistant in 1 server(s), shards 0,1 of 2"
            dropped = asyncio.create_task(adapter.client.wait_for("disconnect", timeout=5))
            await dc.invalidate_session()
            await dropped
            await asyncio.sleep(0)  # the on_disconnect task was scheduled together with that wake-up
            assert core.status_board.adapters["discord"].startswith("disconnected since")
            assert await adapter.client.wait_for("shard_ready", timeout=10) == 0
            await asyncio.sleep(0)  # the on_shard_ready task was scheduled together with that wake-up
            assert dc.identified_shards == [[0, 2], [1, 2], [0, 2]]
            assert core.status_board.adapters["discord"] == "assistant in 1 server(s), shards 0,1 of 2"
        finally:
            await adapter.stop()


@pytest.mark.parametrize(
    ("count", "ids", "expected"),
    [
        ("", "0", "DISCORD_SHARD_IDS: needs DISCORD_SHARD_COUNT"),
        ("2", "0,2", "DISCORD_SHARD_IDS: shard id 2 is not below DISCORD_SHARD_COUNT=2 (ids run 0 to 1)"),
        ("4", "0-x", "DISCORD_SHARD_IDS: '0-x' is not a shard id or a range such as 0-3"),
        ("4", "3-1", "DISCORD_SHARD_IDS: '3-1' is an empty range"),
        ("0", "", "DISCORD_SHARD_COUNT: must be greater than or equal to 1"),
        ("two", "", "DISCORD_SHARD_COUNT: must be a valid integer"),
    ],
)
def test_bad_shard_settings_are_one_line_naming_the_variable(
    count: str, ids: str, expected: str, make_settings: MakeSettings
) -> None:
    with pytest.raises(SettingsError) as failed:
        make_settings(DISCORD_SHARD_COUNT=count, DISCORD_SHARD_IDS=ids)
    assert expected in str(failed.value) and "\n" not in str(failed.value)


def test_shard_settings_unset_keep_one_unsharded_client_and_ranges_expand(make_settings: MakeSettings) -> None:
    assert make_settings().discord_shards is None
    assert make_settings(DISCORD_SHARD_COUNT="", DISCORD_SHARD_IDS="").discord_shards is None
    assert make_settings(DISCORD_SHARD_COUNT="4").discord_shards == (4, (0, 1, 2, 3))
    both = make_settings(DISCORD_SHARD_COUNT="8", DISCORD_SHARD_IDS="4-5, 7")
    assert both.discord_shards == (8, (4, 5, 7))
