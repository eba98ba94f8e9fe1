"""The bot before a model is set: LLM_PROVIDER=none runs a bot of commands, /remind, tasks and reminders on purpose
(saying so once at start), a message is stored and answered with one line; a platform token with no model at all
still stops the start, as does `bot ask`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx

from bot.__main__ import NO_MODEL_YET
from core import Error, Reminded
from core.texts import NO_MODEL, NO_MODEL_HOW
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI
from tests.fake_telegram import FakeTelegram
from tests.helpers import incoming, run
from tests.test_console import ROOT, bot_cli
from tests.test_web import free_port

START_S = 30.0  # a bot process's start on a busy machine (imports, migrations; ~2 s quiet)


async def test_without_a_model_a_message_is_stored_and_answered_with_one_line(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core(LLM_PROVIDER="none", LLM_BASE_URL=None, LLM_API_KEY=None, ADMINS="telegram:1")
    [said] = await run(core, incoming("hello there", user="2"))
    assert isinstance(said, Error) and said.message == NO_MODEL  # no operator's variables for a chat's person
    [told] = await run(core, incoming("and you?", user="1"))
    assert isinstance(told, Error) and told.message == NO_MODEL + NO_MODEL_HOW  # the admin learns what to set
    stored = await core.pool.fetch("SELECT content FROM messages WHERE role = 'user' ORDER BY id")
    assert [r["content"] for r in stored] == ["hello there", "and you?"]
    assert isinstance(await core.command(incoming("/remind", user="2"), "remind", "in 5 minutes Tea"), Reminded)
    status = await core.command(incoming("/status", user="2"), "status")
    assert isinstance(status, str) and "- model: none, commands only" in status and "your model" not in status
    shown = await core.command(incoming("/help", user="2"), "help")
    assert isinstance(shown, str) and shown.startswith("I'm your personal assistant, answering commands only here")
    assert "/remind <when> <what>" in shown and "in plain words" not in shown
    assert fake_llm.requests == []


async def test_llm_provider_none_runs_a_telegram_bot_of_commands_and_says_so_once(
    tg: FakeTelegram, db_dsn: str, tmp_path: Path
) -> None:
    env = {  # from scratch: nothing of this environment that could point at real services
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_dsn,
        "DATA_DIR": str(tmp_path / "data"),
        "TELEGRAM_BOT_TOKEN": tg.token,
        "TELEGRAM_API_BASE_URL": tg.base_url,
        "LLM_PROVIDER": "none",
        "ALLOWED_USERS": "*",
        "DEFAULT_TIMEZONE": "Europe/Berlin",
    }
    log = tmp_path / "bot.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        tg.push_update(tg.message_update("/remind in 10 minutes Take the pizza out"))
        [made] = await tg.wait_sent(1, timeout=START_S)
        assert made["text"].startswith("⏰ #1 Take the pizza out — ")
        assert made["reply_markup"]["inline_keyboard"] == [[{"text": "↩️ Undo", "callback_data": "rem:undo:1"}]]
        tg.push_update(tg.message_update("hello?"))
        [_, said] = await tg.wait_sent(2, timeout=START_S)
        assert said["text"] == NO_MODEL.replace("<", "&lt;")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), START_S) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    printed = log.read_text()
    assert printed.count("Running without a model (LLM_PROVIDER=none)") == 1 and "Traceback" not in printed


async def test_a_platform_token_and_no_model_still_stops_the_start(tmp_path: Path) -> None:
    code, out, err = await bot_cli("run", env={"TELEGRAM_BOT_TOKEN": "123:abc"}, cwd=tmp_path)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("LLM_API_KEY: not set")
    assert list(tmp_path.iterdir()) == []  # nothing was started: no database, no data directory


async def test_bot_token_and_the_local_page_work_before_a_model_is_set(db_dsn: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": db_dsn, "DATA_DIR": str(tmp_path / "data")}
    code, out, _ = await bot_cli("token", "laptop", env=env, cwd=tmp_path)
    assert code == 0, out
    secret = out.strip().splitlines()[-1]
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_"))}
    base.pop("DATABASE_URL", None)
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bot", "serve", "--port", str(port)),
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        serving = (await asyncio.wait_for(proc.stdout.readline(), START_S)).decode()
        assert serving.startswith(f"Serving the HTTP API on http://127.0.0.1:{port}"), serving
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=START_S) as c:
            sid = (await c.post("/v1/sessions", json={})).json()["id"]
            made = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "/remind in 10 minutes Tea"})
            assert made.status_code == 200 and "⏰ #1 Tea — " in made.text, made.text
            said = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "hello"})
            assert NO_MODEL.split(":")[0] in said.text and "Choosing the model" in said.text, said.text  # the operator
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), START_S) == 0
        printed = (await proc.stderr.read()).decode()
        assert printed.count(NO_MODEL_YET) == 1 and "Traceback" not in printed
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_public_bot_serve_with_no_model_still_stops_the_start(tmp_path: Path) -> None:
    code, out, err = await bot_cli("serve", "--host", "0.0.0.0", env={}, cwd=tmp_path)
    assert code == 2 and out == "" and err.startswith("LLM_API_KEY: not set") and err.count("\n") == 1
