"""TELEGRAM_API_BASE_URL: a Bot API server's address works with or without PTB's /bot, and a value that cannot be a
URL is a configuration error (exit 2, one line naming the variable), not a server that "cannot be reached"."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.telegram import TelegramAdapter, config_problem
from adapters.telegram.config import bot_api_url
from core.settings import EXIT_CONFIG
from tests.conftest import MakeCore, MakeSettings
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import TOKEN, FakeTelegram
from tests.test_console import bot_cli

JUNK = [
    "localhost:8081 with spaces",
    "http://localhost:8081 with spaces",
    "localhost:8081",  # no scheme: http or https?
    "ftp://x",
    "http://",
    "http://:8081/bot",
    "http://localhost:80811",
    "http://localhost:port",
    "http://[::1",
    "http://localhost:8081/bot?x=1",
]


@pytest.mark.parametrize("url", JUNK)
def test_a_value_that_cannot_be_a_url_is_one_line_naming_the_variable(make_settings: MakeSettings, url: str) -> None:
    problem = config_problem(make_settings(TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_BASE_URL=url))
    assert problem is not None and problem.startswith("TELEGRAM_API_BASE_URL: ") and "\n" not in problem
    assert "http://localhost:8081" in problem and TOKEN.partition(":")[2] not in problem


@pytest.mark.parametrize(
    "url", ["http://localhost:8081", "http://localhost:8081/", "http://localhost:8081/bot", "https://tg.example/api/"]
)
def test_a_bot_api_servers_address_is_no_problem(make_settings: MakeSettings, url: str) -> None:
    assert config_problem(make_settings(TELEGRAM_BOT_TOKEN=TOKEN, TELEGRAM_API_BASE_URL=url)) is None


def test_the_token_goes_after_bot_whichever_way_the_url_is_given() -> None:
    assert bot_api_url(None) == "https://api.telegram.org/bot"
    for url in (
        "http://localhost:8081",
        "http://localhost:8081/",
        "http://localhost:8081/bot",
        "http://localhost:8081/bot/",
    ):
        assert bot_api_url(url) == "http://localhost:8081/bot"
    assert bot_api_url("https://tg.example/api") == "https://tg.example/api/bot"  # a server behind a path


@pytest.mark.parametrize("form", ["{origin}", "{origin}/", "{origin}/bot", "{origin}/bot/"])
async def test_the_adapter_answers_with_the_url_given_either_way(
    make_core: MakeCore, tg: FakeTelegram, fake_llm: FakeOpenAI, form: str
) -> None:
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=form.format(origin=tg.origin))
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    await adapter.start()
    try:
        fake_llm.script(Reply(text="hello"))
        tg.push_update(tg.message_update("hi", user_id=1001))
        [sent] = await tg.wait_sent(1)
        assert sent["text"] == "hello"
    finally:
        await adapter.stop()


async def test_a_junk_url_exits_2_before_anything_starts(fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    env = {"LLM_BASE_URL": fake_llm.base_url, "TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_API_BASE_URL": "ftp://x"}
    rc, out, err = await bot_cli("run", env=env, cwd=tmp_path)  # no DATABASE_URL: embedded would start
    assert rc == EXIT_CONFIG and out == ""
    assert err.count("\n") == 1 and err.startswith("TELEGRAM_API_BASE_URL: must start with http:// or https://")
    assert list(tmp_path.iterdir()) == []  # nothing was started
