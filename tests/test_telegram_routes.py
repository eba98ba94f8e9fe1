"""Issue 20, Telegram: the token check before anything starts, the command menu from the catalogue, and the routes
a stored update takes (decided by the adapter, handed straight to the core with its Delivery)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from telegram import Update

from adapters.telegram import TelegramAdapter, config_problem
from adapters.telegram.routes import command_of, starts_with_command
from core import COMMANDS, NOT_YOUR_BUTTON, TEXT_ONLY, Delivery
from core.commands import HELP
from tests.conftest import MakeCore, MakeSettings
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram

GROUP: dict[str, Any] = {"chat_id": -100, "chat_type": "supergroup"}
REPO = Path(__file__).resolve().parent.parent


# ---- config_problem: the token's shape, checked before the database starts


def test_a_well_formed_token_or_none_is_no_problem(make_settings: MakeSettings) -> None:
    assert config_problem(make_settings()) is None
    assert config_problem(make_settings(TELEGRAM_BOT_TOKEN="123456:AAF" + "q" * 32)) is None


@pytest.mark.parametrize("token", ["123:TEST", "not a token", "123456:short", "abc:" + "x" * 35, "12 :" + "A" * 35])
def test_a_malformed_token_is_one_line_naming_the_variable(make_settings: MakeSettings, token: str) -> None:
    problem = config_problem(make_settings(TELEGRAM_BOT_TOKEN=token))
    assert problem is not None and problem.startswith("TELEGRAM_BOT_TOKEN: ") and "@BotFather" in problem
    assert "\n" not in problem and token not in problem


def test_the_check_does_not_load_python_telegram_bot() -> None:
    code = (
        "import sys, adapters.telegram as t; assert t.config_problem; print('telegram' in sys.modules); "
        "t.TelegramAdapter; print('telegram' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    out = done.stdout.split()
    assert out == ["False", "True"]  # loaded on first use of the adapter


# ---- which command a message asks for


def message(text: str) -> Any:
    """A parsed private message with the entities Telegram gives `text` (the bot is @test_bot)."""
    return Update.de_json({"update_id": 1, **FakeTelegram().message_update(text)}, None).message


@pytest.mark.parametrize(
    ("text", "name", "args"),
    [
        ("/tasks", "tasks", ""),
        ("/start", "help", ""),
        ("/HELP@Test_Bot", "help", ""),
        ("/timezone@test_bot  Asia/Tokyo", "timezone", "  Asia/Tokyo"),
        ("/memory forget human 2", "memory", " forget human 2"),
    ],
)
def test_a_command_of_the_catalogue_by_name_alias_or_addressed_to_this_bot(text: str, name: str, args: str) -> None:
    msg = message(text)
    assert starts_with_command(msg)
    found = command_of(msg, "test_bot")
    assert found is not None and (found[0].name, found[1]) == (name, args)


@pytest.mark.parametrize("text", ["/tasks@other_bot", "/nope", "/start@other_bot now"])
def test_another_bots_command_or_an_unknown_one_is_none(text: str) -> None:
    msg = message(text)
    assert starts_with_command(msg) and command_of(msg, "test_bot") is None


@pytest.mark.parametrize("text", ["hello /tasks", "tasks", ""])
def test_text_not_starting_with_a_command_is_no_command(text: str) -> None:
    assert not starts_with_command(message(text))


# ---- the running adapter


class Seen:
    """The Incoming and Delivery of every Core.handle call."""

    def __init__(self) -> None:
        """Nothing handled yet."""
        self.calls: list[tuple[Any, Delivery | None]] = []


Running = tuple[TelegramAdapter, Seen]


@pytest.fixture
async def running(tg: FakeTelegram, make_core: MakeCore, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Running]:
    """The adapter against the fake (PTB's Application may not be built: routing needs none); Core.answer spied."""

    def no_application(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("PTB's Application is not needed")

    monkeypatch.setattr("telegram.ext.Application.__init__", no_application)
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, ALLOWED_USERS="*")
    seen, answer = Seen(), core.answer

    def spy(inc: Any, reply: Any, **kw: Any) -> Any:
        seen.calls.append((inc, kw.get("delivery")))
        return answer(inc, reply, **kw)

    monkeypatch.setattr(core, "answer", spy)
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    await adapter.start()
    try:
        yield adapter, seen
    finally:
        await adapter.stop()


async def test_the_menu_is_the_catalogue(running: Running, tg: FakeTelegram) -> None:
    expected = [{"command": n, "description": c.summary} for c in COMMANDS for n in (*c.aliases, c.name)]
    assert tg.commands == expected


async def test_a_message_goes_straight_to_the_core_with_its_delivery(
    running: Running, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    _, seen = running
    fake_llm.script(Reply(text="hi there"))
    tg.push_update(tg.message_update("hello", message_id=77))
    [sent] = await tg.wait_sent(1)
    assert sent["text"] == "hi there"
    [(inc, delivery)] = seen.calls
    assert inc.text == "hello" and inc.message_id == "123:77"  # the bot's id, then the message's
    assert isinstance(delivery, Delivery) and delivery.attempt == 1 and not delivery.redelivered
    assert isinstance(delivery.update, Update) and delivery.update.message is not None
    assert delivery.update.message.message_id == 77


async def test_stop_lets_a_running_answer_go_out_before_closing_the_connections(
    running: Running, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    adapter, seen = running
    fake_llm.script(Reply(text="late but whole", delay=0.2))
    tg.push_update(tg.message_update("take your time"))
    await tg.wait_for(lambda: bool(seen.calls))
    await adapter.stop()  # no core drain first (tests stop adapters so): the turn still needs the bot to answer
    assert [s["text"] for s in tg.sent] == ["late but whole"]


async def after_a_normal_turn(tg: FakeTelegram, fake_llm: FakeOpenAI) -> list[dict[str, Any]]:
    """Send a message that is answered, wait for its answer (the updates pushed before it were handled by then, in
    the chat's order), and return everything sent."""
    fake_llm.script(Reply(text="the marker"))
    tg.push_update(tg.message_update("marker"))
    await tg.wait_for(lambda: any(s["text"] == "the marker" for s in tg.sent))
    return tg.sent


async def test_commands_of_other_bots_unknown_ones_and_messages_of_bots_are_ignored(
    running: Running, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    for text in ("/tasks@other_bot", "/nope", "/help@other_bot please"):
        tg.push_update(tg.message_update(text))
    from_bot = tg.message_update("I am a bot")
    from_bot["message"]["from"]["is_bot"] = True
    tg.push_update(from_bot)
    sent = await after_a_normal_turn(tg, fake_llm)
    assert [s["text"] for s in sent] == ["the marker"] and len(fake_llm.requests) == 1


async def test_start_and_a_command_addressed_to_this_bot_in_a_group_answer(
    running: Running, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    tg.push_update(tg.message_update("/start"))
    [started] = await tg.wait_sent(1)
    tg.push_update(tg.message_update("/Help@test_bot", **GROUP))
    [helped] = (await tg.wait_sent(2))[1:]
    assert started["text"].startswith(HELP[:20]) and helped["text"] == started["text"]
    assert helped["chat_id"] == -100 and fake_llm.requests == []


async def test_service_messages_and_unaddressed_media_are_ignored_addressed_media_get_text_only(
    running: Running, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    sticker = {"sticker": {"file_id": "s", "file_unique_id": "s", "width": 1, "height": 1, "type": "regular"}}
    sticker["sticker"].update(is_animated=False, is_video=False)
    joined = tg.message_update("", **GROUP, extra={"new_chat_members": [{"id": 5, "is_bot": False, "first_name": "Z"}]})
    for update in (joined, tg.message_update("", **GROUP, extra=sticker)):
        del update["message"]["text"]
        tg.push_update(update)
    video_note = {"video_note": {"file_id": "v", "file_unique_id": "v", "length": 240, "duration": 1}}
    addressed = tg.message_update("", **GROUP, reply_to_bot=True, extra=video_note)  # (a sticker: words, a turn)
    del addressed["message"]["text"]
    tg.push_update(addressed)
    [note] = await tg.wait_sent(1)
    assert note["text"] == TEXT_ONLY and note["chat_id"] == -100
    await asyncio.sleep(0.05)
    assert len(tg.sent) == 1 and fake_llm.requests == []


async def test_presses_of_unknown_buttons_are_ignored_and_a_wipe_button_of_someone_else_says_how(
    running: Running, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    [shown] = await after_a_normal_turn(tg, fake_llm)
    tg.push_update(tg.callback_update("other:thing", message=shown))
    tg.push_update(tg.callback_update("mem:wipe:999", message=shown))
    await tg.wait_for(lambda: len(tg.callback_answers) == 1)
    await asyncio.sleep(0.05)
    [answer] = tg.callback_answers
    assert (
        answer["text"]
        == NOT_YOUR_BUTTON.format(how="send /memory wipe")
        == ("This button is not for you: send /memory wipe to erase your own memory.")
    )


async def test_a_failing_button_handler_is_logged_and_the_chat_told(
    running: Running,
    tg: FakeTelegram,
    fake_llm: FakeOpenAI,
    allowed_errors: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    allowed_errors.append("Telegram handler failed")
    [shown] = await after_a_normal_turn(tg, fake_llm)
    tg.fail_next("answerCallbackQuery", status=400, description="Bad Request: the handler's call fails")
    tg.push_update(tg.callback_update("rem:done:1", message=shown))
    [failed] = (await tg.wait_sent(2))[1:]
    assert failed["text"].startswith("Sorry, something went wrong on my side")
    assert any(r.getMessage() == "Telegram handler failed" and r.exc_info for r in caplog.records)
