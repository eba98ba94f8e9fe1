"""Tests for the fake Telegram Bot API driven by the real python-telegram-bot."""

from __future__ import annotations

import asyncio
import html
import time
from collections import deque
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from aiohttp import web
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
    SECRET_HEADER,
    FakeTelegram,
    HtmlError,
    parse_html,
    utf16_len,
)
from tests.loopback import LoopbackServer

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
    fake.fail_next("sendMessage", status=429, retry_after=1, after=1)  # the next call goes through, then one fails
    await bot.send_message(1001, "let through")
    with pytest.raises(RetryAfter):
        await bot.send_message(1001, "held back")
    await bot.send_message(1001, "fine again")
    assert [s["text"] for s in fake.sent] == ["hi", "let through", "fine again"]
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
    assert time.monotonic() - started < 5  # woken by the update, not by its 10 s timeout

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
    assert time.monotonic() - started < 5  # woken by the stop, not by its 10 s timeout


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


# ---------------------------------------------------------------------------------------------------------
# webhook mode

SECRET = "s3cret_Token-1"


class Receiver(LoopbackServer):
    """A bot's webhook endpoint: checks the secret header, records updates, answers scripted statuses."""

    def __init__(self, secret: str = SECRET) -> None:
        """Answer 200 to POST /hook with the right secret (403 otherwise) unless `statuses` says else."""
        super().__init__()
        self.secret = secret
        self.received: list[tuple[int, str | None]] = []  # (update_id, secret header) of accepted POSTs
        self.statuses: deque[int] = deque()  # answers for the next accepted POSTs (then 200)
        self.held: list[int] = []  # update ids of POSTs waiting for `release`
        self.release: asyncio.Event | None = None  # when set to an Event, POSTs wait for it before answering
        self.in_flight = 0
        self.peak = 0
        self._app.router.add_post("/hook", self._hook)

    @property
    def url(self) -> str:
        """The webhook URL to set."""
        return f"{self.origin}/hook"

    def ids(self) -> list[int]:
        """Update ids of the accepted POSTs, in order."""
        return [update_id for update_id, _ in self.received]

    async def _hook(self, request: web.Request) -> web.Response:
        """One webhook POST."""
        if request.headers.get(SECRET_HEADER) != self.secret:
            return web.Response(status=403)
        update = await request.json()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if self.release is not None:
                self.held.append(update["update_id"])
                self._notify()
                await self.release.wait()
            status = self.statuses.popleft() if self.statuses else 200
            if status == 200:
                self.received.append((update["update_id"], request.headers.get(SECRET_HEADER)))
            return web.Response(status=status)
        finally:
            self.in_flight -= 1
            self._notify()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A started webhook receiver on 127.0.0.1."""
    async with Receiver() as server:
        yield server


async def test_set_webhook_is_checked_like_telegram(fake: FakeTelegram, bot: Bot) -> None:
    """Bad URLs and secrets get Telegram's 400s; max_connections is clamped; a 2nd setWebhook within 1 s is a 429."""
    fake.set_webhook_every = 0
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("https://exa mple.com/hook", {}, "invalid webhook URL specified"),
        ("https://127.0.0.1:8443/hook", {"secret_token": "a" * 257}, "secret token is too long"),
        ("https://127.0.0.1:8443/hook", {"secret_token": "no spaces"}, "secret token contains unallowed characters"),
        ("https://127.0.0.1:8443/hook", {"secret_token": "base64+/="}, "secret token contains unallowed characters"),
        ("http://bot.example.com/hook", {}, "bad webhook: An HTTPS URL must be provided for webhook"),
        ("https://bot.example.com:8080/hook", {}, "bad webhook: Webhook can be set up only on ports 80, 88, 443"),
        ("https://bot.example.com/hook", {}, "bad webhook: Failed to resolve host"),
    ]
    for url, extra, error in cases:
        with pytest.raises(BadRequest, match=f"(?i){error}"):
            await bot.set_webhook(url, **extra)
        assert fake.webhook is None

    assert await bot.set_webhook("http://127.0.0.1:9/hook", secret_token="a" * 256, max_connections=1000)
    info = await bot.get_webhook_info()
    assert (info.url, info.max_connections, info.ip_address) == ("http://127.0.0.1:9/hook", 100, "127.0.0.1")
    assert info.allowed_updates == () and not info.has_custom_certificate and info.pending_update_count == 0
    fake.route_webhook("https://bot.example.com", "http://127.0.0.1:9")
    assert await bot.set_webhook("https://bot.example.com/tg?x=1", max_connections=0)
    assert fake.webhook is not None and fake.webhook["max_connections"] == 1
    assert fake.webhook["url"] == "https://bot.example.com/tg?x=1" and fake.webhook["secret_token"] == ""
    with pytest.raises(BadRequest, match=r"(?i)secret token contains unallowed characters"):
        await bot.set_webhook("https://bot.example.com/tg", secret_token="a:b")
    assert fake.webhook is None  # like Telegram: the old webhook is closed before the new one is checked

    fake.set_webhook_every = 1.0  # Telegram's limit: the last setWebhook was a moment ago
    with pytest.raises(RetryAfter):
        await bot.set_webhook("http://127.0.0.1:9/b")
    assert fake.webhook is None
    assert await bot.delete_webhook()  # not limited
    assert (await bot.get_webhook_info()).url == ""


async def test_webhook_delivers_in_order_with_the_secret(fake: FakeTelegram, bot: Bot, receiver: Receiver) -> None:
    """Pushed updates are POSTed in order with the secret header; unwanted types are dropped; info is real."""
    early = fake.push_update(fake.message_update("sent while polling"))
    assert await bot.set_webhook(
        receiver.url, secret_token=SECRET, allowed_updates=["message", "callback_query"], max_connections=5
    )
    assert fake.webhook == {
        "url": receiver.url,
        "secret_token": SECRET,
        "max_connections": 5,
        "allowed_updates": ["message", "callback_query"],
        "drop_pending_updates": False,
        "ip_address": None,
    }
    chat_a = [fake.push_update(fake.message_update(f"a{i}", chat_id=1)) for i in range(4)]
    chat_b = [fake.push_update(fake.message_update(f"b{i}", chat_id=2)) for i in range(3)]
    edited = fake.message_update("edited")
    edited["edited_message"] = edited.pop("message")
    fake.push_update(edited)  # not in allowed_updates: Telegram never sends it
    await fake.wait_webhook_idle()
    ids = receiver.ids()
    assert sorted(ids) == sorted([early, *chat_a, *chat_b])
    assert [i for i in ids if i in chat_a] == chat_a and [i for i in ids if i in chat_b] == chat_b
    assert {secret for _, secret in receiver.received} == {SECRET}
    assert fake.webhook_failures == 0 and all(status == 200 for _, status in fake.webhook_attempts)
    info = await bot.get_webhook_info()
    assert info.url == receiver.url and info.pending_update_count == 0 and info.max_connections == 5
    assert info.allowed_updates == ("message", "callback_query") and info.last_error_date is None
    with pytest.raises(Conflict, match="can't use getUpdates method while webhook is active"):
        await bot.get_updates(timeout=0)


async def test_webhook_one_request_per_chat_and_max_connections(
    fake: FakeTelegram, bot: Bot, receiver: Receiver
) -> None:
    """A chat's next update waits for the 2xx of its previous one; at most max_connections POSTs are open."""
    receiver.release = asyncio.Event()
    assert await bot.set_webhook(receiver.url, secret_token=SECRET, max_connections=2)
    first_a = fake.push_update(fake.message_update("a1", chat_id=1))
    fake.push_update(fake.message_update("a2", chat_id=1))
    first_b = fake.push_update(fake.message_update("b1", chat_id=2))
    fake.push_update(fake.message_update("c1", chat_id=3))
    await receiver.wait_for(lambda: len(receiver.held) == 2)
    assert receiver.held == [first_a, first_b]  # not a2 (same chat as a1), not c1 (two already open)
    assert (await bot.get_webhook_info()).pending_update_count == 4
    receiver.release.set()
    await fake.wait_webhook_idle()
    assert receiver.peak == 2 and fake.webhook_peak_in_flight == 2
    assert receiver.ids().index(first_a) < receiver.ids().index(first_a + 1)


async def test_webhook_retries_until_a_2xx(fake: FakeTelegram, bot: Bot, receiver: Receiver) -> None:
    """Errors and refused connections are retried (the chat's next update waits) and shown in getWebhookInfo."""
    fake.set_webhook_every = 0
    receiver.statuses.extend([500, 503])
    assert await bot.set_webhook(receiver.url, secret_token=SECRET)
    first = fake.push_update(fake.message_update("one"))
    second = fake.push_update(fake.message_update("two"))
    await fake.wait_webhook_idle()
    assert fake.webhook_attempts == [(first, 500), (first, 503), (first, 200), (second, 200)]
    assert receiver.ids() == [first, second] and fake.webhook_failures == 2
    info = await bot.get_webhook_info()
    assert info.last_error_message == "Wrong response from the webhook: 503 Service Unavailable"
    assert info.last_error_date is not None

    gone = Receiver()
    await gone.start()
    gone_url = gone.url
    await gone.stop()
    assert await bot.set_webhook(gone_url, secret_token=SECRET)
    third = fake.push_update(fake.message_update("three"))
    await fake.wait_for(lambda: fake.webhook_failures >= 5, what="three refused connections")
    info = await bot.get_webhook_info()
    assert info.last_error_message == "Connection refused" and info.pending_update_count == 1
    assert await bot.set_webhook(receiver.url, secret_token=SECRET)  # a new URL gets what is still pending
    await fake.wait_webhook_idle()
    assert receiver.ids() == [first, second, third]
    assert (await bot.get_webhook_info()).last_error_date is None  # a new webhook starts without errors


async def test_wrong_secret_and_redelivery(fake: FakeTelegram, bot: Bot, receiver: Receiver) -> None:
    """post_webhook sends any secret once (a wrong one gets the receiver's 403); redeliver repeats an update."""
    with pytest.raises(RuntimeError, match="no webhook"):
        await fake.post_webhook(fake.message_update("x"), secret=SECRET)
    assert await bot.set_webhook(receiver.url, secret_token=SECRET)
    forged = fake.message_update("forged")
    assert await fake.post_webhook(forged, secret="wrong") == 403
    assert await fake.post_webhook(forged, secret=None) == 403
    assert receiver.received == [] and fake.webhook_attempts == [] and fake.webhook_failures == 0
    assert isinstance(forged["update_id"], int)

    update_id = fake.push_update(fake.message_update("hello"))
    await fake.wait_webhook_idle()
    assert await fake.redeliver(update_id) == 200
    assert receiver.ids() == [update_id, update_id]
    assert fake.webhook_attempts == [(update_id, 200), (update_id, 200)]
    with pytest.raises(KeyError):
        await fake.redeliver(update_id + 1)


async def test_delete_webhook_goes_back_to_polling(fake: FakeTelegram, bot: Bot, receiver: Receiver) -> None:
    """setWebhook ends a waiting long poll; deleteWebhook hands undelivered updates to getUpdates (or drops them)."""
    poll = asyncio.create_task(bot.get_updates(timeout=10))
    await fake.wait_for(lambda: any(m == "getUpdates" for m, _ in fake.calls))
    assert await bot.set_webhook(receiver.url, secret_token=SECRET)
    with pytest.raises(Conflict, match="terminated by setWebhook request"):
        await poll

    receiver.release = asyncio.Event()
    update_id = fake.push_update(fake.message_update("in flight"))
    await receiver.wait_for(lambda: receiver.held == [update_id])
    assert await bot.delete_webhook()  # the open POST is abandoned without a 2xx
    assert fake.webhook is None
    assert [u.update_id for u in await bot.get_updates(timeout=0)] == [update_id]
    assert await bot.get_updates(offset=update_id + 1, timeout=0) == ()

    fake.push_update(fake.message_update("dropped"))
    assert (await bot.get_webhook_info()).pending_update_count == 1
    assert await bot.delete_webhook(drop_pending_updates=True)
    assert (await bot.get_webhook_info()).pending_update_count == 0
    receiver.release.set()


async def test_stop_cancels_delivery(receiver: Receiver) -> None:
    """stop() ends a delivery that is retrying without leaving a task behind."""
    fake = FakeTelegram()
    await fake.start()
    try:
        async with Bot(fake.token, base_url=fake.base_url) as bot:
            assert await bot.set_webhook(receiver.url, secret_token="not-the-receivers")
        fake.push_update(fake.message_update("refused"))
        await fake.wait_for(lambda: fake.webhook_failures >= 3, what="three 403s")
    finally:
        await fake.stop()
    names = {getattr(task.get_coro(), "__qualname__", "") for task in asyncio.all_tasks()}
    assert not names & {"FakeTelegram._deliver", "FakeTelegram._attempt"}
    assert fake.webhook_attempts[0][1] == 403 and receiver.received == []
