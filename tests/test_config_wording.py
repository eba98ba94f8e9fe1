"""Configuration errors in one style (`VARIABLE: what is wrong (what to do)`), empty variables as unset, and the
hint shown when the model cannot be used naming what is configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import config_problem, fix_hint
from core.agent.providers import HOW_TO_CONFIGURE
from core.settings import EXIT_CONFIG, EXIT_UNREACHABLE, Settings, SettingsError, StartupError, load_settings
from core.storage.db import check_database, dsn_problem
from core.storage.embedded import start_embedded
from tests.test_console import bot_cli
from tests.test_startup import closed_port

SECRET = "s3cr3t-key"


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No configuration from the environment or a .env in the working directory."""
    monkeypatch.chdir(tmp_path)
    for name in Settings.model_fields:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            {"AGENT_STEP_TIMEOUT": "soon"},
            "AGENT_STEP_TIMEOUT: must be a valid number, unable to parse string as a number (got 'soon')",
        ),
        ({"PORT": "70000"}, "PORT: must be less than or equal to 65535 (got '70000')"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL: must be 'DEBUG', 'INFO', 'WARNING' or 'ERROR' (got 'LOUD')"),
        (
            {"TELEGRAM_WEBHOOK_URL": "ftp://bot.example.com"},
            "TELEGRAM_WEBHOOK_URL: must be the public https:// URL Telegram posts updates to"
            " (e.g. https://bot.example.com/telegram)",
        ),
        (
            {"TELEGRAM_WEBHOOK_SECRET": f"{SECRET} with spaces"},
            "TELEGRAM_WEBHOOK_SECRET: must be 1-256 characters of A-Z, a-z, 0-9, _ and - (Telegram's secret_token)",
        ),
    ],
)
def test_a_settings_error_is_the_variable_then_what_is_wrong(
    clean_env: Path, overrides: dict[str, str], line: str
) -> None:
    with pytest.raises(SettingsError) as failed:
        load_settings(**overrides)
    assert str(failed.value) == line  # no "Invalid configuration:" prefix, never a secret's value


async def test_the_command_line_prints_the_same_line(tmp_path: Path) -> None:
    rc, out, err = await bot_cli("ask", "hi", env={"LLM_API_KEY": SECRET, "AGENT_MAX_STEPS": "many"}, cwd=tmp_path)
    assert (rc, out) == (EXIT_CONFIG, "")
    assert err == "AGENT_MAX_STEPS: must be a valid integer, unable to parse string as an integer (got 'many')\n"


def test_an_empty_default_timezone_is_utc_in_env_file_and_environment(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_env / ".env").write_text("DEFAULT_TIMEZONE=\nAGENT_MAX_STEPS=\nLLM_PROVIDER=\nDATA_DIR=\n")
    s = load_settings()
    assert (s.DEFAULT_TIMEZONE, s.AGENT_MAX_STEPS, s.LLM_PROVIDER, s.DATA_DIR) == ("UTC", 10, "openai", Path(".data"))
    monkeypatch.setenv("DEFAULT_TIMEZONE", "  ")
    assert load_settings().DEFAULT_TIMEZONE == "UTC"
    assert load_settings(DEFAULT_TIMEZONE="").DEFAULT_TIMEZONE == "UTC"
    monkeypatch.setenv("DEFAULT_TIMEZONE", "Europe/Berlin")
    assert load_settings().DEFAULT_TIMEZONE == "Europe/Berlin"


def test_database_url_scheme_names_both_accepted_schemes() -> None:
    assert dsn_problem("mysql://bot@db/bot") == "must start with postgresql:// or postgres:// (got 'mysql://')"
    assert dsn_problem("db.example.com/bot") == "must start with postgresql:// or postgres:// (got no scheme)"
    assert dsn_problem("postgres://bot@db/bot") is None and dsn_problem("postgresql://bot@db/bot") is None


async def test_postgres_scheme_is_tried_and_a_malformed_url_is_said_alike() -> None:
    port = closed_port()
    with pytest.raises(StartupError) as refused:
        await check_database(f"postgres://bot:{SECRET}@127.0.0.1:{port}/bot", timeout=2)
    assert str(refused.value) == f"DATABASE_URL: cannot connect to 127.0.0.1:{port} (connection refused)"
    assert refused.value.exit_code == EXIT_UNREACHABLE
    with pytest.raises(StartupError) as malformed:
        await check_database(f"postgresql://bot:{SECRET}@127.0.0.1:{port}/bot?sslmode=bogus", timeout=2)
    assert str(malformed.value).startswith("DATABASE_URL: is not a valid URL (`sslmode` parameter must be one of")
    assert malformed.value.exit_code == EXIT_CONFIG and SECRET not in str(malformed.value)


def test_embedded_server_failure_is_one_line_naming_what_to_check(tmp_path: Path) -> None:
    data = tmp_path / "not-a-directory"
    data.write_text("")
    with pytest.raises(StartupError) as failed:
        start_embedded(data)
    line = str(failed.value)
    assert line.startswith(f"embedded PostgreSQL: could not start in {data}/pg (") and "\n" not in line
    assert line.endswith("check DATA_DIR, or set DATABASE_URL to use another server)")


def test_no_model_configured_is_one_line_naming_the_key(clean_env: Path) -> None:
    problem = config_problem(load_settings())
    assert problem == f"LLM_API_KEY: not set, and LLM_PROVIDER=openai needs one ({HOW_TO_CONFIGURE})"
    assert config_problem(load_settings(LLM_PROVIDER="ollama")) is None


def test_fix_hint_without_a_model_server_says_how_to_configure_one(clean_env: Path) -> None:
    assert fix_hint(load_settings()) == HOW_TO_CONFIGURE
    assert fix_hint(load_settings(LLM_API_KEY="", LLM_BASE_URL="")) == HOW_TO_CONFIGURE


def test_fix_hint_names_the_configured_server_and_model(clean_env: Path) -> None:
    given = load_settings(LLM_BASE_URL=f"http://me:{SECRET}@10.0.0.5:8000/v1?key={SECRET}", LLM_MODEL="qwen3:8b")
    assert fix_hint(given) == (
        "check that the server at 10.0.0.5:8000 (LLM_BASE_URL) is running, that it needs no key "
        "(else set LLM_API_KEY) and that it serves the model qwen3:8b (LLM_MODEL)"
    )
    keyed = load_settings(LLM_API_KEY=SECRET, LLM_PROVIDER="groq")
    assert fix_hint(keyed) == (
        "check that the server at api.groq.com (LLM_PROVIDER=groq) is running, that LLM_API_KEY is valid there "
        "and that it serves the model llama-3.3-70b-versatile (LLM_MODEL)"
    )
    local = fix_hint(load_settings(LLM_PROVIDER="ollama"))
    assert "localhost:11434 (LLM_PROVIDER=ollama)" in local and "llama3.1" in local
    assert all(SECRET not in hint and "set LLM_API_KEY (and" not in hint for hint in (fix_hint(given), local))


def test_credentials_in_llm_base_url_are_one_line_at_start_without_the_password(clean_env: Path) -> None:
    # the HTTP client would refuse them at the first request, as a failure with a traceback
    problem = config_problem(load_settings(LLM_BASE_URL="http://bob:s3cret@10.0.0.5:8000/v1"))
    assert problem == "LLM_BASE_URL: cannot carry a user name or password (put the key in LLM_API_KEY)"
    assert config_problem(load_settings(LLM_BASE_URL="http://10.0.0.5:8000/v1")) is None


async def test_a_wrong_mcp_config_stops_the_start_with_one_line_naming_server_and_key(tmp_path: Path) -> None:
    """The file is read before anything starts; a variable only in .env is found (the settings read .env too)."""
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"mail": {"url": "https://mail.example/mcp", "acces": "everyone"}}}')
    rc, out, err = await bot_cli("ask", "hi", env={"LLM_API_KEY": SECRET, "MCP_CONFIG": str(config)}, cwd=tmp_path)
    assert (rc, out) == (EXIT_CONFIG, "")
    assert err.startswith("MCP_CONFIG: server 'mail': acces:") and err.count("\n") == 1 and SECRET not in err
    config.write_text('{"mcpServers": {"mail": {"url": "https://mail.example/mcp?key=${MAIL_KEY}"}}}')
    rc, _, err = await bot_cli("ask", "hi", env={"LLM_API_KEY": SECRET, "MCP_CONFIG": str(config)}, cwd=tmp_path)
    assert rc == EXIT_CONFIG and "MAIL_KEY" in err and err.count("\n") == 1
    (tmp_path / ".env").write_text("MAIL_KEY=from-the-env-file\n")
    nowhere = {"DATABASE_URL": f"postgresql://u@127.0.0.1:{closed_port()}/x", "LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    env = {"LLM_API_KEY": SECRET, "MCP_CONFIG": str(config), **nowhere}  # past the checks, nothing on the network
    rc, _, err = await bot_cli("ask", "hi", env=env, cwd=tmp_path)
    assert rc == EXIT_UNREACHABLE and "MCP_CONFIG" not in err, "the variable set only in .env is found"
