"""The first minutes at the command line (issue 32): `bot --help` lists every command and each command says what it
does and what its flags mean; a misspelt setting in `.env` or the environment gets one warning line with the name
meant (never its value) and the start goes on; a slow first start of the embedded database says what it does."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import pytest

from bot.__main__ import build_parser, log_level, main, parse_args, terminal_chat
from bot.platforms import PLATFORMS, configured
from bot.setting_names import NOT_BUILT_YET, known_names, prefixes, unknown_name_lines
from core import Settings
from core.settings import load_settings
from core.storage.embedded import said_if_slow, start_embedded
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_console import bot_cli

SECRET = "123456:s3cr3t-token-value"


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands by name."""
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def help_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What `bot *args` prints (`--help` or `-h` among them), exiting with 0."""
    with pytest.raises(SystemExit) as done:
        main([*args])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_bot_help_lists_every_command_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    listed = help_of(capsys, "--help").partition("\ncommands:\n")[2].splitlines()
    names = list(commands(build_parser()))
    assert len(listed) == 1 + len(names), listed  # COMMAND, then one line each
    for name, line in zip(names, listed[1:], strict=True):
        assert re.fullmatch(rf"    {name} +\S.*", line), line
    assert parse_args([]).command is None, "`bot` alone runs the bot"


def test_each_command_says_what_it_does_and_every_flag_has_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for name, command in commands(parser).items():
        assert command.description, f"bot {name} -h has no description"
        flags = [a for a in command._actions if not isinstance(a, argparse._HelpAction)]
        assert [a.dest for a in flags if not a.help] == [], f"bot {name}: flags without help"
    assert all(a.help for a in parser._actions if not isinstance(a, argparse._SubParsersAction))
    serve = help_of(capsys, "serve", "-h")
    assert "--host HOST" in serve and "--port PORT" in serve and "127.0.0.1" in serve


def test_unknown_names_get_one_line_each_with_the_name_meant_never_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(
        f"TELEGRAM_TOKEN={SECRET}\n{SECRET}\nllm_api_key=sk-x\nMAIL_KEY=x\nWEB_SEARCH_PROVIDER=searxng\n", "utf-8"
    )
    environ = {
        "LLM_PROVIDR": "groq",
        "TELEGRAM_TOKEN": SECRET,
        "USER_DAILY_TOKEN": "5000",
        "HOME": "/root",  # not one of the bot's prefixes
        "OPENAI_ORG_ID": "org",  # the openai SDK's, not ours
        "BOT_API_TOKEN": "x",  # bot ask --server
        "BOT_RESTART_DELAY": "1",  # bot/loop.sh
        "WEB_CONCURRENCY": "2",  # set by a PaaS
        "TELEGRAM_BOT_SERVICE_HOST": "10.0.0.1",  # Kubernetes, for a service named telegram-bot
        "TELEGRAM_BOT_PORT_8080_TCP_ADDR": "10.0.0.1",
        "SLACK_BOT_TOKEN": "xoxb",  # a setting (issue 36)
        "MATRIX_HOMESERVER": "x",  # named for an issue not built yet
        "discord_bot_token": "x",  # the settings read names in any case
    }
    lines = unknown_name_lines(environ, Path(".env"), also_read={"MAIL_KEY"})  # MCP_CONFIG's ${MAIL_KEY}
    assert lines == [
        ".env: a line that is not NAME=value is ignored",
        "LLM_PROVIDR: not a setting of the bot, ignored (set in the environment; did you mean LLM_PROVIDER?)",
        "TELEGRAM_TOKEN: not a setting of the bot, ignored (set in .env and the environment; did you mean "
        "TELEGRAM_BOT_TOKEN?)",
        "USER_DAILY_TOKEN: not a setting of the bot, ignored (set in the environment; did you mean USER_DAILY_TOKENS?)",
    ]
    assert unknown_name_lines({}, Path("no-such.env")) == []


def test_the_prefixes_come_from_the_settings_and_the_names_not_built_yet_are_no_settings() -> None:
    found = prefixes(known_names())
    assert {"TELEGRAM_", "DISCORD_", "LLM_", "MCP_", "WEB_", "USER_", "BOT_", "SLACK_"} <= set(found)
    assert not {"OPENAI_", "DATABASE_", "DEFAULT_", "LOG_"} & set(found), "a word one name has may be another's"
    assert sorted(NOT_BUILT_YET & set(Settings.model_fields)) == [], "built: take it off NOT_BUILT_YET"


async def test_a_misspelt_setting_is_warned_about_and_the_start_goes_on(
    fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="Hi!"))
    (tmp_path / ".env").write_text(f"TELEGRAM_TOKEN={SECRET}\n", "utf-8")
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url, "LLM_PROVIDR": "groq"}
    code, out, err = await bot_cli("ask", "hi", env=env, cwd=tmp_path)
    assert (code, out) == (0, "Hi!\n"), err
    assert err == (
        "LLM_PROVIDR: not a setting of the bot, ignored (set in the environment; did you mean LLM_PROVIDER?)\n"
        "TELEGRAM_TOKEN: not a setting of the bot, ignored (set in .env; did you mean TELEGRAM_BOT_TOKEN?)\n"
    )


def test_a_slow_start_of_the_embedded_database_says_what_it_does_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    for doing in (
        f"Setting up the local database in {data / 'pg'} (first start only)…",
        "Starting the local database…",
    ):
        server = start_embedded(data, say_after_s=0)  # a start slower than 0 s, however fast the machine
        try:
            assert capsys.readouterr() == ("", doing + "\n")
        finally:
            server.stop()
    with said_if_slow("Starting the local database…", 60):  # a fast step says nothing
        pass
    assert capsys.readouterr() == ("", "")


PLATFORM_SETTINGS = {  # each platform's settings alone
    "telegram": {"TELEGRAM_BOT_TOKEN": "123:abc"},
    "discord": {"DISCORD_BOT_TOKEN": "x" * 30},
    "slack": {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"},
    "matrix": {"MATRIX_HOMESERVER": "https://m.example", "MATRIX_USER_ID": "@b:m.example", "MATRIX_PASSWORD": "pw"},
}


@pytest.mark.parametrize("name", [p.name for p in PLATFORMS])
def test_any_one_platform_alone_runs_it_not_the_terminal_chat(name: str) -> None:
    settings = load_settings(LLM_API_KEY="sk-x", **PLATFORM_SETTINGS[name])
    assert [p.name for p in configured(settings)] == [name]
    assert not terminal_chat(parse_args([]), settings) and log_level(settings, debug=False) == logging.INFO
    bare = load_settings(LLM_API_KEY="sk-x")
    assert terminal_chat(parse_args([]), bare) and log_level(bare, debug=False) == logging.WARNING
