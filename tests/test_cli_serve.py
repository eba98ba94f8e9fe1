"""The command line over HTTP (issue 22): `bot serve` runs the API and the reminders alone (a real process: its URL
printed, /healthz and /v1 answered, a reminder of an API session delivered into it, SIGTERM stops it with 0), the
platforms' process delivers API sessions' reminders too, and `bot ask --server URL` asks a running bot over the API
(the answer printed as it streams, then its steps; a refused token, an unknown session, a server that is down and a
missing token are one line each, never a traceback). Where it listens (issue 32): `bot serve` on loopback unless the
bot is deployed publicly or HOST / --host says otherwise, its line saying where, /metrics not open on a public
address; the platforms' process on HOST."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import sys
import time
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from bot.__main__ import given_settings, main, parse_args
from bot.app import SERVING as SERVING_LINE
from bot.app import run_platforms, run_serve
from bot.web import WebServer
from core import Api, Core, StartupError
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import until
from tests.test_console import ROOT, bot_cli
from tests.test_http_api import ANN, Serve, serve, token_of
from tests.test_startup import closed_port
from tests.test_web import free_port

__all__ = ["serve"]  # the fixture, imported for pytest

TIMEOUT_S = 20.0  # the process starts, answers, delivers, stops within this (each takes ~1 s)
POLL_S = 0.05
SERVING = re.compile(r"Serving the HTTP API on (http://127\.0\.0\.1:(\d+)) \(Ctrl-C stops\)\n")


async def session_with_a_due_reminder(core: Core, pool: Pool) -> tuple[str, str]:
    """Ann's API token and a session of hers holding a one-off reminder due a minute ago (a start catches it up)."""
    secret = await token_of(core, ANN)
    api = Api(core)
    found = await api.caller(secret)
    assert found is not None
    who = found[0]
    session = await api.new_session(who, "Reminders")
    await pool.execute(
        "INSERT INTO tasks (user_id, chat_id, title, due_at) SELECT $1, c.id, 'Stretch', now() - interval '1 minute'"
        " FROM chats c WHERE c.platform = 'api' AND c.platform_chat_id = $2",
        who.identity_id,
        session.id,
    )
    return secret, session.id


def listening_on(port: int, pid: int | None = None) -> str:
    """The address the process (this one by default) listens on at `port`."""
    found = [
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
    assert len(found) == 1, found
    return str(found[0])


async def reminder_in(client: httpx.AsyncClient, pool: Pool, session_id: str) -> str:
    """The text of the reminder the session shows once it was delivered (failing after TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not await pool.fetchval("SELECT count(*) FROM occurrences WHERE status = 'delivered'"):
        assert time.monotonic() < deadline, "no reminder delivered"
        await asyncio.sleep(POLL_S)
    r = await client.get(f"/v1/sessions/{session_id}/messages")
    assert r.status_code == 200, r.text
    shown = [m for m in r.json()["messages"] if m["role"] == "reminder"]
    assert len(shown) == 1, r.json()
    return str(shown[0]["parts"][0]["text"])


async def test_bot_serve_runs_the_api_and_reminders_alone_and_stops_on_sigterm(
    make_core: MakeCore, db_dsn: str, fake_llm: FakeOpenAI, tg: FakeTelegram, pool: Pool, tmp_path: Path
) -> None:
    secret, sid = await session_with_a_due_reminder(make_core(), pool)
    env = {  # from scratch, without PORT (a free port is picked); a Telegram token that `serve` must leave alone
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_dsn,
        "DATA_DIR": str(tmp_path / "data"),
        "LLM_BASE_URL": fake_llm.base_url,
        "LLM_API_KEY": "test",
        "LLM_MODEL": "fake-model",
        "ALLOWED_USERS": "*",
        "TELEGRAM_BOT_TOKEN": tg.token,
        "TELEGRAM_API_BASE_URL": tg.base_url,
    }
    log, port = tmp_path / "serve.log", free_port()
    with log.open("wb") as errors:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "bot", "serve", "--port", str(port)),
            cwd=tmp_path,  # no developer's .env
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT_S)).decode()
        found = SERVING.fullmatch(line)
        assert found, f"{line!r}; {log.read_text()}"
        assert found[2] == str(port) and listening_on(port, proc.pid) == "127.0.0.1"  # --port; loopback, as it says
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=found[1], headers=headers, timeout=TIMEOUT_S) as client:
            assert (await client.get("/healthz")).json() == {"status": "alive"}
            assert (await client.get("/readyz")).status_code == 200  # no adapter to wait for
            listed = await client.get("/v1/sessions")
            assert listed.status_code == 200 and [s["id"] for s in listed.json()["sessions"]] == [sid]
            assert "Stretch" in await reminder_in(client, pool, sid)  # the "api" outbox delivered it
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), TIMEOUT_S) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
        assert tg.calls == [], "serve started no platform"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_the_platforms_process_serves_the_api_and_delivers_its_sessions_reminders(
    tg: FakeTelegram, make_core: MakeCore, pool: Pool
) -> None:
    port = free_port()
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, PORT=str(port), HOST="127.0.0.1")
    secret, sid = await session_with_a_due_reminder(core, pool)
    running = asyncio.create_task(run_platforms(core.settings, core))
    try:
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as client:
            deadline = time.monotonic() + TIMEOUT_S
            while core.status_board.adapters.get("telegram") is None:
                assert time.monotonic() < deadline and not running.done()
                await asyncio.sleep(POLL_S)
            assert "Stretch" in await reminder_in(client, pool, sid)
        assert listening_on(port) == "127.0.0.1"  # HOST; unset, every interface (a PaaS reaches it there)
    finally:
        gc.unfreeze()
        os.kill(os.getpid(), signal.SIGTERM)  # run_platforms stops after draining
        assert await asyncio.wait_for(running, TIMEOUT_S) == 0


PUBLIC = {"PUBLIC_BASE_URL": "https://bot.example.com"}
METRICS = {"METRICS_TOKEN": "metrics-s3cret"}


@pytest.mark.parametrize(
    ("given", "host", "metrics"),
    [
        ({}, "127.0.0.1", 200),  # /metrics open on loopback, as in polling mode
        (PUBLIC, "0.0.0.0", 404),  # deployed publicly: every interface, /metrics only with METRICS_TOKEN
        ({**PUBLIC, **METRICS}, "0.0.0.0", 401),
        ({"TELEGRAM_WEBHOOK_URL": "https://bot.example.com/telegram"}, "0.0.0.0", 404),
        ({**PUBLIC, "HOST": "127.0.0.1"}, "127.0.0.1", 200),  # HOST (--host) wins
    ],
)
async def test_bot_serve_listens_on_loopback_unless_deployed_publicly_and_says_where(
    make_core: MakeCore, capsys: pytest.CaptureFixture[str], given: dict[str, str], host: str, metrics: int
) -> None:
    core = make_core(PORT=str(free_port()), **given)
    printed: list[str] = []

    def said() -> bool:
        printed.append(capsys.readouterr().out)
        return "\n" in "".join(printed) or serving.done()

    serving = asyncio.create_task(run_serve(core.settings, core))
    try:
        await until(said)
        port = core.settings.PORT
        url = f"http://127.0.0.1:{port}"
        where = url if host == "127.0.0.1" else f"all interfaces, port {port}: {url}"
        assert "".join(printed).partition("\n")[0] == SERVING_LINE.format(where=where)
        assert listening_on(port) == host
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/metrics")).status_code == metrics
            if "METRICS_TOKEN" in given:
                bearer = {"Authorization": f"Bearer {given['METRICS_TOKEN']}"}
                assert (await client.get("/metrics", headers=bearer)).status_code == 200
    finally:
        gc.unfreeze()
        if "".join(printed).startswith("Serving"):  # its signal handlers are in place: it stops after draining
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            serving.cancel()
        assert await asyncio.wait_for(serving, TIMEOUT_S) == 0


async def test_bot_serve_prints_a_sign_in_link_for_the_terminals_user(
    make_core: MakeCore, capsys: pytest.CaptureFixture[str]
) -> None:
    core = make_core(PORT=str(free_port()), ALLOWED_USERS=f"telegram:{ANN}")  # not naming the terminal's user
    printed: list[str] = []

    def said() -> bool:
        printed.append(capsys.readouterr().out)
        return "".join(printed).count("\n") >= 2 or serving.done()

    serving = asyncio.create_task(run_serve(core.settings, core))
    try:
        await until(said)
        first, second = "".join(printed).splitlines()
        url = f"http://127.0.0.1:{core.settings.PORT}"
        assert first == SERVING_LINE.format(where=url)
        found = re.fullmatch(rf"The web page, signed in as you \(.*10 minutes\): ({url}/signin\?code=([\w-]+))", second)
        assert found, second
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
            shown = await client.get(found[1])  # the sign-in page's button, as a /web link shows it
            assert shown.status_code == 200 and f'value="{found[2]}"' in shown.text
            signin = await client.post("/signin", data={"code": found[2]}, headers={"Sec-Fetch-Site": "same-origin"})
            assert signin.status_code == 303, signin.text
            me = await client.get("/v1/me")  # the client keeps the cookie
            assert me.status_code == 200 and me.json()["identity"] == "console:local"
    finally:
        gc.unfreeze()
        if "".join(printed).startswith("Serving"):
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            serving.cancel()
        assert await asyncio.wait_for(serving, TIMEOUT_S) == 0


async def test_the_terminal_chat_serves_the_page_with_port_set_and_web_signs_in_there(
    db_dsn: str, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    port = free_port()
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url, "PORT": str(port), "ALLOWED_USERS": "telegram:1"}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_", "HOST"))}
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bot"),
        cwd=tmp_path,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr
    assert stdin is not None and stdout is not None and stderr is not None

    async def line_with(pattern: str) -> re.Match[str]:
        while True:
            line = (await asyncio.wait_for(stdout.readline(), TIMEOUT_S)).decode()
            assert line, f"the chat ended: {(await stderr.read()).decode()}"
            if found := re.search(pattern, line):
                return found

    try:
        url = f"http://127.0.0.1:{port}"
        await line_with(re.escape(f"The web page: {url} (/web gives you a sign-in link)"))
        stdin.write(b"/web\n")
        await stdin.drain()
        code = (await line_with(rf"<{re.escape(url)}/signin\?code=([\w-]+)>"))[1]
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
            signin = await client.post("/signin", data={"code": code}, headers={"Sec-Fetch-Site": "same-origin"})
            assert signin.status_code == 303, signin.text
            me = await client.get("/v1/me")
            assert me.status_code == 200 and me.json()["identity"] == "console:local"
            assert (await client.get("/")).status_code == 200
        stdin.close()  # the end of input leaves the chat, and the page stops with it
        assert await asyncio.wait_for(proc.wait(), TIMEOUT_S) == 0
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
                await client.get("/healthz")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_serve_takes_host_and_port_from_the_command_line() -> None:
    assert given_settings(parse_args(["serve", "--host", "::1", "--port", "8099"])) == {"HOST": "::1", "PORT": 8099}
    assert given_settings(parse_args(["serve"])) == given_settings(parse_args(["run"])) == {}


async def test_a_host_that_cannot_be_listened_on_is_one_line_naming_host(make_core: MakeCore) -> None:
    web = WebServer(make_core(), (), 0, "nohost.invalid")
    with pytest.raises(StartupError) as failed:
        await web.start()
    assert str(failed.value).startswith("HOST: cannot listen on nohost.invalid:0 (")


async def test_ask_server_prints_the_answer_as_it_streams_then_its_steps(
    serve: Serve, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    s = await serve()
    secret = await token_of(s.core, ANN)
    release = asyncio.Event()

    async def later(body: object) -> Reply:
        await release.wait()
        return Reply(text="Added **Buy milk**.")

    fake_llm.script(
        Reply(text="Let me add it.", tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk"})]), later
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BOT_API_TOKEN": secret}  # the token from the environment
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bot", "ask", "--server", s.url, "add", "buy", "milk"),
        cwd=tmp_path,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen = b""
    while b"Let me add it." not in seen:  # printed while the model still thinks about the rest
        chunk = await asyncio.wait_for(proc.stdout.read(100), TIMEOUT_S)
        assert chunk, f"ended early: {seen!r}"
        seen += chunk
    release.set()
    rest, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    assert proc.returncode == 0, err.decode()
    lines = (seen + rest).decode().splitlines()
    assert lines[:2] == ["Let me add it.", "Added **Buy milk**."]
    assert re.fullmatch(r"   🔧 1 step · \d+\.\d s", lines[2]), lines
    assert lines[3].startswith("   ✅ manage_tasks create → ") and "Buy milk" in lines[3], lines
    assert len(lines) == 4
    found = re.fullmatch(r"\(session (ses_\S+): --session \1 continues it\)\n", err.decode())
    assert found, err
    # --session continues that session (main in-process, in a thread: the server runs on this loop)
    fake_llm.script(Reply(text="Eggs too, then."))
    args = ["ask", "--server", s.url + "/", "--token", secret, "--session", found[1], "and eggs"]
    assert await asyncio.to_thread(main, args) == 0
    async with s.client(secret) as c:
        messages = (await c.get(f"/v1/sessions/{found[1]}/messages")).json()["messages"]
    assert [m["parts"][0]["text"] for m in messages if m["role"] == "user"] == ["add buy milk", "and eggs"]


async def test_ask_server_failures_are_one_line(
    serve: Serve,
    fake_llm: FakeOpenAI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = await serve()
    secret = await token_of(s.core, ANN)
    code, out, err = await bot_cli("ask", "--server", s.url, "--token", "wrong-secret", "hi", env={}, cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == f"bot ask: {s.url} refused the API token (HTTP 401): check --token or BOT_API_TOKEN\n"

    async def ask(*args: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(main, ["ask", *args, "hi"])
        out, err = capsys.readouterr()
        assert "Traceback" not in err and err.count("\n") == 1, err
        return code, out, err

    monkeypatch.delenv("BOT_API_TOKEN", raising=False)
    code, out, err = await ask("--server", s.url, "--token", secret, "--session", "ses_nope")
    assert (code, out, err) == (2, "", f"bot ask: No such session. (HTTP 404 from {s.url})\n")
    down = f"http://127.0.0.1:{closed_port()}"
    code, out, err = await ask("--server", down, "--token", secret)
    assert (code, out) == (3, "") and err.startswith(f"bot ask: cannot reach {down} (")
    code, out, err = await ask("--server", s.url)
    assert code == 2 and "no API token: pass --token or set BOT_API_TOKEN" in err
    code, out, err = await ask("--server", "localhost:8080", "--token", secret)
    assert code == 2 and "--server needs an http:// or https:// URL" in err
    code, out, err = await ask("--server", s.url, "--token", secret, "--continue")
    assert code == 2 and "with --server, continue a session with --session ID" in err
    code, out, err = await ask("--token", secret)
    assert code == 2 and "--token and --session need --server URL" in err
    assert secret not in capsys.readouterr().err


async def test_ask_server_runs_a_command_as_the_terminal_does(
    serve: Serve, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    s = await serve()
    secret = await token_of(s.core, ANN)
    fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk"})]), Reply(text="Ok."))
    async with s.client(secret) as c:
        await c.post("/v1/one-shot", json={"prompt": "add buy milk"})
        tasks = (await c.get("/v1/tasks")).json()["text"]
    asked = len(fake_llm.requests)
    code, out, err = await bot_cli("ask", "--server", s.url, "/tasks", env={"BOT_API_TOKEN": secret}, cwd=tmp_path)
    assert code == 0, err
    assert "Buy milk" in tasks and out == tasks + "\n", "the task list, as /tasks answers it"
    assert re.fullmatch(r"\(session (ses_\S+): --session \1 continues it\)\n", err), err
    assert len(fake_llm.requests) == asked, "the command did not go to the model"
