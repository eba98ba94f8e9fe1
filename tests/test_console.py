"""The terminal chat and the command line: `bot ask`, the interactive loop, start-up errors."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters import console
from core import COMMANDS, NOT_YOUR_PRESS, WIPE_LABEL, Confirm, Core
from core.commands import HELP, RESET_DONE
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.test_http_api import Serve, serve

__all__ = ["serve"]  # the fixture, imported for pytest

ROOT = Path(__file__).resolve().parent.parent


async def bot_cli(*args: str, env: dict[str, str], cwd: Path, stdin: bytes = b"") -> tuple[int, str, str]:
    """Run `python -m bot …` as a user would, `stdin` on its standard input; return (exit code, stdout, stderr)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_"))}
    base.pop("DATABASE_URL", None)
    base["PYTHONPATH"] = str(ROOT)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        env={**base, **env},
        cwd=str(cwd),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_ask_answers_once_with_activity(fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path, pool: Pool) -> None:
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk", "due_at": "2030-01-05T09:00"})]),
        Reply(text="Added **Buy milk** for Saturday."),
    )
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url, "DEFAULT_TIMEZONE": "Europe/Berlin"}
    code, out, err = await bot_cli("ask", "remind me to buy milk on 5 Jan 2030 at 9", env=env, cwd=tmp_path)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "Added **Buy milk** for Saturday."
    assert lines[1].startswith("   🔧 1 step · ")
    assert lines[2] == '   ✅ manage_tasks create → created #1 "Buy milk", Sat 05 Jan 2030 09:00 CET'
    assert await pool.fetchval("SELECT platform || ':' || platform_user_id FROM users") == "console:local"
    asked = len(fake_llm.requests)
    code, out, err = await bot_cli("ask", "/tasks", env=env, cwd=tmp_path)  # a command, as the terminal chat takes it
    assert code == 0 and "Buy milk" in out and "#1" in out, err
    assert len(fake_llm.requests) == asked, "a command needs no model"


async def test_each_ask_is_a_fresh_conversation_unless_continued(
    fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path
) -> None:
    fake_llm.default = Reply(text="noted")
    env = {"DATABASE_URL": db_dsn, "LLM_BASE_URL": fake_llm.base_url}

    async def ask(*args: str) -> list[str]:
        code, out, err = await bot_cli("ask", *args, env=env, cwd=tmp_path)
        assert (code, out) == (0, "noted\n"), err
        return [m["content"] for m in fake_llm.requests[-1]["messages"][1:]]

    assert await ask("my code word is heron") == ["my code word is heron"]
    assert await ask("what is my code word?") == ["what is my code word?"]  # the first ask is not replayed
    assert await ask("--continue", "and again?") == ["what is my code word?", "noted", "and again?"]


async def test_ask_without_llm_configured_says_what_to_set(tmp_path: Path) -> None:
    code, out, err = await bot_cli("ask", "hi", env={}, cwd=tmp_path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert "LLM_API_KEY" in err and "LLM_PROVIDER=ollama" in err and "LLM_BASE_URL" in err


async def test_invalid_setting_stops_start_with_one_line(tmp_path: Path) -> None:
    code, _, err = await bot_cli("ask", "hi", env={"LLM_API_KEY": "sk-x", "AGENT_STEP_TIMEOUT": "soon"}, cwd=tmp_path)
    assert code == 2 and err.startswith("AGENT_STEP_TIMEOUT: ") and err.count("\n") == 1


async def test_ask_with_llm_unreachable(db_dsn: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": db_dsn, "LLM_PROVIDER": "ollama", "LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    code, out, _ = await bot_cli("ask", "hi", env=env, cwd=tmp_path)
    assert code == 1
    assert out.count("\n") == 1  # one clear line
    assert "could not be used: it is unreachable" in out
    assert "To fix: check that the server at 127.0.0.1:9 (LLM_BASE_URL) is running" in out  # what is configured
    assert "serves the model llama3.1 (LLM_MODEL)" in out and "set LLM_API_KEY (and" not in out


async def test_embedded_postgres_started_and_reused(fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Persist me"})]),
        Reply(text="saved"),
        Reply(tool_calls=[("manage_tasks", {"action": "list"})]),
        Reply(text="listed"),
    )
    env = {"LLM_BASE_URL": fake_llm.base_url, "DATA_DIR": str(tmp_path / "data")}
    code, out, err = await bot_cli("ask", "save", env=env, cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / "data" / "pg" / "PG_VERSION").exists()
    code, out, err = await bot_cli("ask", "list", env=env, cwd=tmp_path)
    assert code == 0, err
    assert "1 open task" in out  # the second start reused the first one's data


async def test_interactive_loop(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    fake_llm.script(Reply(text="Hello!"), Reply(text="Fresh start."))

    async def lines() -> AsyncIterator[str]:
        for line in ["hi", "", "/reset", "who am i", "/quit", "never read"]:
            yield line

    printed: list[str] = []
    await console.chat_loop(core, lines(), printed.append)
    text = "".join(printed)
    assert "bot › Hello!" in text and RESET_DONE in text and "bot › Fresh start." in text
    assert [m["content"] for m in fake_llm.requests[1]["messages"][1:]] == ["who am i"]
    assert len(fake_llm.requests) == 2


async def test_the_terminal_chat_answers_every_command_of_the_catalogue_without_the_model(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core()
    typed = [f"/{c.name}" for c in COMMANDS if c.name != "reset"] + ["/start", "/timezone Europe/Berlin", "/quit"]

    async def lines() -> AsyncIterator[str]:
        for line in typed:
            yield line

    printed: list[str] = []
    await console.chat_loop(core, lines(), printed.append)
    text = "".join(printed)
    assert fake_llm.requests == []
    assert text.count(HELP) == 2 and "You have no open tasks" in text and "Your time zone is" in text
    assert "**Status**" in text and "What I remember about you" in text and "Time zone set to **Europe/Berlin**" in text


async def test_reminder_printed_in_terminal_chat(
    make_settings: Any, make_llm: Any, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from datetime import timedelta

    from core.front_door import Core
    from core.timeutil import system_clock

    settings = make_settings()
    core = Core(settings, pool, make_llm(settings))  # the real clock: APScheduler fires the date job
    due = (system_clock() + timedelta(seconds=1.5)).replace(microsecond=0) + timedelta(seconds=1)
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Tea", "due_at": due.isoformat()})]),
        Reply(text="I'll remind you."),
    )
    printed: list[str] = []

    async def lines() -> AsyncIterator[str]:
        yield "remind me about tea in a moment"
        for _ in range(80):  # at most 4 s of real time
            if any("⏰ Tea" in p for p in printed):
                break
            await asyncio.sleep(0.05)
        yield "/quit"

    async with core.running({"console": console.ConsoleOutbox(printed.append)}):
        await console.chat_loop(core, lines(), printed.append)
    text = "".join(printed)
    assert "I'll remind you." in text and "⏰ Tea — due" in text


async def test_terminal_memory_shows_forgets_and_wipes_without_the_llm(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from tests.test_memory_command import remember

    core = make_core()
    local = await remember(core, console.console_incoming(""), ["Name: Sam", "Likes: tea"], ["old note"])
    typed = ["/memory", "/memory forget human 1", "/memory forget human 5", "/memory wipe", "/memory wipe confirm"]

    async def lines() -> AsyncIterator[str]:
        for line in [*typed, "/memory"]:
            yield line

    printed: list[str] = []
    await console.chat_loop(core, lines(), printed.append)
    shown, forgot, bad, ask, left, wiped, after = printed[1:]
    assert "1: Name: Sam\n2: Likes: tea" in shown and "Archival memory: 1 entry" in shown
    assert forgot == "bot › Forgot line 1 of [human]: “Name: Sam”.\n"
    assert bad == "bot › line 5 does not exist in [human]; valid lines: 1-1\n"
    assert "/memory wipe confirm" in ask and f"1) {WIPE_LABEL}" in ask
    assert left == f"bot › {console.LEFT}\n", "a command typed instead of a number leaves the wipe's button, then runs"
    assert "I erased 1 line and 1 archival entry" in wiped
    assert "(0 lines" in after and "Archival memory: 0 entries" in after
    assert await pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", local) == 0
    assert fake_llm.requests == []


async def typed_in_chat(core: Core, typed: list[str]) -> list[str]:
    """What the terminal chat printed for each line of `typed` (the banner left out)."""

    async def lines() -> AsyncIterator[str]:
        for line in typed:
            yield line

    printed: list[str] = []
    await console.chat_loop(core, lines(), printed.append)
    return printed[1:]


async def test_terminal_chat_numbers_a_confirmations_buttons_and_presses_one_by_its_number(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from tests.test_memory_command import remember

    core = make_core()
    local = await remember(core, console.console_incoming(""), ["Name: Sam"], ["old note"])
    # anything but a listed number leaves it as it was, and is not sent to the model
    typed = ["/memory wipe", "", "/memory wipe", "wipe it, please", "/memory wipe", "2", "/memory wipe", " 1 "]
    printed = await typed_in_chat(core, [*typed, "/memory"])
    asked, left, asked2, left2, asked3, left3, asked4, wiped, after = printed
    indent = " " * len(console.BOT)
    assert asked.endswith(f"/memory wipe confirm.\n{indent}1) {WIPE_LABEL}\n{indent}{console.PRESS_HOW}\n")
    assert asked == asked2 == asked3 == asked4
    assert left == left2 == left3 == f"bot › {console.LEFT}\n"
    assert wiped.startswith("bot › Done — I erased 1 line and 1 archival entry") and indent not in wiped
    assert "Archival memory: 0 entries" in after
    assert await pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", local) == 0
    assert fake_llm.requests == []


async def test_terminal_chat_picks_a_model_by_its_number(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(LLM_MODELS="fake-model, fake-big")
    fake_llm.script(Reply(text="big answer"))
    shown, picked, answered = await typed_in_chat(core, ["/model", "2", "hello"])
    assert "Switch with /model <name>" in shown and "1) fake-model  2) fake-big\n" in shown
    assert picked == "bot › Done — **fake-big** answers you from now on, on every platform you linked.\n"
    assert answered == "bot › big answer\n" and [r["model"] for r in fake_llm.requests] == ["fake-big"]


async def test_terminal_press_runs_only_the_terminal_users_own_buttons(make_core: MakeCore, pool: Pool) -> None:
    from core.commands.memory import MEMORY_WIPE_CONFIRM
    from tests.test_memory_command import remember

    core = make_core()
    local = await remember(core, console.console_incoming(""), ["Name: Sam"])
    said, choices = await console.press(core, Confirm("memory", MEMORY_WIPE_CONFIRM, "someone else"))
    assert (said, choices) == (f"bot › {NOT_YOUR_PRESS}", ())
    assert await pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", local) == 1
    said, _ = await console.press(core, Confirm("memory", MEMORY_WIPE_CONFIRM, "local"))
    assert said.startswith("bot › Done — I erased 1 line")


async def test_bot_ask_says_what_to_type_for_each_confirmation_and_choice(make_core: MakeCore, pool: Pool) -> None:
    """`bot ask` cannot ask for a number: each answer with buttons says what to type, and that typed works."""
    from tests.test_memory_command import remember

    core = make_core(LLM_MODELS="fake-model, fake-big")
    local = await remember(core, console.console_incoming("", console.ASK_CHAT), ["Name: Sam"])
    for asked, typed, done in [
        ("/memory wipe", "/memory wipe confirm", "Done — I erased 1 line"),
        ("/model", "/model fake-big", "Done — **fake-big** answers you"),
        ("/forget_me", "/forget_me confirm", "Done — I deleted your account"),
    ]:
        said, ok = await console.ask_once(core, asked)
        example = typed.replace("fake-big", "<name>") if asked == "/model" else typed
        assert ok and example in said and console.PRESS_HOW not in said, said
        said, ok = await console.ask_once(core, typed)
        assert ok and said.startswith(done), said
    assert await pool.fetchval("SELECT count(*) FROM users WHERE id = $1", local) == 0


async def test_bot_ask_answers_every_command_of_the_catalogue_locally_and_with_server(
    make_core: MakeCore, fake_llm: FakeOpenAI, serve: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    from bot.__main__ import main
    from tests.test_http_api import ANN, token_of

    core = make_core()
    s = await serve()
    secret = await token_of(s.core, ANN)
    for command in COMMANDS:
        said, answered = await console.ask_once(core, f"/{command.name}")
        assert answered and said and "Unknown command" not in said, (command.name, said)
        code = await asyncio.to_thread(main, ["ask", "--server", s.url, "--token", secret, f"/{command.name}"])
        out, err = capsys.readouterr()
        assert code == 0 and out.strip() and "Unknown command" not in out, (command.name, out, err)
    assert fake_llm.requests == []


async def test_bot_ask_reset_empties_the_conversation_continue_goes_on_with(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="noted")
    assert (await console.ask_once(core, "my code word is heron"))[1]
    assert (await console.ask_once(core, "/reset"))[0] == RESET_DONE
    assert (await console.ask_once(core, "what is my code word?", fresh=False))[1]
    assert [m["content"] for m in fake_llm.requests[-1]["messages"][1:]] == ["what is my code word?"]
