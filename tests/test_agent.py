"""The agent loop through the real openai SDK against the fake model server."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from core.front_door import default_registry
from core.storage.db import Pool
from core.tools.framework import Tool, ToolContext
from core.types import AssistantDelta, Error, ToolCall, ToolResult
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, final, incoming, run, tool_messages, tool_names


async def test_text_answer_and_messages_stored(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    fake_llm.script(Reply(text="Hello **there**"))
    a = answer(await run(core, incoming("hi")))
    assert a.text == "Hello **there**" and a.steps == ()
    rows = await pool.fetch("SELECT role, content FROM messages ORDER BY id")
    assert [(r["role"], r["content"]) for r in rows] == [("user", "hi"), ("assistant", "Hello **there**")]
    assert await pool.fetchval("SELECT status FROM turns") == "done"


async def test_system_prompt_has_local_time_and_the_request_the_tools(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    fake_llm.script(Reply(text="ok"))
    await run(core, incoming("hi"))
    system = fake_llm.requests[0]["messages"][0]
    assert system["role"] == "system"
    # the fake clock is 10:00 UTC on Saturday 2026-11-21 → 11:00 in Berlin
    assert "Saturday 2026-11-21 11:00 (Europe/Berlin, UTC+01:00)" in system["content"]
    assert "manage_tasks" in tool_names(fake_llm.requests[0])
    assert "manage_tasks" not in system["content"], "the tools are named once, in the request's tools"


async def test_several_tool_calls_in_one_step_run_in_order(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(
        Reply(
            tool_calls=[
                ("manage_tasks", {"action": "create", "title": "A", "due_at": "2026-11-22T09:00"}),
                ("manage_tasks", {"action": "create", "title": "B"}),
                ("manage_tasks", {"action": "list"}),
            ]
        ),
        Reply(text="Made two."),
    )
    events = await run(core, incoming("two tasks"))
    kinds = [e.type for e in events]
    assert kinds == ["tool_call", "tool_result"] * 3 + ["assistant"]
    listing = tool_messages(fake_llm.requests[1])[2]
    assert [t["title"] for t in listing["result"]["tasks"]] == ["A", "B"]
    assert answer(events).steps[0].outcome == 'created #1 "A", Sun 22 Nov 09:00 UTC'


async def test_invalid_json_arguments(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(tool_calls=[("manage_tasks", '{"action": "list"')]), Reply(text="sorry"))
    a = answer(await run(core, incoming("list")))
    env = tool_messages(fake_llm.requests[1])[0]
    assert env["ok"] is False and env["error"]["code"] == "invalid_args"
    assert "not valid JSON" in env["error"]["message"]
    assert a.steps[0].error_code == "invalid_args"


async def test_arguments_failing_validation(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "explode", "id": "x"})]), Reply(text="hm"))
    await run(core, incoming("do it"))
    env = tool_messages(fake_llm.requests[1])[0]
    assert env["error"]["code"] == "invalid_args"
    assert "action" in env["error"]["message"] and "id" in env["error"]["message"]


async def test_unknown_tool(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(tool_calls=[("launch_rockets", {})]), Reply(text="can't"))
    await run(core, incoming("go"))
    env = tool_messages(fake_llm.requests[1])[0]
    assert env["error"]["code"] == "unknown_function"
    assert "manage_tasks" in env["error"]["message"]


class _NoParams(BaseModel):
    """No parameters."""


async def test_tool_that_raises(
    make_settings: Any, fake_llm: FakeOpenAI, pool: Pool, clock: Any, allowed_errors: list[str], make_llm: Any
) -> None:
    from core.front_door import Core

    async def boom(_: _NoParams, ctx: ToolContext) -> str:
        raise RuntimeError("disk on fire")

    registry = default_registry()
    registry.add(Tool("boom", "explodes", _NoParams, boom))
    settings = make_settings()
    core = Core(settings, pool, make_llm(settings, max_retries=0), registry=registry, clock=clock)
    allowed_errors.append("tool boom failed")
    fake_llm.script(Reply(tool_calls=[("boom", {})]), Reply(text="It failed."))
    a = answer(await run(core, incoming("boom")))
    env = tool_messages(fake_llm.requests[1])[0]
    assert env == {"ok": False, "error": {"code": "tool_error", "message": "RuntimeError: disk on fire"}}
    assert a.text == "It failed." and not a.steps[0].ok


async def test_slow_tool_times_out(
    make_settings: Any, fake_llm: FakeOpenAI, pool: Pool, clock: Any, make_llm: Any
) -> None:
    from core.front_door import Core

    async def slow(_: _NoParams, ctx: ToolContext) -> str:
        await asyncio.Event().wait()  # never finishes on its own
        return "never"

    registry = default_registry()
    registry.add(Tool("slow", "slow", _NoParams, slow))
    settings = make_settings(AGENT_STEP_TIMEOUT=0.3)
    core = Core(settings, pool, make_llm(settings, max_retries=0), registry=registry, clock=clock)
    fake_llm.script(Reply(tool_calls=[("slow", {})]), Reply(text="gave up"))
    a = answer(await run(core, incoming("slow please")))
    assert tool_messages(fake_llm.requests[1])[0]["error"]["code"] == "timeout"
    assert a.text == "gave up"


async def test_step_limit_gives_best_effort_answer(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core(AGENT_MAX_STEPS=3)
    looping = Reply(tool_calls=[("manage_tasks", {"action": "list"})])
    fake_llm.script(looping, looping, looping, Reply(text="I listed your tasks three times."))
    a = answer(await run(core, incoming("loop")))
    assert len(a.steps) == 3 and a.cut_short == "the step limit (3 steps)"
    assert a.text.startswith("I listed your tasks three times.")
    assert "Cut short: the step limit (3 steps)" in a.text
    wrap_up = fake_llm.requests[3]
    assert wrap_up["tool_choice"] == "none"
    assert await pool.fetchval("SELECT status FROM turns") == "cut_short"


async def test_step_limit_without_model_summary(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(AGENT_MAX_STEPS=2)
    looping = Reply(tool_calls=[("manage_tasks", {"action": "list"})])
    fake_llm.script(looping, looping, Reply(status=500), Reply(status=500))
    a = answer(await run(core, incoming("loop")))
    assert "I had to stop before finishing: the step limit (2 steps)" in a.text
    assert "manage_tasks list → 0 open tasks" in a.text


async def test_per_step_timeout(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core(AGENT_STEP_TIMEOUT=0.3)
    fake_llm.script(Reply(text="too late", delay=5))
    a = answer(await run(core, incoming("hello?")))
    assert a.cut_short is not None and "did not answer within" in a.cut_short
    assert "I had to stop before finishing" in a.text
    # the user's message and the best-effort answer are both stored
    assert await pool.fetchval("SELECT count(*) FROM messages") == 2


async def test_total_timeout(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(AGENT_TOTAL_TIMEOUT=0.5, AGENT_STEP_TIMEOUT=5)
    slow_loop = Reply(tool_calls=[("manage_tasks", {"action": "list"})], delay=0.2)
    fake_llm.script(slow_loop, slow_loop, slow_loop, slow_loop, slow_loop)
    a = answer(await run(core, incoming("go")))
    assert a.cut_short is not None and ("time limit" in a.cut_short or "did not answer" in a.cut_short)
    assert len(fake_llm.requests) <= 4


async def test_llm_500_then_success(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(status=500), Reply(text="recovered"))
    assert answer(await run(core, incoming("hi"))).text == "recovered"
    assert len(fake_llm.requests) == 2


async def test_llm_down_user_told_and_message_stored(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    fake_llm.down()
    last = final(await run(core, incoming("are you there?")))
    assert isinstance(last, Error) and last.code == "llm_unavailable"
    assert "could not be used" in last.message and "Your message is saved" in last.message
    assert await pool.fetchval("SELECT content FROM messages WHERE role = 'user'") == "are you there?"
    assert await pool.fetchval("SELECT status FROM turns") == "failed"
    await fake_llm.up()
    fake_llm.script(Reply(text="back"))
    assert answer(await run(core, incoming("now?"))).text == "back"


async def test_empty_output_retried_once_with_note(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(text=""), Reply(text="Sorry, here it is."))
    a = answer(await run(core, incoming("hi")))
    assert a.text == "Sorry, here it is."
    assert "previous reply was empty or malformed" in fake_llm.requests[1]["messages"][-1]["content"]


async def test_malformed_output_twice_ends_with_best_effort(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(raw={"nonsense": True}), Reply(raw={"choices": []}))
    a = answer(await run(core, incoming("hi")))
    assert a.cut_short == "the model's reply was malformed twice"
    assert len(fake_llm.requests) == 2


async def test_streaming_yields_deltas(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "list"})]),
        Reply(text="You have no open tasks right now, enjoy the day."),
    )
    events = await run(core, incoming("tasks?"), stream=True)
    deltas = [e.text for e in events if isinstance(e, AssistantDelta)]
    assert len(deltas) > 1
    assert "".join(deltas) == answer(events).text
    assert any(isinstance(e, ToolCall) for e in events) and any(isinstance(e, ToolResult) for e in events)
    assert fake_llm.requests[0]["stream"] is True


async def test_history_replay_keeps_tool_calls_with_results(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    # each turn stores 4 messages (user, assistant+tool_calls, tool, assistant); a window of 6
    # would start in the middle of a turn: the replay must begin at a user message
    core = make_core(HISTORY_MESSAGES=6)
    for i in range(3):
        fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "list"})]), Reply(text=f"answer {i}"))
        answer(await run(core, incoming(f"question {i}")))
    fake_llm.script(Reply(text="final"))
    answer(await run(core, incoming("last")))
    msgs = fake_llm.requests[-1]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert msgs[1]["content"] == "question 2" and msgs[-1]["content"] == "last"


async def test_history_skips_calls_left_without_results(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    fake_llm.script(Reply(text="first"))
    answer(await run(core, incoming("one")))
    # a crash between storing the tool call and its result leaves an orphan call
    await pool.execute(
        "INSERT INTO messages (chat_id, role, tool_calls) SELECT id, 'assistant',"
        ' \'[{"id": "call_x", "type": "function", "function": {"name": "manage_tasks",'
        ' "arguments": "{}"}}]\'::jsonb FROM chats'
    )
    fake_llm.script(Reply(text="fine"))
    assert answer(await run(core, incoming("two"))).text == "fine"  # the fake rejects invalid lists with 400
    roles = [m["role"] for m in fake_llm.requests[-1]["messages"]]
    assert roles == ["system", "user", "assistant", "user"]


async def test_tool_output_truncated_for_prompt_but_stored_whole(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.script(
        Reply(tool_calls=[("execute_sql", {"query": "SELECT repeat('x', 100) AS v FROM generate_series(1, 50)"})]),
        Reply(text="ok"),
    )
    answer(await run(core, incoming("sql", platform="console", user="local")))
    prompt_copy = next(m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool")["content"]
    stored = await pool.fetchval("SELECT content FROM messages WHERE role = 'tool'")
    assert len(stored) > 5000
    assert prompt_copy.startswith(stored[:4000]) and prompt_copy.endswith("more characters]")
