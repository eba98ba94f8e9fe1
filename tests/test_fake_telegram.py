"""Tests for the fake Telegram Bot API driven by the real python-telegram-bot."""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup, ReplyParameters, Update
from telegram.error import BadRequest, Conflict, EndPointNotFound, Forbidden, InvalidToken, RetryAfter
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from tests.fake_telegram import (
    BLOCKED,
    CHAT_NOT_FOUND,
    NOT_STARTED,
    FakeTelegram,
    HtmlError,
    parse_html,
    utf16_len,
)

App = Application[Any, Any, Any, Any, Any, Any]


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    """A started fake Telegram server."""
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[Bot]:
    """An initialized real PTB Bot pointed at the fake."""
    async with Bot(fake.token, base_url=fake.base_url) as b:
        yield b


async def _echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Reply with the received text in HTML, with a button."""
    assert update.message is not None and update.message.text is not None
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("Again", callback_data="again")]])
    await update.message.reply_html(f"<b>You said:</b> {html.escape(update.message.text)}", reply_markup=keyboard)


async def _start(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Answer /start."""
    assert update.effective_chat is not None
    await context.bot.send_message(update.effective_chat.id, "<i>welcome</i>", parse_mode="HTML")


async def _button(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Answer a button press and edit the message (dropping the keyboard)."""
    query = update.callback_query
    assert query is not None
    await query.answer("ok")
    await query.edit_message_text(f"pressed <code>{query.data}</code>", parse_mode="HTML")


async def _running_app(fake: FakeTelegram) -> App:
    """Build, initialize and start polling an Application against the fake."""
    app = ApplicationBuilder().token(fake.token).base_url(fake.base_url).build()
    app.add_handler(CommandHandler("start", _start))
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, _echo))
    app.add_handler(CallbackQueryHandler(_button))
    await app.initialize()
    assert app.updater is not None
    await app.updater.start_polling(poll_interval=0, timeout=1)
    await app.start()
    return app


async def _shutdown(app: App) -> None:
    """Stop polling and shut the Application down."""
    assert app.updater is not None
    await app.updater.stop()
    await app.stop()
    await app.shutdown()


async def test_polling_round_trip(fake: FakeTelegram) -> None:
    """Updates reach PTB handlers; HTML replies, commands and callback queries work end to end."""
    started = time.monotonic()
    app = await _running_app(fake)
    try:
        fake.push_update(fake.message_update("a < b & c"))
        sent = await fake.wait_sent(1)
        assert sent[0]["chat_id"] == 1001
        assert sent[0]["text"] == "<b>You said:</b> a &lt; b &amp; c"
        assert sent[0]["parse_mode"] == "HTML"
        assert sent[0]["reply_markup"] == {"inline_keyboard": [[{"text": "Again", "callback_data": "again"}]]}
        message = sent[0]["message"]
        assert message["text"] == "You said: a < b & c"
        assert message["entities"] == [{"offset": 0, "length": 9, "type": "bold"}]

        update = fake.message_update("/start")
        assert update["message"]["entities"] == [{"type": "bot_command", "offset": 0, "length": 6}]
        fake.push_update(update)
        await fake.wait_sent(2)
        assert fake.sent[1]["message"]["text"] == "welcome"

        fake.push_update(fake.callback_update("again", message=fake.sent[0]))
        await fake.wait_for(lambda: fake.sent[0].get("edit_count") == 1)
        assert fake.callback_answers[0]["text"] == "ok"
        edited = fake.sent[0]
        assert edited["text"] == "pressed <code>again</code>"
        assert edited["message"]["text"] == "pressed again"
        assert "reply_markup" not in edited["message"]  # editing without reply_markup drops the keyboard
        methods = [m for m, _ in fake.calls]
        assert methods[:2] == ["getMe", "deleteWebhook"]
        assert "answerCallbackQuery" in methods and "editMessageText" in methods
    finally:
        await _shutdown(app)
    assert fake.get_updates_ok >= 3
    assert time.monotonic() - started < 3


async def test_message_update_builder(fake: FakeTelegram) -> None:
    """Built updates carry mentions, topics, replies to the bot and group chats."""
    update = fake.message_update(
        "hi @test_bot /help@test_bot", chat_id=-100555, chat_type="supergroup", thread_id=7, reply_to_bot=True
    )
    msg = update["message"]
    assert msg["chat"] == {"id": -100555, "type": "supergroup", "title": "Test Group", "is_forum": True}
    assert msg["message_thread_id"] == 7 and msg["is_topic_message"] is True
    assert msg["entities"] == [
        {"type": "mention", "offset": 3, "length": 9},
        {"type": "bot_command", "offset": 13, "length": 14},
    ]
    assert msg["reply_to_message"]["from"]["id"] == fake.bot_id
    assert fake.push_update(update) == 1
    assert fake.push_update({"update_id": 41, "message": fake.message_update("x")["message"]}) == 41
    assert fake.push_update(fake.message_update("y")) == 42
    parsed = Update.de_json(update, None)
    assert parsed.effective_message is not None and parsed.effective_message.reply_to_message is not None


async def test_replies_need_an_existing_message(fake: FakeTelegram, bot: Bot) -> None:
    """reply_parameters must name a known message (unless allow_sending_without_reply)."""
    with pytest.raises(BadRequest, match=r"(?i)message to be replied not found"):
        await bot.send_message(-100777, "x", reply_parameters=ReplyParameters(message_id=42))
    await bot.send_message(
        -100777, "x", reply_parameters=ReplyParameters(message_id=42, allow_sending_without_reply=True)
    )
    fake.push_update(fake.message_update("question", chat_id=-100777, chat_type="supergroup", message_id=42))
    msg = await bot.send_message(-100777, "answer", reply_parameters=ReplyParameters(message_id=42))
    assert msg.reply_to_message is not None and msg.reply_to_message.text == "question"
    assert msg.message_id == 43  # ids are per chat and shared with incoming messages
    assert msg.chat.type == "supergroup" and msg.chat.title == "Test Group"


async def test_invalid_html_is_rejected(fake: FakeTelegram, bot: Bot) -> None:
    """Broken HTML gets Telegram's "can't parse entities" BadRequest and nothing is sent."""
    with pytest.raises(BadRequest, match=r"(?i)can't parse entities: Unsupported start tag \"br\" at byte offset 8"):
        await bot.send_message(1001, "line one<br>two", parse_mode="HTML")
    with pytest.raises(BadRequest, match=r"(?i)Can't find end tag corresponding to start tag \"b\""):
        await bot.send_message(1001, "<b>bold", parse_mode="HTML")
    with pytest.raises(BadRequest, match=r"(?i)can't parse entities"):
        await bot.send_message(1001, "fish & chips", parse_mode="HTML")
    assert fake.sent == []
    await bot.send_message(1001, "fish & chips")  # plain text: no parsing at all
    assert fake.sent[0]["message"]["text"] == "fish & chips"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<b>x</i>", 'Unmatched end tag at byte offset 4, expected "</b>", found "</i>"'),
        ("<b>a<i>b</b></i>", 'Unmatched end tag at byte offset 8, expected "</i>", found "</b>"'),
        ("</b>", "Unexpected end tag at byte offset 0"),
        ("1 < 2", 'Unsupported start tag "" at byte offset 2'),
        ("é<b", "Unclosed start tag at byte offset 2"),
        ("<a>x</a>", 'Tag "a" must have non-empty attribute "href"'),
        ("<span>x</span>", 'Tag "span" must have class "tg-spoiler"'),
        ("<pre><b>x</b></pre>", 'Tag "b" can\'t be nested inside tag "pre"'),
        ("<code><i>x</i></code>", 'Tag "i" can\'t be nested inside tag "code"'),
        ("<blockquote><blockquote>x</blockquote></blockquote>", 'can\'t be nested inside tag "blockquote"'),
        ("&nbsp;", 'Character "&" at byte offset 0 must be escaped'),
        ("&lt", 'Character "&" at byte offset 0 must be escaped'),
    ],
)
def test_parse_html_errors(text: str, error: str) -> None:
    """Each malformed text fails with a Telegram-like description."""
    with pytest.raises(HtmlError) as info:
        parse_html(text)
    assert error in str(info.value)


def test_parse_html_entities() -> None:
    """Valid HTML becomes plain text plus entities with UTF-16 offsets."""
    text, entities = parse_html(
        '😀 <b>bold <i>both</i></b> <a href="https://e.x/?a=1&amp;b=2">link</a> &#x1F600;&#33;&quot;'
        '<pre><code class="language-py">x = 1</code></pre><blockquote expandable>q</blockquote>'
        '<span class="tg-spoiler">s</span><tg-spoiler>t</tg-spoiler><tg-emoji emoji-id="5368">👍</tg-emoji>'
    )
    assert text == '😀 bold both link 😀!"x = 1qst👍'
    assert entities == [
        {"offset": 3, "length": 9, "type": "bold"},
        {"offset": 8, "length": 4, "type": "italic"},
        {"offset": 13, "length": 4, "type": "text_link", "url": "https://e.x/?a=1&b=2"},
        {"offset": 22, "length": 5, "type": "pre", "language": "py"},
        {"offset": 27, "length": 1, "type": "expandable_blockquote"},
        {"offset": 28, "length": 1, "type": "spoiler"},
        {"offset": 29, "length": 1, "type": "spoiler"},
        {"offset": 30, "length": 2, "type": "custom_emoji", "custom_emoji_id": "5368"},
    ]
    assert parse_html("fish & chips", strict_entities=False) == ("fish & chips", [])


async def test_length_limit_counts_utf16(fake: FakeTelegram, bot: Bot) -> None:
    """4096 UTF-16 units (emoji count 2) pass; one more fails; tags and entities do not count."""
    emoji = "😀" * 2048
    assert utf16_len(emoji) == 4096
    await bot.send_message(1001, emoji)
    await bot.send_message(1001, "<b>" + "&amp;" * 4096 + "</b>", parse_mode="HTML")
    for too_long in (emoji + "x", "x" * 4097):
        with pytest.raises(BadRequest, match=r"(?i)message is too long"):
            await bot.send_message(1001, too_long)
    with pytest.raises(BadRequest, match=r"(?i)message text is empty"):
        await bot.send_message(1001, "<b> </b>", parse_mode="HTML")
    assert len(fake.sent) == 2
    assert fake.sent[1]["message"]["text"] == "&" * 4096


async def test_refused_chats_and_a_wrong_token(fake: FakeTelegram, bot: Bot) -> None:
    """refuse_chat answers like Telegram: 403 Forbidden for blocked / never started, 400 for a chat that is gone."""
    fake.refuse_chat(1001, BLOCKED)
    fake.refuse_chat(1002, NOT_STARTED)
    fake.refuse_chat(-100, CHAT_NOT_FOUND)
    with pytest.raises(Forbidden, match="bot was blocked by the user"):
        await bot.send_message(1001, "hi")
    with pytest.raises(Forbidden, match="can't initiate conversation"):
        await bot.send_chat_action(1002, "typing")
    with pytest.raises(BadRequest, match=r"(?i)chat not found"):
        await bot.send_message(-100, "hi")
    await bot.send_message(1003, "others still work")
    assert [s["chat_id"] for s in fake.sent] == [1003]
    with pytest.raises(InvalidToken):  # the fake accepts only its own token…
        async with Bot("124:" + "x" * 35, base_url=fake.base_url):
            pass
    assert fake.token.startswith("123:") and len(fake.token.partition(":")[2]) >= 30  # …which has a real shape


async def test_retry_after_and_unknown_method(fake: FakeTelegram, bot: Bot, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripted 429s surface as RetryAfter (once); unknown methods are 404."""
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # opt in to timedelta retry_after (no deprecation warning)
    fake.fail_next("sendMessage", status=429, retry_after=1)
    with pytest.raises(RetryAfter) as info:
        await bot.send_message(1001, "hi")
    assert info.value.retry_after == timedelta(seconds=1)
    await bot.send_message(1001, "hi")
    assert [s["text"] for s in fake.sent] == ["hi"]
    assert [m for m, _ in fake.calls].count("sendMessage") == 2
    with pytest.raises(EndPointNotFound):
        await bot.do_api_request("noSuchMethod")


async def test_edits_drafts_actions_commands(fake: FakeTelegram, bot: Bot) -> None:
    """Edits (incl. not-modified), drafts, chat actions, commands and deletes behave like Telegram."""
    msg = await bot.send_message(1001, "one", message_thread_id=5)
    assert msg.message_thread_id == 5 and msg.from_user is not None and msg.from_user.id == fake.bot_id
    await bot.edit_message_text("<b>two</b>", chat_id=1001, message_id=msg.message_id, parse_mode="HTML")
    assert fake.sent[0]["text"] == "<b>two</b>" and fake.sent[0]["message"]["text"] == "two"
    with pytest.raises(BadRequest, match=r"(?i)message is not modified"):
        await bot.edit_message_text("<b>two</b>", chat_id=1001, message_id=msg.message_id, parse_mode="HTML")
    with pytest.raises(BadRequest, match=r"(?i)message to edit not found"):
        await bot.edit_message_text("x", chat_id=1001, message_id=999)
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("b", callback_data="x" * 65)]])
    with pytest.raises(BadRequest, match=r"(?i)BUTTON_DATA_INVALID"):
        await bot.send_message(1001, "k", reply_markup=keyboard)

    assert await bot.send_message_draft(1001, draft_id=7, text="<i>thinking</i>", parse_mode="HTML")
    assert fake.drafts == [{"chat_id": 1001, "draft_id": 7, "text": "<i>thinking</i>", "parse_mode": "HTML"}]
    with pytest.raises(BadRequest, match=r"(?i)can't parse entities"):
        await bot.send_message_draft(1001, draft_id=7, text="<i>thinking", parse_mode="HTML")

    await bot.send_chat_action(1001, "typing")
    assert fake.chat_actions == [{"chat_id": 1001, "action": "typing"}]
    await bot.set_my_commands([("start", "Start the bot"), ("help", "Help")])
    assert fake.commands == [
        {"command": "start", "description": "Start the bot"},
        {"command": "help", "description": "Help"},
    ]
    assert [c.command for c in await bot.get_my_commands()] == ["start", "help"]
    with pytest.raises(BadRequest, match=r"(?i)BOT_COMMAND_INVALID"):
        await bot.set_my_commands([("Bad-Name", "x")])

    assert await bot.delete_message(1001, msg.message_id)
    assert fake.sent[0]["deleted"] is True
    with pytest.raises(BadRequest, match=r"(?i)message to delete not found"):
        await bot.delete_message(1001, msg.message_id)
    with pytest.raises(BadRequest, match=r"(?i)query is too old"):
        await bot.answer_callback_query("12345")


async def test_long_poll_offset_and_fast_stop(fake: FakeTelegram, bot: Bot) -> None:
    """getUpdates honours offset, returns early on a push and is released at once by stop()."""
    first = fake.push_update(fake.message_update("one"))
    fake.push_update(fake.message_update("two"))
    updates = await bot.get_updates(timeout=0)
    assert [u.update_id for u in updates] == [first, first + 1]
    assert [u.update_id for u in await bot.get_updates(offset=first + 1, limit=5, timeout=0)] == [first + 1]

    started = time.monotonic()
    poll = asyncio.create_task(bot.get_updates(offset=first + 2, timeout=10))
    await fake.wait_for(lambda: sum(m == "getUpdates" for m, _ in fake.calls) == 3)
    third = fake.push_update(fake.message_update("three"))
    assert [u.update_id for u in await poll] == [third]
    assert time.monotonic() - started < 1

    poll = asyncio.create_task(bot.get_updates(offset=third + 1, timeout=10))
    await fake.wait_for(lambda: sum(m == "getUpdates" for m, _ in fake.calls) == 4)
    async with Bot(fake.token, base_url=fake.base_url) as second:
        assert await second.get_updates(offset=third + 1, timeout=0) == ()
    with pytest.raises(Conflict):  # like Telegram: a newer getUpdates terminates the waiting one
        await poll

    poll = asyncio.create_task(bot.get_updates(offset=third + 1, timeout=10))
    await fake.wait_for(lambda: sum(m == "getUpdates" for m, _ in fake.calls) == 6)
    started = time.monotonic()
    await fake.stop()
    assert await poll == ()
    assert time.monotonic() - started < 1


async def test_dropped_get_updates_recovers(fake: FakeTelegram, allowed_errors: list[str]) -> None:
    """After a dropped getUpdates connection PTB logs the network error, retries and gets the update."""
    allowed_errors.append("Exception happened while polling for updates.")
    fake.drop_next_get_updates()
    app = await _running_app(fake)
    try:
        fake.push_update(fake.message_update("still there?"))
        sent = await fake.wait_sent(1, timeout=4)
        assert sent[0]["message"]["text"] == "You said: still there?"
        assert fake.get_updates_ok >= 1
    finally:
        await _shutdown(app)
