"""Start-up failures as an operator meets them: one line naming the variable or service, no traceback, no secret;
and the embedded server stopped by a clean exit even after an earlier crash."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.__main__ import LIBRARY_LOGGERS, configure_logging
from core.constants import CONNECT_TIMEOUT_S
from core.settings import EXIT_CONFIG, EXIT_UNREACHABLE, StartupError
from core.storage.db import check_database
from tests.conftest import connect_server, postgres_servers, with_database
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_console import ROOT, bot_cli

SECRET = "s3cr3t-pw"


def closed_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def assert_one_line(err: str, *needles: str) -> None:
    """Exactly one line on stderr, containing every needle, without a traceback or the secret."""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err and SECRET not in err, err
    for needle in needles:
        assert needle in err, err


BAD_URLS = {  # DATABASE_URL ({closed}: a port nobody listens on) → the exit code and the line's reason
    "refused": (
        "postgresql://bot:{pw}@127.0.0.1:{closed}/bot",
        EXIT_UNREACHABLE,
        "cannot connect to 127.0.0.1:{closed} (connection refused)",
    ),
    "unknown-host": (
        "postgresql://bot:{pw}@nohost.invalid/bot",
        EXIT_UNREACHABLE,
        "cannot resolve the host of nohost.invalid",
    ),
    "bad-scheme": (
        "mysql://bot:{pw}@127.0.0.1/bot",
        EXIT_CONFIG,
        "must start with postgresql:// or postgres:// (got 'mysql://')",
    ),
    "bad-port": ("postgresql://bot:{pw}@127.0.0.1:99999/bot", EXIT_CONFIG, "port 99999 is not a valid port number"),
    "unclosed-bracket": ("postgresql://bot:{pw}@[::1/bot", EXIT_CONFIG, "is not a valid URL (Invalid IPv6 URL)"),
}


@pytest.fixture(scope="module")
def bad_url_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str, str]]:
    """`bot ask hi` with each of BAD_URLS, run side by side (each ~2 s, mostly Python's imports): the case's name →
    exit code, stdout, stderr and the expected reason."""
    port, cwd = closed_port(), tmp_path_factory.mktemp("bad-urls")

    async def one(url: str) -> tuple[int, str, str]:
        env = {"DATABASE_URL": url.format(pw=SECRET, closed=port), "LLM_API_KEY": "sk-test"}
        return await bot_cli("ask", "hi", env=env, cwd=cwd)

    async def every() -> list[tuple[int, str, str]]:
        return await asyncio.gather(*(one(url) for url, _, _ in BAD_URLS.values()))

    runs = dict(zip(BAD_URLS, asyncio.run(every()), strict=True))
    return {name: (*runs[name], reason.format(closed=port)) for name, (_, _, reason) in BAD_URLS.items()}


@pytest.mark.parametrize("case", BAD_URLS)
def test_bad_database_url_is_one_line(bad_url_runs: dict[str, tuple[int, str, str, str]], case: str) -> None:
    rc, out, err, reason = bad_url_runs[case]
    assert (rc, out) == (BAD_URLS[case][1], "")
    assert_one_line(err, "DATABASE_URL: " + reason)


@pytest.fixture
async def password_role(pg_server: str) -> AsyncIterator[str]:
    """A role that must log in with a password (pg_hba rule for it alone); yields its URL with a wrong password."""
    conn = await connect_server(pg_server)
    hba = Path(await conn.fetchval("SHOW hba_file"))
    local = hba.exists()  # our embedded server trusts everyone: ask for this role's password (a TEST_DATABASE_URL
    original = hba.read_text() if local else ""  # server elsewhere is expected to check passwords already)
    await conn.execute(f"CREATE ROLE bot_pw_test LOGIN PASSWORD 'right-{SECRET}'")
    rule = "local all bot_pw_test scram-sha-256\nhost all bot_pw_test all scram-sha-256\n"
    if local:
        hba.write_text(rule + original)
        await conn.execute("SELECT pg_reload_conf()")
    try:
        url = with_database(pg_server, "postgres").replace(
            "postgresql://postgres:", f"postgresql://bot_pw_test:{SECRET}"
        )
        assert SECRET in url
        yield url
    finally:
        if local:
            hba.write_text(original)
            await conn.execute("SELECT pg_reload_conf()")
        await conn.execute("DROP ROLE bot_pw_test")
        await conn.close()


async def test_wrong_password_is_one_line(password_role: str, tmp_path: Path) -> None:
    rc, out, err = await bot_cli("ask", "hi", env={"DATABASE_URL": password_role, "LLM_API_KEY": "x"}, cwd=tmp_path)
    assert (rc, out) == (EXIT_CONFIG, "")
    assert_one_line(err, "DATABASE_URL: ", "refused the login", 'password authentication failed for user "bot_pw_test"')


async def test_missing_database_is_one_line(pg_server: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": with_database(pg_server, "no_such_db"), "LLM_API_KEY": "x"}
    rc, out, err = await bot_cli("ask", "hi", env=env, cwd=tmp_path)
    assert (rc, out) == (EXIT_CONFIG, "")
    assert_one_line(err, 'DATABASE_URL: database "no_such_db" does not exist')


async def test_silent_database_gives_up_after_the_timeout() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # accept, then never answer the start-up packet

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(StartupError) as info:
            await check_database(f"postgresql://bot:{SECRET}@127.0.0.1:{port}/bot", timeout=0.2)
    finally:
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()
    assert str(info.value) == f"DATABASE_URL: cannot connect to 127.0.0.1:{port} (no answer within 0.2 s)"
    assert info.value.exit_code == EXIT_UNREACHABLE
    assert CONNECT_TIMEOUT_S <= 10  # the documented bound on an unanswering database at start


async def test_a_malformed_token_is_one_line_before_anything_starts(fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    token = f"123456:{SECRET}"  # not the shape @BotFather gives
    env = {"LLM_BASE_URL": fake_llm.base_url, "TELEGRAM_BOT_TOKEN": token}  # no DATABASE_URL: embedded would start
    rc, out, err = await bot_cli("run", env=env, cwd=tmp_path)
    assert rc == EXIT_CONFIG and out == ""
    assert_one_line(err, "TELEGRAM_BOT_TOKEN")
    assert list(tmp_path.iterdir()) == []  # no embedded database, no data directory: nothing was started


def test_libraries_log_warnings_only_in_a_normal_start() -> None:
    root, lib = logging.getLogger(), logging.getLogger("discord")
    saved = root.level, list(root.handlers), {n: logging.getLogger(n).level for n in LIBRARY_LOGGERS}
    client = logging.getLogger("discord.client")
    try:
        configure_logging(logging.INFO)
        assert root.isEnabledFor(logging.INFO) and not lib.isEnabledFor(logging.INFO)
        assert not logging.getLogger("telegram.ext.Application").isEnabledFor(logging.INFO)
        assert lib.isEnabledFor(logging.WARNING)
        voice = client.makeRecord(
            "discord.client", logging.WARNING, "", 0, "davey is not installed, voice will NOT be supported", (), None
        )
        assert not client.filter(voice) and client.filter(
            client.makeRecord("discord.client", logging.WARNING, "", 0, "x", (), None)
        )
        configure_logging(logging.DEBUG)
        assert lib.isEnabledFor(logging.DEBUG)  # --debug shows them all
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)
        client.filters.clear()


async def test_unexpected_start_failure_is_one_line_with_the_debug_hint(
    pg_server: str, db_dsn: str, tmp_path: Path
) -> None:
    conn = await connect_server(pg_server)
    try:
        await conn.execute("DROP DATABASE IF EXISTS bot_startup_clash")
        await conn.execute("CREATE DATABASE bot_startup_clash")
    finally:
        await conn.close()
    dsn = with_database(pg_server, "bot_startup_clash")
    conn = await connect_server(dsn)
    try:
        await conn.execute("CREATE TABLE users (x int)")  # another application's table: our first migration fails
    finally:
        await conn.close()
    env = {"DATABASE_URL": dsn, "LLM_API_KEY": "x"}
    try:
        rc, out, err = await bot_cli("ask", "hi", env=env, cwd=tmp_path)
        assert (rc, out) == (1, "")
        assert_one_line(err, 'The bot stopped: DuplicateTableError: relation "users" already exists', "--debug")
        saved = (tmp_path / ".data" / "last-error.txt").read_text()  # DATA_DIR's default, relative to the cwd
        assert "Traceback" in saved and "DuplicateTableError" in saved  # operators can still see where it failed
    finally:
        conn = await connect_server(pg_server)
        try:
            await conn.execute("DROP DATABASE IF EXISTS bot_startup_clash WITH (FORCE)")
        finally:
            await conn.close()


async def test_clean_exit_after_a_crash_stops_the_embedded_server(fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    fake_llm.default = Reply(text="ok")
    data = tmp_path / "data"
    pgdata = data.resolve() / "pg"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_"))}
    base.pop("DATABASE_URL", None)
    env = {
        **base,
        "PYTHONPATH": str(ROOT),
        "LLM_BASE_URL": fake_llm.base_url,
        "LLM_API_KEY": "x",
        "DATA_DIR": str(data),
    }
    crashed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        env=env,
        cwd=str(tmp_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert crashed.stdout is not None
        banner = await asyncio.wait_for(crashed.stdout.readline(), 60)  # the terminal chat runs: the server is up
        assert banner.startswith(b"Terminal chat"), banner
        assert postgres_servers(pgdata)
    finally:
        crashed.send_signal(signal.SIGKILL)
        await crashed.wait()
    try:
        assert postgres_servers(pgdata), "the server outlives the killed bot"
        rc, out, err = await bot_cli(
            "ask", "hi", env={"LLM_BASE_URL": fake_llm.base_url, "DATA_DIR": str(data)}, cwd=tmp_path
        )
        assert rc == 0, err
        assert out == "ok\n"
        assert postgres_servers(pgdata) == [], "the clean exit left the server it used running"
    finally:
        for pid in postgres_servers(pgdata):  # do not leak a server from a failed run (SIGINT: fast shutdown)
            os.kill(pid, signal.SIGINT)


def test_unexpected_failure_line_and_saved_traceback_hold_no_secret(tmp_path: Path) -> None:
    from bot.__main__ import failure_line
    from core.settings import load_settings

    token = f"123456:AAH{SECRET}abcdefghijklmnopqrstuvwxyz"
    settings = load_settings(
        DATA_DIR=str(tmp_path), TELEGRAM_BOT_TOKEN=token, DATABASE_URL=f"postgresql://bot:{SECRET}x@db/bot"
    )
    try:
        raise RuntimeError(f"POST https://api.telegram.org/bot{token}/getMe failed\nsecond line")
    except RuntimeError as e:
        line = failure_line(e, settings)
    assert line == (
        "The bot stopped: RuntimeError: POST https://api.telegram.org/bot***/getMe failed "
        f"(traceback in {tmp_path / 'last-error.txt'}; or run with --debug)"
    )
    saved = (tmp_path / "last-error.txt").read_text()
    assert "Traceback" in saved and "bot***/getMe" in saved and SECRET not in saved
