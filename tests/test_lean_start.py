"""What a start loads (issue 35): `import bot.__main__` loads neither a platform's library nor the web server nor any
optional subsystem, nor the openai SDK; a Telegram polling process, after start-up and a text turn, has not loaded the
web server, Discord, Slack, MCP, the document and image readers or the web page reader; `bot serve` has loaded neither
platform nor those readers; the SDK loads only when a model is configured. Each runs as a real `python -m bot` (the
bench/cold_start.py figures are what this keeps)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_slack import FakeSlack
from tests.fake_telegram import FakeTelegram
from tests.test_console import bot_cli

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
# loaded only by the first file, image, MCP server, page read, web search or capability that needs them
OPTIONAL = {"pypdf", "docx", "PIL", "charset_normalizer", "mcp", "trafilatura", "lxml", "ddgs", "jsonschema"}
WEB_SERVER = {"fastapi", "uvicorn", "starlette"}
PLATFORMS = {"telegram", "discord", "slack_sdk", "mautrix"}
# the child: `python -m bot` as usual, plus a thread that prints the packages loaded when a line arrives on stdin
PROBE = """
import json, os, sys, threading

def report() -> None:
    sys.stdin.readline()
    print("LOADED " + json.dumps(sorted({m.split(".")[0] for m in list(sys.modules)})), flush=True)
    os._exit(0)

threading.Thread(target=report, daemon=True).start()
from bot.__main__ import main
main(sys.argv[1:])
"""


def loaded_by_import() -> set[str]:
    """The top-level packages a fresh interpreter has after `import bot.__main__`."""
    code = "import bot.__main__, sys; print(' '.join({m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_importing_the_command_line_loads_no_platform_web_server_or_optional_part() -> None:
    loaded = loaded_by_import()
    assert loaded & (OPTIONAL | WEB_SERVER | PLATFORMS | {"httpx", "openai"}) == set()
    assert "core" in loaded and "asyncpg" in loaded  # the probe does see what is imported


Ready = Callable[[asyncio.StreamReader], Awaitable[str]]


async def loaded_after(
    args: list[str], env: dict[str, str], ready: Ready, turn: Callable[[str], Awaitable[None]]
) -> set[str]:
    """Start `python -m bot *args` with the probe, wait for `ready(its stdout)`, run `turn(what ready said)`, and
    return the packages it has loaded."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_", "SLACK_", "MCP_"))
    }
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", PROBE, *args),
        env={**base, "PYTHONPATH": str(ROOT), "ALLOWED_USERS": "*", **env},
        cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        said = await asyncio.wait_for(ready(proc.stdout), START_TIMEOUT_S)
        await asyncio.wait_for(turn(said), START_TIMEOUT_S)
        proc.stdin.write(b"report\n")
        await proc.stdin.drain()
        while not (line := (await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)).decode()).startswith(
            "LOADED "
        ):
            assert line, "the bot ended before reporting what it loaded"
        return set(json.loads(line.removeprefix("LOADED ")))
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def model_env(fake_llm: FakeOpenAI, db_dsn: str, data: Path) -> dict[str, str]:
    """A model and a database for the child."""
    return {
        "DATABASE_URL": db_dsn,
        "DATA_DIR": str(data),
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": fake_llm.base_url,
        "LLM_API_KEY": "test",
        "LLM_MODEL": "fake-model",
    }


@pytest.mark.parametrize("model", [True, False], ids=["with a model", "without a model"])
async def test_a_polling_process_after_a_turn_has_loaded_no_web_server_discord_or_optional_part(
    fake_llm: FakeOpenAI, tg: FakeTelegram, db_dsn: str, tmp_path: Path, model: bool
) -> None:
    fake_llm.script(Reply(text="hello back"))
    env = model_env(fake_llm, db_dsn, tmp_path) if model else {"DATABASE_URL": db_dsn, "LLM_PROVIDER": "none"}
    env |= {"TELEGRAM_BOT_TOKEN": tg.token, "TELEGRAM_API_BASE_URL": tg.base_url, "DATA_DIR": str(tmp_path)}

    async def ready(_: asyncio.StreamReader) -> str:
        await tg.wait_for(lambda: any(method == "getUpdates" for method, _ in tg.calls), START_TIMEOUT_S)
        return ""

    async def turn(_: str) -> None:
        tg.push_update(tg.message_update("hello"))
        [sent] = await tg.wait_sent(1, START_TIMEOUT_S)
        assert (sent["text"] == "hello back") is model

    loaded = await loaded_after([], env, ready, turn)
    assert "telegram" in loaded and ("openai" in loaded) is model  # the SDK only when a model is configured
    assert loaded & (OPTIONAL | WEB_SERVER | {"discord", "slack_sdk"}) == set()


async def test_a_slack_socket_mode_process_after_a_turn_has_loaded_no_web_server_or_other_platform(
    fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="hello back"))
    async with FakeSlack() as sl:
        sl.person("U0ALICE1", "Alice")
        env = model_env(fake_llm, db_dsn, tmp_path)
        env |= {"SLACK_BOT_TOKEN": sl.token, "SLACK_APP_TOKEN": sl.app_token, "SLACK_API_BASE_URL": sl.api_base}

        async def ready(_: asyncio.StreamReader) -> str:
            await sl.wait_for(lambda: bool(sl.sockets), START_TIMEOUT_S, what="the bot's socket")
            return ""

        async def turn(_: str) -> None:
            await sl.push("events_api", sl.post("U0ALICE1", "hello", channel=sl.dm_of("U0ALICE1")))
            await sl.wait_for(lambda: bool(sl.sent), START_TIMEOUT_S, what="the answer")
            assert sl.sent[0]["text"] == "hello back"

        loaded = await loaded_after([], env, ready, turn)
    assert "slack_sdk" in loaded
    assert loaded & (OPTIONAL | WEB_SERVER | {"telegram", "discord"}) == set()


async def test_bot_serve_has_loaded_neither_platform_nor_an_optional_part(
    fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path
) -> None:
    fake_llm.script(Reply(text="hello back"))
    env = {**model_env(fake_llm, db_dsn, tmp_path), "PORT": "0"}  # a free port, printed once listening
    code, out, err = await bot_cli("token", "lean", env=env, cwd=tmp_path)
    assert code == 0, err
    token = out.strip().splitlines()[-1]

    async def ready(stdout: asyncio.StreamReader) -> str:
        while not (line := (await stdout.readline()).decode()).startswith("Serving the HTTP API on "):
            assert line, "bot serve ended before listening"
        return line.split()[5]  # its URL

    async def turn(url: str) -> None:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}) as r,
        ):
            assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == "hello back"

    loaded = await loaded_after(["serve"], env, ready, turn)
    assert "fastapi" in loaded
    assert loaded & (OPTIONAL | PLATFORMS) == set()
