"""The Telegram adapter through the real python-telegram-bot against the fake Bot API server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from adapters.telegram import TEXT_ONLY, TelegramAdapter
from core.commands import StatusBoard
from core.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram, parse_html


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    """The fake Bot API server."""
    async with FakeTelegram() as fake:
        yield fake


class Bot:
    """A running Telegram adapter and its fakes."""

    def __init__(self, tg: FakeTelegram, llm: FakeOpenAI, adapter: TelegramAdapter, pool: Pool) -> None:
        """Keep the pieces together."""
        self.tg, self.llm, self.adapter, self.pool = tg, llm, adapter, pool

    async def say(self, text: str, **kw: Any) -> list[dict[str, Any]]:
        """Push a message and wait for one more sent message; return the new ones."""
        before = len(self.tg.sent)
        self.tg.push_update(self.tg.message_update(text, **kw))
        await self.tg.wait_sent(before + 1)
        return self.tg.sent[before:]


@pytest.fixture
async def bot(tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool) -> AsyncIterator[Bot]:
    """The real adapter, started against the fake server; allowed: users 1001 and 1002, admin 1001."""
    core = make_core(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        ADMINS="telegram:1001",
        ALLOWED_USERS="telegram:1002",
        DEFAULT_TIMEZONE="Europe/Berlin",
    )
    adapter = TelegramAdapter(core, core.settings, StatusBoard(), poll_timeout=1)
    await adapter.start()
    try:
        yield Bot(tg, fake_llm, adapter, pool)
    finally:
        await adapter.stop()


def assert_valid_html(text: str) -> str:
    """The visible text of a part, failing when Telegram would reject its HTML."""
    visible, _ = parse_html(text)
    return visible


async def test_commands_registered_at_start(bot: Bot) -> None:
    assert bot.tg.commands is not None
    assert {c["command"] for c in bot.tg.commands} == {"start", "help", "tasks", "timezone", "reset", "status"}


async def test_private_round_trip_with_tool_call(bot: Bot) -> None:
    bot.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk", "due_at": "2026-11-22T09:00"})]),
        Reply(text="Done — I'll remind you **tomorrow at 09:00**."),
    )
    [sent] = await bot.say("remind me to buy milk tomorrow at 9")
    assert sent["parse_mode"] == "HTML" and sent["chat_id"] == 1001
    assert sent["link_preview_options"] == {"is_disabled": True}
    text = sent["text"]
    assert text.startswith("Done — I'll remind you <b>tomorrow at 09:00</b>.")
    quote = text[text.index("<blockquote expandable>") :]
    assert quote.endswith("</blockquote>")
    lines = assert_valid_html(quote).split("\n")
    assert lines[0].startswith("🔧 1 step · ") and lines[0].endswith(" s")
    assert lines[1] == '✅ manage_tasks create → created #1 "Buy milk", Sun 22 Nov 09:00 CET'
    assert bot.tg.chat_actions and bot.tg.chat_actions[0]["action"] == "typing"


async def test_group_without_mention_ignored_with_mention_answered(bot: Bot) -> None:
    bot.llm.script(Reply(text="Hello group"))
    bot.tg.push_update(bot.tg.message_update("just chatting", chat_id=-100, chat_type="supergroup"))
    sent = await bot.say("@test_bot hello", chat_id=-100, chat_type="supergroup", first_name="Ann")
    assert [s["text"] for s in sent] == ["Hello group"]
    assert sent[0]["reply_parameters"]["message_id"] > 0
    assert len(bot.llm.requests) == 1
    assert bot.llm.requests[0]["messages"][-1]["content"] == "Ann: hello"


async def test_reply_to_bot_answered_in_group(bot: Bot) -> None:
    bot.llm.script(Reply(text="Yes?"))
    sent = await bot.say("and another thing", chat_id=-100, chat_type="group", reply_to_bot=True)
    assert sent[0]["text"] == "Yes?"


async def test_forum_topic_answer_goes_to_topic(bot: Bot) -> None:
    bot.llm.script(Reply(text="In the topic"))
    sent = await bot.say("@test_bot hi", chat_id=-100, chat_type="supergroup", thread_id=77)
    assert sent[0]["message_thread_id"] == 77


async def test_long_answer_split_into_valid_parts(bot: Bot) -> None:
    code = "\n".join(f"print('line {i} 😀 <tag> & more')" for i in range(200))
    prose = "\n".join(f"Paragraph {i}: emoji 🎉🎉 and **bold** text & <angles>." for i in range(100))
    answer = f"{prose}\n```python\n{code}\n```\nThe end."
    assert len(answer) > 10000
    bot.llm.script(Reply(tool_calls=[("manage_tasks", {"action": "list"})]), Reply(text=answer))
    before = len(bot.tg.sent)
    bot.tg.push_update(bot.tg.message_update("long please"))
    await bot.tg.wait_for(lambda: any("blockquote expandable" in s["text"] for s in bot.tg.sent[before:]))
    parts = [s["text"] for s in bot.tg.sent[before:]]
    assert len(parts) >= 3
    visible = [assert_valid_html(p) for p in parts]  # every part is valid HTML within the limit
    assert all(len(v.encode("utf-16-le")) // 2 <= 4096 for v in visible)
    assert visible[0].startswith("Paragraph 0:") and "The end." in visible[-1]
    assert all("blockquote expandable" not in p for p in parts[:-1])
    # the code block survives the split: every part holding code opens it with its language
    code_parts = [p for p in parts if "print('line" in p]
    assert len(code_parts) >= 2
    assert all('<pre><code class="language-python">' in p for p in code_parts)
    joined = "\n".join(visible)
    assert all(f"print('line {i} 😀 <tag> & more')" in joined for i in range(200))


async def test_unsafe_model_output_rendered_safely(bot: Bot) -> None:
    bot.llm.script(Reply(text="<script>alert(1)</script> a < b & c **unclosed and a raw <br> here"))
    [sent] = await bot.say("try to break it")
    assert assert_valid_html(sent["text"]) == "<script>alert(1)</script> a < b & c **unclosed and a raw <br> here"


async def test_rejected_html_is_resent_as_plain_text(bot: Bot) -> None:
    bot.llm.script(Reply(text="**fine**"))
    bot.tg.fail_next("sendMessage", status=400, description="Bad Request: can't parse entities: nope", retry_after=None)
    sent = await bot.say("hi")
    assert sent[-1]["text"] == "fine" and "parse_mode" not in sent[-1]


async def test_tasks_command_without_llm(bot: Bot) -> None:
    bot.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Dentist", "due_at": "2026-11-24T15:30"})]),
        Reply(text="ok"),
    )
    await bot.say("dentist tuesday 15:30")
    requests = len(bot.llm.requests)
    [sent] = await bot.say("/tasks")
    assert len(bot.llm.requests) == requests
    assert "#1 Dentist — Tue 24 Nov 15:30 CET" in assert_valid_html(sent["text"])


async def test_timezone_command_shows_and_sets(bot: Bot) -> None:
    [shown] = await bot.say("/timezone")
    assert "Europe/Berlin" in shown["text"]
    [bad] = await bot.say("/timezone Nowhere/Land")
    assert "not a time zone" in bad["text"]
    [ok] = await bot.say("/timezone Asia/Tokyo")
    assert "Asia/Tokyo" in ok["text"]
    assert await bot.pool.fetchval("SELECT timezone FROM users") == "Asia/Tokyo"


async def test_reset_command(bot: Bot) -> None:
    bot.llm.script(Reply(text="first"), Reply(text="second"))
    await bot.say("one")
    [sent] = await bot.say("/reset")
    assert "Fresh start" in sent["text"]
    await bot.say("two")
    assert [m["content"] for m in bot.llm.requests[-1]["messages"][1:]] == ["two"]


async def test_status_command(bot: Bot) -> None:
    [sent] = await bot.say("/status")
    text = assert_valid_html(sent["text"])
    for needle in (
        "version",
        "uptime",
        "model: fake-model",
        "telegram (@test_bot)",
        "last successful telegram poll",
        "pending reminders: 0",
    ):
        assert needle in text, needle


async def test_not_allowed_user_refused_with_id(bot: Bot) -> None:
    [sent] = await bot.say("hello", user_id=4242, chat_id=4242)
    assert "4242" in sent["text"] and "telegram:4242" in sent["text"]
    assert bot.llm.requests == []


async def test_same_update_delivered_twice_answered_once(bot: Bot) -> None:
    bot.llm.script(Reply(text="only once"))
    update = bot.tg.message_update("hi", message_id=555)
    bot.tg.push_update(update)
    await bot.tg.wait_sent(1)
    # the same message again under a new update id (a re-delivery after a restart)
    bot.tg.push_update({k: v for k, v in update.items() if k != "update_id"})
    bot.llm.script(Reply(text="next"))
    await bot.say("next message")
    assert [s["text"] for s in bot.tg.sent] == ["only once", "next"]


async def test_photo_answered_politely_caption_counts(bot: Bot) -> None:
    photo = {"photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]}
    [sent] = await bot.say("", extra=photo)
    assert sent["text"] == TEXT_ONLY
    bot.llm.script(Reply(text="Nice photo caption"))
    [sent] = await bot.say("", extra={**photo, "caption": "what is this?"})
    assert sent["text"] == "Nice photo caption"
    assert bot.llm.requests[-1]["messages"][-1]["content"] == "what is this?"


async def test_edited_message_ignored(bot: Bot) -> None:
    edited = bot.tg.message_update("edited text")
    edited["edited_message"] = edited.pop("message")
    bot.tg.push_update(edited)
    bot.llm.script(Reply(text="fresh"))
    sent = await bot.say("fresh")
    assert [s["text"] for s in sent] == ["fresh"] and len(bot.llm.requests) == 1


async def test_429_on_send_is_retried_and_delivered(bot: Bot) -> None:
    bot.llm.script(Reply(text="arrives anyway"))
    bot.tg.fail_next("sendMessage", status=429, retry_after=1)
    sent = await bot.say("hi")
    assert [s["text"] for s in sent] == ["arrives anyway"]
    assert sum(1 for m, _ in bot.tg.calls if m == "sendMessage") == 2


async def test_keeps_polling_after_dropped_connection(bot: Bot, allowed_errors: list[str]) -> None:
    bot.tg.drop_next_get_updates()
    bot.llm.script(Reply(text="still here"))
    sent = await bot.say("are you alive?")
    assert sent[0]["text"] == "still here"


async def test_draft_streamed_in_private_chat(bot: Bot, clock: FakeClock) -> None:
    # a slow model: the answer starts streaming after 0.7 s, so the user sees a draft first
    bot.llm.script(Reply(text="A streamed answer in several pieces.", delay=0.7))
    [sent] = await bot.say("stream it")
    assert sent["text"] == "A streamed answer in several pieces."
    assert bot.tg.drafts and bot.tg.drafts[0]["chat_id"] == 1001
    assert "A streamed" in bot.tg.drafts[0]["text"]
    assert bot.llm.requests[0]["stream"] is True


async def test_fast_answer_sends_no_draft(bot: Bot) -> None:
    bot.llm.script(Reply(text="Instant."))
    await bot.say("quick")
    assert bot.tg.drafts == []


async def test_handler_failure_is_logged_and_user_told(
    bot: Bot, allowed_errors: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    allowed_errors.append("Telegram handler failed")
    await bot.pool.execute("ALTER TABLE messages RENAME TO messages_away")  # a database hiccup
    try:
        [sent] = await bot.say("hello?")
    finally:
        await bot.pool.execute("ALTER TABLE messages_away RENAME TO messages")
    assert sent["text"].startswith("Sorry, something went wrong on my side")
    assert any(r.getMessage() == "Telegram handler failed" and r.exc_info for r in caplog.records)
    bot.llm.script(Reply(text="back to normal"))
    [sent] = await bot.say("and now?")
    assert sent["text"] == "back to normal"


async def test_reminder_arrives_with_buttons_only_owner_can_press(bot: Bot, clock: FakeClock) -> None:
    from core.reminders import ReminderEngine

    bot.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum", "due_at": "2026-11-21T11:30"})]),
        Reply(text="Will do."),
    )
    await bot.say("remind me to call mum at 11:30")
    engine = ReminderEngine(bot.pool, {"telegram": bot.adapter}, clock)
    clock.advance(minutes=30)  # 11:30 in Berlin
    before = len(bot.tg.sent)
    assert await engine.tick() == 1
    reminder = bot.tg.sent[before]
    assert reminder["chat_id"] == 1001 and reminder["text"] == "⏰ Call mum — due 11:30"
    buttons = reminder["reply_markup"]["inline_keyboard"][0]
    assert [b["text"] for b in buttons] == ["✅ Done", "😴 10 min", "😴 1 h"]
    assert [b["callback_data"] for b in buttons] == ["rem:done:1", "rem:snooze10:1", "rem:snooze60:1"]
    # someone else presses Done: refused, nothing changes
    bot.tg.push_update(bot.tg.callback_update("rem:done:1", message=reminder, user_id=1002, first_name="Bob"))
    await bot.tg.wait_for(lambda: len(bot.tg.callback_answers) == 1)
    assert "Only the person" in bot.tg.callback_answers[0]["text"]
    assert await bot.pool.fetchval("SELECT status FROM tasks") == "pending"
    # the owner snoozes: the database moves and the message is edited
    bot.tg.push_update(bot.tg.callback_update("rem:snooze10:1", message=reminder))
    await bot.tg.wait_for(lambda: bot.tg.sent[before].get("edit_count", 0) == 1)
    assert "😴 Snoozed: Call mum — until 11:40" in bot.tg.sent[before]["text"]
    assert await bot.pool.fetchval("SELECT due_at FROM tasks") == clock.now + timedelta(minutes=10)


async def test_group_reminder_mentions_its_owner(bot: Bot, clock: FakeClock) -> None:
    from core.reminders import ReminderEngine

    bot.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Standup", "due_at": "2026-11-21T11:15"})]),
        Reply(text="ok"),
    )
    await bot.say("@test_bot remind me of standup at 11:15", chat_id=-300, chat_type="supergroup", thread_id=9)
    clock.advance(minutes=15)
    before = len(bot.tg.sent)
    assert await ReminderEngine(bot.pool, {"telegram": bot.adapter}, clock).tick() == 1
    sent = bot.tg.sent[before]
    assert sent["chat_id"] == -300 and sent["message_thread_id"] == 9
    assert sent["text"].startswith('<a href="tg://user?id=1001">Ann</a> ⏰ Standup')
    assert_valid_html(sent["text"])


async def test_tasks_shows_reminders_skipped_during_downtime(bot: Bot, clock: FakeClock) -> None:
    from core.reminders import ReminderEngine

    bot.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Old", "due_at": "2026-11-21T12:00"})]),
        Reply(text="ok"),
    )
    await bot.say("old one")
    clock.advance(days=2)  # the bot was down for two days
    assert await ReminderEngine(bot.pool, {"telegram": bot.adapter}, clock).tick() == 0
    [sent] = await bot.say("/tasks")
    text = assert_valid_html(sent["text"])
    assert "Missed while I was offline" in text and "#1 Old — was due Sat 21 Nov 12:00 CET" in text
