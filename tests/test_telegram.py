"""The Telegram adapter through the real python-telegram-bot against the fake Bot API server."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from telegram.error import NetworkError, RetryAfter

from adapters.telegram import TelegramAdapter
from core import EMPTY_ANSWER as EMPTY_REPLY
from core import FAILED, SENT_PRIVATELY, TEXT_ONLY
from core.reminders.engine import DeliveryRefused
from core.reminders.messages import ReminderMessage
from core.settings import EXIT_CONFIG, EXIT_UNREACHABLE, StartupError
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import (
    BLOCKED,
    CHAT_NOT_FOUND,
    DEACTIVATED,
    KICKED,
    MAX_TEXT_LENGTH,
    NOT_STARTED,
    FakeTelegram,
    parse_html,
    utf16_len,
)


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
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
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
    assert {c["command"] for c in bot.tg.commands} == {
        "start",
        "help",
        "remind",
        "watch",
        "tasks",
        "timezone",
        "memory",
        "model",
        "voice",
        "mcp",
        "usage",
        "whoami",
        "budget",
        "link",
        "unlink",
        "token",
        "web",
        "export",
        "forget_me",
        "reset",
        "status",
    }


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


async def test_slow_answer_shows_typing(bot: Bot) -> None:
    bot.llm.script(Reply(text="Thought about it.", delay=0.5))
    [sent] = await bot.say("think")
    assert sent["text"] == "Thought about it."
    assert [(a["chat_id"], a["action"]) for a in bot.tg.chat_actions] == [(1001, "typing")]


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


async def test_any_400_on_a_part_falls_back_to_plain_text(bot: Bot) -> None:
    bot.llm.script(Reply(text="**still here**"))
    bot.tg.fail_next("sendMessage", status=400, description="Bad Request: some rule nobody expected", retry_after=None)
    sent = await bot.say("hi")
    assert [s["text"] for s in sent] == ["still here"] and "parse_mode" not in sent[0]


async def test_too_long_part_is_resent_as_plain_text_split_at_the_limit(bot: Bot) -> None:
    text = "😀" + "a" * 5000 + "\nthe end"
    sent = await bot.adapter.send.deliver(1001, [f"<b>{text}</b>"], reply_markup=None)  # a renderer's miscount
    assert len(sent) == 2 and [s.text for s in sent] == [s["text"] for s in bot.tg.sent]
    assert all("parse_mode" not in s and utf16_len(s["text"]) <= MAX_TEXT_LENGTH for s in bot.tg.sent)
    assert "".join(s["text"] for s in bot.tg.sent).replace("\n", "") == text.replace("\n", "")


async def test_answer_near_the_limit_arrives_whole(bot: Bot) -> None:
    bot.llm.script(Reply(text=">\n" + "a" * 4095 + "😀"))  # once split into a 4,097-unit part
    bot.tg.push_update(bot.tg.message_update("quote this"))
    await bot.tg.wait_for(lambda: "😀" in "".join(s["text"] for s in bot.tg.sent))
    await asyncio.sleep(0.05)
    texts = [s["text"] for s in bot.tg.sent]
    visible = "".join(
        assert_valid_html(t) if s.get("parse_mode") else t for t, s in zip(texts, bot.tg.sent, strict=True)
    )
    assert "a" * 4095 + "😀" in visible.replace("\n", "") and FAILED not in texts


@pytest.mark.parametrize("answer", ["```\n```", "```python\n\n```", "   "])
async def test_an_empty_rendering_still_sends_a_visible_reply(bot: Bot, answer: str) -> None:
    bot.llm.script(Reply(text=answer))
    sent = await bot.say("hi")
    await asyncio.sleep(0.05)
    texts = [s["text"] for s in bot.tg.sent]
    assert len(sent) == 1 and texts[0].strip() and FAILED not in texts
    assert assert_valid_html(texts[0]).strip() if sent[0].get("parse_mode") else texts[0] == EMPTY_REPLY


@pytest.mark.parametrize("parts", [[], [""], ["<pre><code>\n</code></pre>"], ["<b> </b>", "   "]])
async def test_parts_with_nothing_visible_still_send_a_visible_message(bot: Bot, parts: list[str]) -> None:
    sent = await bot.adapter.send.deliver(1001, parts)
    assert len(sent) == 1 and [s["text"] for s in bot.tg.sent] == [EMPTY_REPLY]


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


@pytest.mark.parametrize(("command", "private_text"), [("/tasks", "Dentist"), ("/timezone", "Europe/Berlin")])
async def test_personal_commands_in_a_group_answer_privately(bot: Bot, command: str, private_text: str) -> None:
    bot.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Dentist", "due_at": "2026-11-24T15:30"})]),
        Reply(text="ok"),
    )
    await bot.say("dentist tuesday 15:30")
    before = len(bot.tg.sent)
    bot.tg.push_update(bot.tg.message_update(f"{command}@test_bot", chat_id=-100, chat_type="supergroup"))
    await bot.tg.wait_sent(before + 2)
    private, note = bot.tg.sent[before:]
    assert private["chat_id"] == 1001 and private_text in assert_valid_html(private["text"])
    assert note["chat_id"] == -100 and note["text"] == SENT_PRIVATELY
    assert note["reply_parameters"]["message_id"] > 0


@pytest.mark.parametrize("command", ["/tasks", "/timezone Asia/Tokyo"])
async def test_personal_command_in_a_group_without_a_private_chat_points_there(bot: Bot, command: str) -> None:
    bot.tg.refuse_chat(1001, NOT_STARTED)  # Ann never pressed Start in a private chat with the bot
    [note] = await bot.say(f"{command}@test_bot", chat_id=-100, chat_type="group")
    assert note["chat_id"] == -100 and "t.me/test_bot" in note["text"]
    assert command.split()[0] in note["text"]
    assert "Europe/Berlin" not in note["text"] and "Asia/Tokyo" not in note["text"]
    assert [s["chat_id"] for s in bot.tg.sent] == [-100]


async def test_timezone_command_shows_and_sets(bot: Bot) -> None:
    [shown] = await bot.say("/timezone")
    assert "Europe/Berlin" in shown["text"]
    [bad] = await bot.say("/timezone Nowhere/Land")
    assert "not a time zone" in bad["text"]
    [ok] = await bot.say("/timezone Asia/Tokyo")
    assert "Asia/Tokyo" in ok["text"]
    assert await bot.pool.fetchval("SELECT timezone FROM accounts") == "Asia/Tokyo"


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


async def test_not_allowed_user_gets_the_refusal_for_commands_once(bot: Bot) -> None:
    [sent] = await bot.say("/tasks", user_id=4242, chat_id=4242)
    assert "telegram:4242" in sent["text"] and "open tasks" not in sent["text"]
    bot.tg.push_update(bot.tg.message_update("/status", user_id=4242, chat_id=4242))  # refused once per hour
    bot.llm.script(Reply(text="hi Bob"))
    [reply] = await bot.say("hi", user_id=1002, chat_id=1002)
    assert reply["text"] == "hi Bob"
    assert all("Status" not in s["text"] for s in bot.tg.sent)


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


async def test_video_answered_politely_caption_counts(bot: Bot) -> None:  # (photos: test_media_photos_stickers.py)
    video = {"video": {"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1, "duration": 1}}
    [sent] = await bot.say("", extra=video)
    assert sent["text"] == TEXT_ONLY
    bot.llm.script(Reply(text="Nice video caption"))
    [sent] = await bot.say("", extra={**video, "caption": "what is this?"})
    assert sent["text"] == "Nice video caption"
    assert bot.llm.requests[-1]["messages"][-1]["content"] == "what is this?"


async def test_edited_message_ignored(bot: Bot) -> None:
    edited = bot.tg.message_update("edited text")
    edited["edited_message"] = edited.pop("message")
    bot.tg.push_update(edited)
    bot.llm.script(Reply(text="fresh"))
    sent = await bot.say("fresh")
    assert [s["text"] for s in sent] == ["fresh"] and len(bot.llm.requests) == 1


class Sleeps:
    """An injected sleep for the rate limiter: records each wait and returns at once."""

    def __init__(self) -> None:
        """No waits yet."""
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        """Record and yield once."""
        self.waits.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
def sleeps(bot: Bot) -> Sleeps:
    """The adapter's rate limiter sleeps through this recorder."""
    recorder = Sleeps()
    bot.adapter.rate_limiter.sleep = recorder
    return recorder


async def test_429_on_send_is_retried_and_delivered(bot: Bot, sleeps: Sleeps) -> None:
    bot.llm.script(Reply(text="arrives anyway"))
    bot.tg.fail_next("sendMessage", status=429, retry_after=1)
    sent = await bot.say("hi")
    assert [s["text"] for s in sent] == ["arrives anyway"]
    assert sum(1 for m, _ in bot.tg.calls if m == "sendMessage") == 2
    assert sleeps.waits == [pytest.approx(1.1, abs=0.05)]


async def test_429_five_times_in_a_row_still_delivers_once(bot: Bot, sleeps: Sleeps) -> None:
    bot.llm.script(Reply(text="patience pays"))
    bot.tg.fail_next("sendMessage", status=429, retry_after=2, times=5)
    sent = await bot.say("hi")
    assert [s["text"] for s in sent] == ["patience pays"]
    assert sum(1 for m, _ in bot.tg.calls if m == "sendMessage") == 6
    assert sleeps.waits == [pytest.approx(2.1, abs=0.05)] * 5
    await asyncio.sleep(0.05)
    assert [s["text"] for s in bot.tg.sent] == ["patience pays"]  # once, and no "something went wrong"


async def test_429_longer_than_the_turn_budget_gives_up(bot: Bot, sleeps: Sleeps) -> None:
    limiter = bot.adapter.rate_limiter
    assert limiter.max_wait_s == bot.adapter.core.settings.AGENT_TOTAL_TIMEOUT
    bot.tg.fail_next("sendMessage", status=429, retry_after=int(limiter.max_wait_s) + 5)
    with pytest.raises(RetryAfter):
        await bot.adapter.bot.send_message(1001, "never")
    assert sleeps.waits == [] and bot.tg.sent == []


async def test_stop_does_not_wait_out_a_long_429(bot: Bot) -> None:
    bot.tg.fail_next("sendMessage", status=429, retry_after=60)  # real sleeps: stop() must cut them short
    send = asyncio.create_task(bot.adapter.bot.send_message(1001, "late"))
    await bot.tg.wait_for(lambda: any(m == "sendMessage" for m, _ in bot.tg.calls))
    await asyncio.sleep(0.01)  # the send is now waiting out the 429
    await asyncio.wait_for(bot.adapter.stop(), 5)
    with pytest.raises(RetryAfter):
        await asyncio.wait_for(send, 1)
    assert bot.tg.sent == []


async def test_typing_and_drafts_bypass_the_budget_and_are_dropped_while_rate_limited(bot: Bot) -> None:
    limiter, tg_bot = bot.adapter.rate_limiter, bot.adapter.bot
    await asyncio.gather(*(tg_bot.send_chat_action(1001, "typing") for _ in range(60)))
    assert len(bot.tg.chat_actions) == 60
    assert limiter.budget.free(limiter.clock()) == 27  # no message budget used: 27 may go at once
    # a 429 on a best-effort call is not retried, and previews are dropped while Telegram asks us to wait
    bot.tg.fail_next("sendMessageDraft", status=429, retry_after=30)
    with pytest.raises(RetryAfter):
        await tg_bot.send_message_draft(1001, 1, "draft")
    calls = len(bot.tg.calls)
    with pytest.raises(RetryAfter):
        await tg_bot.send_chat_action(1001, "typing")
    with pytest.raises(RetryAfter):
        await tg_bot.send_message_draft(1001, 1, "draft")
    assert len(bot.tg.calls) == calls and bot.tg.drafts == []


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


async def test_fast_answer_sends_no_draft_and_no_typing(bot: Bot) -> None:
    bot.llm.script(Reply(text="Instant."))
    await bot.say("quick")
    await asyncio.sleep(0.05)
    assert bot.tg.drafts == [] and bot.tg.chat_actions == []


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
    from core.reminders.engine import ReminderEngine

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
    # a user who may not use the bot: the refusal with their id (always: a button press needs an answer)
    bot.tg.push_update(bot.tg.callback_update("rem:done:1", message=reminder, user_id=4242, first_name="Eve"))
    await bot.tg.wait_for(lambda: len(bot.tg.callback_answers) == 2)
    assert "telegram:4242" in bot.tg.callback_answers[1]["text"]
    assert await bot.pool.fetchval("SELECT status FROM tasks") == "pending"
    # the owner snoozes: the database moves and the message is edited
    bot.tg.push_update(bot.tg.callback_update("rem:snooze10:1", message=reminder))
    await bot.tg.wait_for(lambda: bot.tg.sent[before].get("edit_count", 0) == 1)
    assert "😴 Snoozed: Call mum — until 11:40" in bot.tg.sent[before]["text"]
    assert await bot.pool.fetchval("SELECT due_at FROM tasks") == clock.now + timedelta(minutes=10)


async def test_remind_command_answers_what_it_understood_with_an_undo_only_its_owner_can_press(bot: Bot) -> None:
    [how] = await bot.say("/remind")
    assert how["text"].count("/remind ") == 3 and "Europe/Berlin" in how["text"]
    [made] = await bot.say("/remind morgen um 9 Zahnarzt", language_code="de")
    assert made["text"] == "⏰ #1 Zahnarzt — Sun 22 Nov 09:00 CET"
    assert made["reply_markup"]["inline_keyboard"] == [[{"text": "↩️ Undo", "callback_data": "rem:undo:1"}]]
    assert await bot.pool.fetchval("SELECT title FROM tasks") == "Zahnarzt"
    bot.tg.push_update(bot.tg.callback_update("rem:undo:1", message=made, user_id=1002, first_name="Bob"))
    await bot.tg.wait_for(lambda: len(bot.tg.callback_answers) == 1)
    assert "Only the person" in bot.tg.callback_answers[0]["text"]
    assert await bot.pool.fetchval("SELECT count(*) FROM tasks") == 1
    bot.tg.push_update(bot.tg.callback_update("rem:undo:1", message=made))
    await bot.tg.wait_for(lambda: made.get("edit_count", 0) == 1)
    assert made["text"] == "⏰ #1 Zahnarzt — Sun 22 Nov 09:00 CET\n\n↩️ Undone: #1 Zahnarzt is deleted."
    assert not made.get("reply_markup")
    assert await bot.pool.fetchval("SELECT count(*) FROM tasks") == 0
    [past] = await bot.say("/remind yesterday 9:00 Zahnarzt")
    assert "is in the past" in past["text"] and "reply_markup" not in past
    assert bot.llm.requests == []  # no model call for any of it


async def test_group_reminder_mentions_its_owner(bot: Bot, clock: FakeClock) -> None:
    from core.reminders.engine import ReminderEngine

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
    from core.reminders.engine import ReminderEngine

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


def reminder_to(chat_id: int) -> ReminderMessage:
    """A plain reminder for user 1001 in `chat_id`."""
    return ReminderMessage(
        task_id=1,
        scheduled_at=datetime(2026, 11, 21, 10, 30, tzinfo=UTC),
        platform="telegram",
        chat_id=str(chat_id),
        thread_id="",
        chat_kind="private" if chat_id > 0 else "group",
        owner_id="1001",
        owner_name="Ann",
        text="⏰ Call mum",
    )


@pytest.mark.parametrize("refusal", [BLOCKED, KICKED, DEACTIVATED, CHAT_NOT_FOUND])
async def test_reminder_to_a_closed_chat_is_refused_permanently(bot: Bot, refusal: str) -> None:
    chat = -555 if refusal == KICKED else 1001
    bot.tg.refuse_chat(chat, refusal)
    with pytest.raises(DeliveryRefused) as info:
        await bot.adapter.send_reminder(reminder_to(chat))
    reason = str(info.value).lower()
    assert refusal.split(": ", 1)[1].lower() in reason
    assert sum(1 for m, _ in bot.tg.calls if m == "sendMessage") == 1  # no plain-text retry of a closed chat


@pytest.mark.parametrize(("status", "description"), [(500, "Internal Server Error"), (502, "Bad Gateway")])
async def test_reminder_send_server_error_is_transient(bot: Bot, status: int, description: str) -> None:
    bot.tg.fail_next("sendMessage", status=status, description=description, retry_after=None)
    with pytest.raises(NetworkError) as info:
        await bot.adapter.send_reminder(reminder_to(1001))
    assert not isinstance(info.value, DeliveryRefused)
    assert await bot.adapter.send_reminder(reminder_to(1001))  # and the next attempt gets through


# ---- start-up errors


async def start_fails(make_core: MakeCore, token: str, base_url: str, exit_code: int = EXIT_CONFIG) -> str:
    """Start an adapter that must fail with `exit_code`; return the StartupError's text."""
    core = make_core(TELEGRAM_BOT_TOKEN=token, TELEGRAM_API_BASE_URL=base_url, ADMINS="telegram:1001")
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    with pytest.raises(StartupError) as info:
        await adapter.start()
    error = info.value
    assert error.exit_code == exit_code
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)  # no chained token
    text = str(error)
    assert "\n" not in text and token not in text and token.rpartition(":")[2] not in text
    return text


@pytest.mark.parametrize("token", ["123:TEST", "not a token", "123456:short", "abc:" + "x" * 35, "12 :" + "A" * 35])
async def test_malformed_token_is_one_line_naming_the_variable(
    make_core: MakeCore, tg: FakeTelegram, token: str
) -> None:
    text = await start_fails(make_core, token, tg.base_url)
    assert "TELEGRAM_BOT_TOKEN" in text
    assert tg.calls == []  # nothing sent to Telegram with a token of the wrong shape


async def test_rejected_token_is_one_line_without_the_token(
    make_core: MakeCore, tg: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = "987654:AAF" + "q" * 32
    text = await start_fails(make_core, token, tg.base_url)
    assert text.startswith("TELEGRAM_BOT_TOKEN: rejected by Telegram at ")
    assert not any(token.split(":")[1] in r.getMessage() for r in caplog.records)


async def test_unreachable_api_is_one_line_naming_the_host(
    make_core: MakeCore, tg: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    text = await start_fails(make_core, tg.token, f"http://127.0.0.1:{port}/bot", EXIT_UNREACHABLE)
    assert text.startswith(f"Telegram: the Bot API at 127.0.0.1:{port} cannot be reached")
    assert "TELEGRAM_API_BASE_URL" in text
    assert not any(tg.token.split(":")[1] in r.getMessage() for r in caplog.records)


async def test_token_never_logged_while_running(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, ADMINS="telegram:1001")
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    adapter.rate_limiter.sleep = Sleeps()
    await adapter.start()
    try:
        fake_llm.script(Reply(text="**one**"), Reply(text="two"))
        tg.fail_next("sendMessage", status=400, description="Bad Request: can't parse entities: x", retry_after=None)
        tg.push_update(tg.message_update("hi"))
        await tg.wait_sent(1)
        tg.fail_next("sendMessage", status=429, retry_after=1)
        tg.drop_next_get_updates()
        tg.push_update(tg.message_update("again"))
        await tg.wait_sent(2)
    finally:
        await adapter.stop()
    secret = tg.token.rpartition(":")[2]
    assert any("Bot API URL" in r.getMessage() for r in caplog.records)  # PTB's URL line is there, redacted
    assert not [r.getMessage() for r in caplog.records if secret in r.getMessage()]


async def ann_remembers(bot: Bot) -> int:
    """Ann (1001) has two lines in [human] and one archival entry; returns her user id."""
    from core import Incoming
    from tests.test_memory_command import remember

    ann = Incoming(platform="telegram", user_id="1001", chat_id="1001", text="", user_name="Ann")
    return await remember(bot.adapter.core, ann, ["Name: Ann", "Works at: Google"], ["likes oat milk"])


async def test_memory_command_shows_numbered_lines_without_llm(bot: Bot) -> None:
    await ann_remembers(bot)
    [sent] = await bot.say("/memory")
    text = assert_valid_html(sent["text"])
    assert "1: Name: Ann" in text and "2: Works at: Google" in text and "Archival memory: 1 entry" in text
    assert bot.llm.requests == []
    [other] = await bot.say("/memory", user_id=1002, chat_id=1002, first_name="Bob")
    assert (
        "Ann" not in other["text"] and "Google" not in other["text"] and "Archival memory: 0 entries" in other["text"]
    )
    [forgot] = await bot.say("/memory forget human 2")
    assert forgot["text"] == "Forgot line 2 of [human]: “Works at: Google”."
    [bad] = await bot.say("/memory forget human 7")
    assert bad["text"] == "line 7 does not exist in [human]; valid lines: 1-1"
    assert bot.llm.requests == []


async def test_memory_in_a_group_answers_privately(bot: Bot) -> None:
    await ann_remembers(bot)
    before = len(bot.tg.sent)
    bot.tg.push_update(bot.tg.message_update("/memory@test_bot", chat_id=-100, chat_type="supergroup"))
    await bot.tg.wait_sent(before + 2)
    private, note = bot.tg.sent[before:]
    assert private["chat_id"] == 1001 and "1: Name: Ann" in assert_valid_html(private["text"])
    assert note["chat_id"] == -100 and note["text"] == SENT_PRIVATELY
    bot.tg.refuse_chat(1001, NOT_STARTED)
    [pointer] = await bot.say("/memory@test_bot", chat_id=-100, chat_type="group")
    assert pointer["chat_id"] == -100 and "t.me/test_bot" in pointer["text"] and "/memory" in pointer["text"]
    assert "Ann" not in pointer["text"] and "Google" not in pointer["text"]


async def test_memory_wipe_button_only_for_the_person_it_was_offered_to(bot: Bot) -> None:
    ann = await ann_remembers(bot)
    [ask] = await bot.say("/memory wipe")
    assert "2 lines and 1 archival entry" in ask["text"] and "/memory wipe confirm" in ask["text"]
    [[button]] = ask["reply_markup"]["inline_keyboard"]
    assert button["callback_data"] == "mem:wipe:1001"
    assert await bot.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", ann) == 1
    # Bob presses Ann's button (and a forged one naming himself, in Ann's chat): nobody's memory changes
    for data in ("mem:wipe:1001", "mem:wipe:1002"):
        bot.tg.push_update(bot.tg.callback_update(data, message=ask, user_id=1002, first_name="Bob"))
    await bot.tg.wait_for(lambda: len(bot.tg.callback_answers) == 2)
    assert all("not for you" in a["text"] for a in bot.tg.callback_answers)
    assert await bot.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", ann) == 1
    assert await bot.pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", ann) == 1
    # Ann presses it: everything goes and the message says so
    bot.tg.push_update(bot.tg.callback_update("mem:wipe:1001", message=ask))
    await bot.tg.wait_for(lambda: bot.tg.sent[-1].get("edit_count", 0) == 1)
    assert "I erased 2 lines and 1 archival entry" in bot.tg.sent[-1]["text"]
    assert await bot.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", ann) == 0
    assert await bot.pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", ann) == 0


async def test_memory_wipe_confirm_by_command(bot: Bot) -> None:
    ann = await ann_remembers(bot)
    [done] = await bot.say("/memory wipe confirm")
    assert "I erased 2 lines and 1 archival entry" in done["text"] and "reply_markup" not in done
    assert await bot.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", ann) == 0


async def test_memory_refused_to_a_user_who_may_not_use_the_bot(bot: Bot) -> None:
    await ann_remembers(bot)
    [sent] = await bot.say("/memory", user_id=4242, chat_id=4242)
    assert "telegram:4242" in sent["text"] and "Ann" not in sent["text"]
