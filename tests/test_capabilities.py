"""Self-built capabilities: writing with structured errors, versions, hot reload, timeouts, isolation, restart."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from core.capabilities import store
from core.capabilities.manager import EXIT_RESTART
from core.capabilities.runtime import ThreadRunner
from core.constants import CAPABILITY_RESULT_CHARS
from core.front_door import Core
from core.storage.db import Pool
from core.tools.framework import ToolError
from core.types import Assistant
from tests.conftest import MakeCore, with_database
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_messages, tool_names

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "1"
MEMBER = "2"
OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
GREET_SCHEMA = {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]}
GREET = "async def greet(params, ctx):\n    return f\"hello {params['who']} from {ctx.user_name}\"\n"


def admin_core(make_core: MakeCore, **overrides: Any) -> Core:
    """A Core where telegram:1 is an admin and anyone is allowed."""
    return make_core(ADMINS=f"telegram:{ADMIN}", ALLOWED_USERS="*", **overrides)


async def write(
    core: Core,
    fake: FakeOpenAI,
    name: str,
    code: str,
    schema: dict[str, Any] | None = None,
    description: str = "a test capability",
    user: str = ADMIN,
) -> dict[str, Any]:
    """Have the (scripted) model call write_capability once; returns the tool's envelope."""
    args = {"name": name, "description": description, "code": code, "parameters_schema": schema or OBJECT}
    fake.script(Reply(tool_calls=[("write_capability", args)]), Reply(text="done"))
    answer(await run(core, incoming(f"write {name}", user=user)))
    return tool_messages(fake.requests[-1])[-1]


async def call(
    core: Core, fake: FakeOpenAI, name: str, args: dict[str, Any] | None = None, user: str = ADMIN, chat: str = ""
) -> dict[str, Any]:
    """Have the model call one tool; returns the envelope the model got back."""
    fake.script(Reply(tool_calls=[(name, args or {})]), Reply(text="ok"))
    answer(await run(core, incoming(f"call {name}", user=user, chat=chat or user)))
    return tool_messages(fake.requests[-1])[-1]


async def test_model_fixes_syntax_error_and_calls_the_new_tool_in_one_conversation(
    make_core: MakeCore, fake_llm: FakeOpenAI, capabilities_dir: Path
) -> None:
    core = admin_core(make_core)
    broken = 'async def greet(params, ctx):\n    name = params["who"]\n    return "hello " name\n'
    greet = {"name": "greet", "description": "Greets someone by name.", "parameters_schema": GREET_SCHEMA}
    fake_llm.script(
        Reply(tool_calls=[("write_capability", {**greet, "code": broken})]),
        Reply(tool_calls=[("write_capability", {**greet, "code": GREET})]),
        Reply(tool_calls=[("greet", {"who": "Bob"})]),
        Reply(text="It says hello to Bob."),
    )
    a = answer(await run(core, incoming("make a greeting tool and greet Bob", user=ADMIN, name="Ann")))
    first = tool_messages(fake_llm.requests[1])[0]
    assert first["ok"] is False and first["error"]["code"] == "tool_error"
    details = first["error"]["details"]
    assert details["error"] == "syntax_error" and details["line"] == 3 and isinstance(details["offset"], int)
    assert details["message"]
    second = tool_messages(fake_llm.requests[2])[1]
    assert second == {"ok": True, "result": {"name": "greet", "version": 1, "summary": "greet v1 saved and loaded"}}
    assert "greet" in tool_names(fake_llm.requests[2])  # the new tool is offered in the same turn
    offered = next(t for t in fake_llm.requests[2]["tools"] if t["function"]["name"] == "greet")
    assert offered["function"]["parameters"] == GREET_SCHEMA
    assert tool_messages(fake_llm.requests[3])[2] == {"ok": True, "result": "hello Bob from Ann"}
    assert a.text == "It says hello to Bob." and [s.ok for s in a.steps] == [False, True, True]
    assert (capabilities_dir / "greet_v1.py").read_text() == GREET
    # the next turn's system prompt lists it by name and description
    fake_llm.script(Reply(text="hi"))
    await run(core, incoming("hi", user=MEMBER))
    prompt = fake_llm.requests[-1]["messages"][0]["content"]
    assert "- greet — Greets someone by name." in prompt
    assert "greet" in tool_names(fake_llm.requests[-1])


@pytest.mark.parametrize(
    ("code", "schema", "error", "needle"),
    [
        (
            "import no_such_module_xyz\n\nasync def cap(params):\n    return 1\n",
            OBJECT,
            "import_error",
            "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            "x = 1\ny = x / 0\n\nasync def cap(params):\n    return 1\n",
            OBJECT,
            "import_error",
            "ZeroDivisionError: division by zero (line 2)",
        ),
        ("async def other(params):\n    return 1\n", OBJECT, "missing_function", "no function named 'cap'"),
        ("def cap(params):\n    return 1\n", OBJECT, "missing_function", "must be a coroutine function"),
        ("async def cap():\n    return 1\n", OBJECT, "missing_function", "must take (params: dict)"),
        (
            "async def cap(params):\n    return 1\n",
            {"type": "object", "properties": {"n": {"type": "nope"}}},
            "invalid_schema",
            "properties/n/type",
        ),
        ("async def cap(params):\n    return 1\n", {"type": "array"}, "invalid_schema", '"type": "object"'),
    ],
)
async def test_validation_errors_are_structured_and_nothing_is_stored(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, code: str, schema: dict[str, Any], error: str, needle: str
) -> None:
    core = admin_core(make_core)
    env = await write(core, fake_llm, "cap", code, schema)
    assert env["ok"] is False and env["error"]["code"] == "tool_error"
    assert env["error"]["details"]["error"] == error
    assert needle in env["error"]["details"]["message"]
    assert await pool.fetchval("SELECT count(*) FROM capability_versions") == 0
    assert "cap" not in tool_names(fake_llm.requests[-1])
    assert not [m for m in sys.modules if m.startswith("capability_cap_")]  # no half-imported module left


async def test_names_are_snake_case_and_may_not_shadow_built_in_tools(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = admin_core(make_core)
    env = await write(core, fake_llm, "manage_tasks", "async def manage_tasks(params):\n    return 1\n")
    assert env["error"]["details"] == {
        "error": "invalid_name",
        "message": "'manage_tasks' is a built-in tool; choose another name",
    }
    env = await write(core, fake_llm, "Bad-Name", "async def x(params):\n    return 1\n")
    assert env["error"]["code"] == "invalid_args" and "name" in env["error"]["message"]


async def test_arguments_checked_against_schema_and_exceptions_become_envelopes(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = admin_core(make_core)
    code = "async def divide(params):\n    a = params['a']\n    return a / params['b']\n"
    schema = {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    assert (await write(core, fake_llm, "divide", code, schema))["ok"]
    assert await call(core, fake_llm, "divide", {"a": 6, "b": 3}) == {"ok": True, "result": 2.0}
    bad = await call(core, fake_llm, "divide", {"a": "six", "c": 1})
    assert bad["error"]["code"] == "invalid_args"
    assert "a: 'six' is not of type 'number'" in bad["error"]["message"]
    assert "'b' is a required property" in bad["error"]["message"]
    boom = await call(core, fake_llm, "divide", {"a": 1, "b": 0})
    assert boom["error"] == {"code": "tool_error", "message": "ZeroDivisionError: division by zero (line 3)"}


async def test_sys_exit_in_a_capability_is_an_error_not_an_exit(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = admin_core(make_core)
    assert (await write(core, fake_llm, "quit", "import sys\n\nasync def quit(params):\n    sys.exit(3)\n"))["ok"]
    env = await call(core, fake_llm, "quit")
    assert env["error"] == {"code": "tool_error", "message": "RuntimeError: the capability raised SystemExit"}


async def test_runner_refuses_calls_beyond_its_limit() -> None:
    runner = ThreadRunner(limit=1)
    release = threading.Event()

    async def blocking() -> str:
        release.wait(10)
        return "done"

    async def quick() -> str:
        return "quick"

    first = asyncio.create_task(runner.run("first", blocking))
    for _ in range(300):
        if runner.live:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(ToolError, match="1 capability calls are still running"):
        await runner.run("second", quick)
    release.set()
    assert await first == "done"
    assert await runner.run("third", quick) == "quick"


async def test_long_output_is_cut_for_storage_and_prompt(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = admin_core(make_core)
    assert (await write(core, fake_llm, "big", "async def big(params):\n    return 'x' * 100000\n"))["ok"]
    fake_llm.script(Reply(tool_calls=[("big", {})]), Reply(text="ok"))
    await run(core, incoming("big", user=ADMIN))
    prompt_copy = next(m for m in reversed(fake_llm.requests[-1]["messages"]) if m["role"] == "tool")["content"]
    assert len(prompt_copy) < 4100 and prompt_copy.endswith("more characters]")
    stored = await pool.fetchval("SELECT content FROM messages WHERE tool_name = 'big'")
    assert (
        CAPABILITY_RESULT_CHARS < len(stored) < CAPABILITY_RESULT_CHARS + 200
        and "[truncated, 80000 more characters]" in stored
    )


RUNAWAY_ASYNC = """
import asyncio

async def spin(params):
    while True:
        await asyncio.sleep(0.01)
"""
RUNAWAY_BLOCKING = """
import os
import time

async def spin(params):
    open(params["started"], "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(params["stop"]) and time.monotonic() < deadline:
        time.sleep(0.01)  # blocking, inside async def
    return "finally"
"""


@pytest.mark.parametrize("code", [RUNAWAY_ASYNC, RUNAWAY_BLOCKING], ids=["async", "blocking"])
async def test_runaway_is_cut_by_the_timeout_while_other_chats_get_answers(
    make_core: MakeCore, fake_llm: FakeOpenAI, tmp_path: Path, code: str
) -> None:
    core = admin_core(make_core, CAPABILITY_TIMEOUT=0.3)
    schema = {"type": "object", "properties": {"started": {"type": "string"}, "stop": {"type": "string"}}}
    assert (await write(core, fake_llm, "spin", code, schema))["ok"]
    started, stop = tmp_path / "started", tmp_path / "stop"

    async def respond(req: dict[str, Any]) -> Reply:
        last = req["messages"][-1]
        if last["role"] == "user" and last["content"] == "spin":
            return Reply(tool_calls=[("spin", {"started": str(started), "stop": str(stop)})])
        if last["role"] == "tool":
            return Reply(text="that took too long")
        return Reply(text=f"answer to {last['content']}")

    fake_llm.default = respond
    began = time.monotonic()
    runaway = asyncio.create_task(run(core, incoming("spin", user=ADMIN, chat="10")))
    for _ in range(300):
        if core.capabilities.runner.live:
            break
        await asyncio.sleep(0.01)
    other = answer(await run(core, incoming("hello", user=MEMBER, chat="20")))
    assert other.text == "answer to hello" and not runaway.done()  # answered while the capability runs
    cut = answer(await runaway)
    assert time.monotonic() - began < 10  # cut by its 0.3 s timeout (the runaway never ends by itself)
    assert cut.text == "that took too long" and cut.steps[0].error_code == "timeout"
    env = tool_messages(fake_llm.requests[-1])[-1]
    assert env["error"] == {"code": "timeout", "message": "spin did not finish within 0.3 s"}
    if code is RUNAWAY_BLOCKING:
        assert started.exists()
        assert core.capabilities.runner.live == 1  # a blocking thread cannot be killed: it runs on
        stop.touch()
    for _ in range(300):  # an async runaway is cancelled in its own loop; the blocking one saw the flag
        if core.capabilities.runner.live == 0:
            break
        await asyncio.sleep(0.01)
    assert core.capabilities.runner.live == 0


async def test_materialised_from_the_database_after_a_restart_with_an_empty_directory(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, tmp_path: Path, allowed_errors: list[str]
) -> None:
    core = admin_core(make_core)
    assert (await write(core, fake_llm, "greet", GREET, GREET_SCHEMA))["ok"]
    # a stored capability that no longer imports (e.g. a module gone after a deploy) is skipped
    await pool.execute(
        "INSERT INTO capabilities (name, version) VALUES ('broken', 1);"
        "INSERT INTO capability_versions (name, version, description, code, parameters_schema)"
        " VALUES ('broken', 1, 'broken', 'import gone_module_xyz', '{\"type\": \"object\"}')"
    )
    allowed_errors.append("capability broken v1 could not be loaded")
    fresh_dir = tmp_path / "after-restart"
    restarted = admin_core(make_core)
    restarted.capabilities.directory = fresh_dir
    report = await restarted.capabilities.load_all()
    assert report.loaded == ["greet v1"]
    assert "ModuleNotFoundError" in report.failed["broken"]
    assert sorted(p.name for p in fresh_dir.iterdir()) == ["broken_v1.py", "greet_v1.py"]
    assert await call(restarted, fake_llm, "greet", {"who": "Eve"}) == {"ok": True, "result": "hello Eve from Ann"}
    assert "broken" not in tool_names(fake_llm.requests[-1])


async def test_code_is_materialised_under_data_dir_never_into_the_source_tree(
    make_core: MakeCore, fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = admin_core(make_core, DATA_DIR="state")  # relative: counted from the cwd at start (make_settings: tmp_path)
    monkeypatch.chdir(tmp_path.parent)  # a later cwd changes nothing
    directory = tmp_path / "state" / "capabilities"
    assert core.capabilities.directory == directory and not directory.exists()  # created when first needed
    where = "async def where_am_i(params):\n    return __file__\n"
    assert (await write(core, fake_llm, "where_am_i", where))["ok"]
    assert await call(core, fake_llm, "where_am_i") == {"ok": True, "result": str(directory / "where_am_i_v1.py")}
    for folder in ("core", "capabilities"):
        assert not list((ROOT / folder).rglob("where_am_i_v*.py"))
    assert not (ROOT / "core" / "capabilities" / "_materialised").exists()
    for path in [*(ROOT / "core").rglob("*.py"), ROOT / ".gitignore", ROOT / "pyproject.toml"]:
        assert "_materialised" not in path.read_text(encoding="utf-8"), path


async def test_new_version_is_used_at_once_and_rollback_restores_the_old(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = admin_core(make_core)
    assert (await write(core, fake_llm, "version", "async def version(params):\n    return 'one'\n"))["ok"]
    assert (await call(core, fake_llm, "version"))["result"] == "one"
    env = await write(core, fake_llm, "version", "async def version(params):\n    return 'two'\n", description="v2")
    assert env["result"]["version"] == 2
    assert (await call(core, fake_llm, "version"))["result"] == "two"  # no restart
    listing = (await call(core, fake_llm, "manage_capability", {"action": "list"}))["result"]
    assert [(c["name"], c["version"], c["versions"], c["enabled"]) for c in listing["capabilities"]] == [
        ("version", 2, [1, 2], True)
    ]
    shown = await call(core, fake_llm, "manage_capability", {"action": "show", "name": "version", "version": 1})
    assert "return 'one'" in shown["result"]["code"] and shown["result"]["current_version"] == 2
    rolled = await call(core, fake_llm, "manage_capability", {"action": "rollback", "name": "version", "version": 1})
    assert rolled["result"]["summary"] == "version rolled back to v1 (was v2)"
    assert (await call(core, fake_llm, "version"))["result"] == "one"
    assert "- version — a test capability" in fake_llm.requests[-2]["messages"][0]["content"]
    # reload from the database keeps the rolled-back version
    reload = await call(core, fake_llm, "restart", {"mode": "reload"})
    assert reload["result"] == {"loaded": ["version v1"], "failed": {}, "summary": "1 loaded"}
    assert (await call(core, fake_llm, "version"))["result"] == "one"
    # a version written by another process on the same database is picked up by a reload
    await store.save_version(
        pool, "version", "v3", "async def version(params):\n    return 3\n", {"type": "object"}, "x"
    )
    assert (await call(core, fake_llm, "version"))["result"] == "one"
    assert (await call(core, fake_llm, "restart", {"mode": "reload"}))["result"]["loaded"] == ["version v3"]
    assert (await call(core, fake_llm, "version"))["result"] == 3
    assert len([m for m in sys.modules if m.startswith("capability_version_")]) == 1  # old versions forgotten
    await call(core, fake_llm, "manage_capability", {"action": "rollback", "name": "version", "version": 1})
    # disable: no longer offered or callable; enable: back
    await call(core, fake_llm, "manage_capability", {"action": "disable", "name": "version"})
    gone = await call(core, fake_llm, "version")
    assert gone["error"]["code"] == "unknown_function" and "version" not in tool_names(fake_llm.requests[-1])
    await call(core, fake_llm, "manage_capability", {"action": "enable", "name": "version"})
    assert (await call(core, fake_llm, "version"))["result"] == "one"
    missing = await call(core, fake_llm, "manage_capability", {"action": "rollback", "name": "version", "version": 9})
    assert missing["error"]["message"] == "version has no version 9"


async def test_non_admin_can_call_but_neither_write_nor_change(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = admin_core(make_core)
    assert (await write(core, fake_llm, "greet", GREET, GREET_SCHEMA))["ok"]
    evil = {
        "name": "evil",
        "description": "x",
        "code": "async def evil(p):\n    return 1\n",
        "parameters_schema": OBJECT,
    }
    fake_llm.script(
        Reply(
            tool_calls=[
                ("write_capability", evil),
                ("manage_capability", {"action": "disable", "name": "greet"}),
                ("manage_capability", {"action": "rollback", "name": "greet", "version": 1}),
                ("manage_capability", {"action": "show", "name": "greet"}),
                ("restart", {"mode": "full"}),
                ("greet", {"who": "me"}),
            ]
        ),
        Reply(text="ok"),
    )
    answer(await run(core, incoming("try everything", user=MEMBER, name="Max")))
    offered = tool_names(fake_llm.requests[-2])
    assert "greet" in offered
    assert not {"write_capability", "manage_capability", "restart"} & set(offered)
    *forbidden, greeted = tool_messages(fake_llm.requests[-1])
    assert [e["error"]["code"] for e in forbidden] == ["forbidden"] * 5
    assert greeted == {"ok": True, "result": "hello me from Max"}
    assert await pool.fetchval("SELECT count(*) FROM capability_versions") == 1
    assert await pool.fetchval("SELECT enabled FROM capabilities WHERE name = 'greet'") is True
    assert core.exit_code is None


QUERY_CAP = """
async def my_tasks(params, ctx):
    rows = await ctx.query("SELECT t.title FROM tasks t WHERE t.status = $1 ORDER BY t.id", "pending")
    mine = await ctx.query("SELECT title FROM tasks WHERE user_id = capability_user_id()")
    return {
        "mine": [r["title"] for r in mine],
        "user": [ctx.platform, ctx.user_id, ctx.user_name, ctx.timezone, ctx.is_admin],
        "now": ctx.now().isoformat(),
        "titles": [r["title"] for r in rows],
    }
"""
FORGE_CAP = """
async def forge(params, ctx):
    forged = await ctx.query(
        "SELECT t.title FROM (SELECT set_config('app.user_id', $1, true)) s, tasks t", params["id"]
    )
    try:
        await ctx.query("SELECT set_config('role', 'none', true)")
    except Exception as e:
        role = type(e).__name__ + ": " + str(e)
    try:
        await ctx.query("SELECT count(*) AS n FROM messages")
    except Exception as e:
        other = str(e)
    return {"forged": forged, "role": role, "other": other}
"""


async def test_capability_queries_see_what_the_speaking_user_may_see(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = admin_core(make_core, DEFAULT_TIMEZONE="Europe/Berlin")
    assert (await write(core, fake_llm, "my_tasks", QUERY_CAP))["ok"]
    assert (await write(core, fake_llm, "forge", FORGE_CAP, {"type": "object"}))["ok"]
    for user, title in ((ADMIN, "admin's task"), (MEMBER, "member's task"), ("3", "third's task")):
        await call(core, fake_llm, "manage_tasks", {"action": "create", "title": title}, user=user)
    member = (await call(core, fake_llm, "my_tasks", user=MEMBER))["result"]
    assert member["titles"] == ["member's task"]
    assert member["user"] == ["telegram", MEMBER, "Ann", "Europe/Berlin", False]
    assert member["now"] == "2026-11-21T11:00:00+01:00"
    admin = (await call(core, fake_llm, "my_tasks", user=ADMIN))["result"]
    assert admin["titles"] == ["admin's task", "member's task", "third's task"]
    assert admin["mine"] == ["admin's task"] and member["mine"] == ["member's task"]
    admin_id = await pool.fetchval("SELECT id FROM users WHERE platform_user_id = $1", ADMIN)
    forged = (await call(core, fake_llm, "forge", {"id": str(admin_id)}, user=MEMBER))["result"]
    assert forged["forged"] == []  # claiming another user's id shows nothing
    assert 'cannot set parameter "role"' in forged["role"]
    assert "permission denied for table messages" in forged["other"]


async def test_non_admin_queries_refused_clearly_without_the_reader_role(
    pg_server: str, template_dsn: str, fake_llm: FakeOpenAI, make_settings: Any, make_llm: Any, clock: Any
) -> None:
    from core.storage.db import create_pool
    from core.storage.migrations import migrate

    admin = await asyncpg.connect(pg_server)
    login, dbname = f"plain_{os.getpid()}", f"plain_db_{os.getpid()}"
    try:
        try:
            await admin.execute(f"CREATE ROLE {login} LOGIN")  # no CREATEROLE, not a superuser
            await admin.execute(f"CREATE DATABASE {dbname} OWNER {login}")
            parts = urlsplit(with_database(pg_server, dbname))
            dsn = urlunsplit(parts._replace(netloc=f"{login}@{parts.netloc.rsplit('@', 1)[-1]}"))
            pool = await create_pool(dsn, min_size=1, max_size=4)
        except asyncpg.PostgresError as e:  # a TEST_DATABASE_URL server may not allow this
            pytest.skip(f"cannot log in as a plain database user here: {e}")
        try:
            assert "003_capabilities.sql" in await migrate(pool)  # the reader part is skipped, not fatal
            settings = make_settings(ADMINS=f"telegram:{ADMIN}", ALLOWED_USERS="*")
            core = Core(settings, pool, make_llm(settings), clock=clock)
            assert (await write(core, fake_llm, "my_tasks", QUERY_CAP))["ok"]
            refused = await call(core, fake_llm, "my_tasks", user=MEMBER)
            assert refused["error"]["code"] == "tool_error"
            assert "queries for non-admin users are off" in refused["error"]["message"]
            assert (await call(core, fake_llm, "my_tasks", user=ADMIN))["ok"]
        finally:
            await pool.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        await admin.execute(f"DROP ROLE IF EXISTS {login}")
        await admin.close()


async def test_full_restart_exits_only_after_the_answer_was_consumed(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = admin_core(make_core)
    stopped: list[int | None] = []
    core.on_exit(lambda: stopped.append(core.exit_code))
    fake_llm.script(Reply(tool_calls=[("restart", {"mode": "full"})]), Reply(text="Restarting now."))
    async with aclosing(core.handle(incoming("restart yourself", user=ADMIN))) as events:
        async for event in events:
            if isinstance(event, Assistant):
                assert event.text == "Restarting now." and stopped == []  # not before the reply is sent
    assert stopped == [EXIT_RESTART]


async def test_python_m_bot_exits_42_after_printing_the_answer(
    fake_llm: FakeOpenAI, db_dsn: str, tmp_path: Path
) -> None:
    fake_llm.script(Reply(tool_calls=[("restart", {"mode": "full"})]), Reply(text="Restarting, back in a moment."))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_"))}
    env.update(PYTHONPATH=str(ROOT), DATABASE_URL=db_dsn, LLM_BASE_URL=fake_llm.base_url, LLM_API_KEY="test")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        env=env,
        cwd=str(tmp_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"please restart\n")
    await proc.stdin.drain()  # stdin stays open: the bot must leave on its own
    try:
        code = await asyncio.wait_for(proc.wait(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
        proc.stdin.close()
    out, err = (await proc.stdout.read()).decode(), (await proc.stderr.read()).decode()
    assert code == EXIT_RESTART, err
    assert "bot › Restarting, back in a moment." in out
    assert "✅ restart full → the bot restarts right after this answer is sent" in out


def test_loop_script_restarts_on_42_and_stops_on_other_codes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fake_bot = f'echo run >> "{runs}"; [ "$(wc -l < "{runs}")" -lt 3 ] && exit 42; exit 3'
    env = {**os.environ, "BOT_COMMAND": fake_bot, "BOT_RESTART_DELAY": "0"}
    done = subprocess.run(["bash", str(ROOT / "bot" / "loop.sh")], env=env, capture_output=True, timeout=30)
    assert done.returncode == 3
    assert runs.read_text().count("run") == 3
