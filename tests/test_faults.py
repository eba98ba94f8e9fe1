"""Faults around the bot: dropped database connections, malformed or refused model replies, cut answers."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from bot.app import quiet_dropped_connections
from core.activity import step_line
from core.constants import TOOL_ARGUMENTS_PROMPT_CHARS
from core.storage import conversations
from core.storage.db import Pool, is_dropped
from core.types import Error, ToolCall
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, drop_blocked_statement, final, incoming, run, tool_messages

# ---- what the user sees when a tool fails or the answer is cut ------------------------------------


async def test_failed_tool_activity_line_shows_its_error(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call", "due_at": "2026-11-20T09:00"})]),
        Reply(text="Done!"),
    )
    a = answer(await run(core, incoming("remind me yesterday")))
    line = step_line(a.steps[0])
    assert line.startswith("⚠️ manage_tasks create → tool_error: due_at ") and "is in the past" in line
    assert len(a.steps[0].outcome) <= 90


@pytest.mark.parametrize("stream", [False, True])
async def test_answer_cut_by_the_length_limit_says_so(make_core: MakeCore, fake_llm: FakeOpenAI, stream: bool) -> None:
    core = make_core()
    fake_llm.script(Reply(text="The three steps are: first, you", finish_reason="length"))
    a = answer(await run(core, incoming("explain"), stream=stream))
    assert a.text.startswith("The three steps are: first, you")
    assert a.text.endswith("(cut short: the model hit its length limit)_")


# ---- the model's faults ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_malformed_reply_gets_a_corrective_retry(make_core: MakeCore, fake_llm: FakeOpenAI, stream: bool) -> None:
    core = make_core()
    fake_llm.script(Reply(text="Half an ans", bad_sse=["{this is not json"]), Reply(text="Here is the answer."))
    a = answer(await run(core, incoming("hi"), stream=stream))
    assert a.text == "Here is the answer." and a.cut_short is None
    assert "previous reply was empty or malformed" in fake_llm.requests[1]["messages"][-1]["content"]


async def test_malformed_streamed_events_twice_end_with_a_clear_message(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.script(Reply(text="a", bad_sse=["oops"]), Reply(text="b", bad_sse=["{still: bad"]))
    a = answer(await run(core, incoming("hi"), stream=True))
    assert a.cut_short == "the model's reply was malformed twice"
    assert "malformed" in a.text
    assert await pool.fetchval("SELECT status FROM turns") == "cut_short"


async def test_streamed_json_that_is_no_chunk_is_malformed_too(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    """Streamed chunks are read as plain JSON (not the SDK's models): a number, a list or odd field types are a
    malformed reply (corrected once), never a crash."""
    core = make_core()
    odd = '{"choices": [{"delta": {"content": 5, "tool_calls": [7, {"index": "x"}]}}, 3], "usage": []}'
    fake_llm.script(Reply(text="a", bad_sse=["5"]), Reply(text="Fine after all.", bad_sse=[odd]))
    a = answer(await run(core, incoming("hi"), stream=True))
    assert "previous reply was empty or malformed" in fake_llm.requests[1]["messages"][-1]["content"]
    assert a.text == "Fine after all." and a.steps == ()


async def test_model_400_shows_the_servers_reason_without_a_key_hint(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    reason = "the request (9000 tokens) exceeds the available context size (4096 tokens), try increasing it\nmore"
    fake_llm.script(Reply(status=400, text=reason))
    last = final(await run(core, incoming("hi")))
    assert isinstance(last, Error) and last.code == "llm_unavailable"
    assert "it answered 400: the request (9000 tokens) exceeds the available context size (4096 tokens)" in (
        last.message
    )
    assert "\n" not in last.message and "LLM_API_KEY" not in last.message
    assert "/reset starts a fresh one" in last.message and "try again in a moment" not in last.message


async def test_huge_tool_arguments_are_cut_in_later_requests(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    huge = {"action": "create", "title": "x", "details": "y" * 1_000_000}
    fake_llm.script(Reply(tool_calls=[("manage_tasks", huge)]), Reply(text="ok"), Reply(text="next"))
    answer(await run(core, incoming("store this")))
    answer(await run(core, incoming("and now?")))
    for request in fake_llm.requests[1:]:
        assert len(json.dumps(request)) < 50_000
        (call,) = next(m for m in request["messages"] if m.get("tool_calls"))["tool_calls"]
        assert "_truncated" in json.loads(call["function"]["arguments"])
    stored = await pool.fetchval("SELECT tool_calls FROM messages WHERE tool_calls IS NOT NULL")
    assert len(stored[0]["function"]["arguments"]) > TOOL_ARGUMENTS_PROMPT_CHARS  # the DB keeps it whole


async def test_huge_answers_and_tool_names_are_cut_in_later_requests(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(tool_calls=[("n" * 1_000_000, {})]), Reply(text="q" * 1_000_000), Reply(text="next"))
    answer(await run(core, incoming("do it")))
    answer(await run(core, incoming("and now?")))
    assert len(json.dumps(fake_llm.requests[-1])) < 50_000  # the 1 MB name and the 1 MB answer are cut


async def test_turns_left_running_by_a_dead_process_are_closed_at_start(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(AGENT_TOTAL_TIMEOUT=60)
    fake_llm.script(Reply(text="a"), Reply(text="b"))
    answer(await run(core, incoming("one", message_id="1")))
    answer(await run(core, incoming("two", message_id="2")))
    await pool.execute("UPDATE turns SET status = 'running', finished_at = NULL")
    await pool.execute("UPDATE turns SET started_at = now() - interval '1 hour' WHERE platform_message_id = '1'")
    assert await core.close_abandoned_turns() == 1  # the other one may still belong to a live process
    rows = await pool.fetch("SELECT platform_message_id, status FROM turns ORDER BY id")
    assert [(r["platform_message_id"], r["status"]) for r in rows] == [("1", "cut_short"), ("2", "running")]
    assert await conversations.close_abandoned_turns(pool, timedelta(minutes=10)) == 0


# ---- dropped database connections -----------------------------------------------------------------


async def _drop_all_connections(dsn: str) -> int:
    """Terminate every other backend of the test database, as a failover or restart would."""
    conn = await asyncpg.connect(dsn)
    try:
        pids: list[int] = await conn.fetchval(
            "SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}') FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        for _ in range(5000):  # until those backends are gone (new connections may already be opening)
            if not await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = ANY($1::int[]))", pids
            ):
                break
        else:
            raise AssertionError(f"backends {pids} did not end")
        return len(pids)
    finally:
        await conn.close()


async def test_messages_after_dropped_idle_connections_are_answered(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, db_dsn: str
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="answered")
    for i in range(4):
        await _drop_all_connections(db_dsn)
        assert answer(await run(core, incoming(f"message {i}", message_id=str(i)))).text == "answered"
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 4
    assert await pool.fetchval("SELECT count(*) FROM turns WHERE status = 'done'") == 4


async def test_message_whose_statement_is_cut_by_a_dropped_connection_is_stored_and_answered(
    make_core: MakeCore,
    fake_llm: FakeOpenAI,
    pool: Pool,
    db_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="answered")
    answer(await run(core, incoming("first", message_id="1")))
    holder = await asyncpg.connect(db_dsn)
    try:
        await holder.execute("BEGIN; SELECT * FROM users FOR UPDATE")  # begin_turn's user upsert will wait
        turn = asyncio.create_task(run(core, incoming("second", message_id="2")))
        await drop_blocked_statement(db_dsn, holder)
        assert answer(await turn).text == "answered"
    finally:
        await holder.close()
    assert "storing a message lost its database connection" in caplog.text
    rows = await pool.fetch("SELECT content FROM messages WHERE role = 'user' ORDER BY id")
    assert [r["content"] for r in rows] == ["first", "second"]
    assert await pool.fetchval("SELECT count(*) FROM turns WHERE status = 'done'") == 2


async def test_answer_whose_write_is_cut_by_a_dropped_connection_is_stored_once(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    core = make_core()
    holder = await asyncpg.connect(db_dsn)

    async def lock_the_turn(_: dict[str, Any]) -> Reply:
        await holder.execute("BEGIN; SELECT * FROM turns FOR UPDATE")  # the answer's UPDATE of the turn waits
        asyncio.get_running_loop().call_soon(lambda: dropping.append(asyncio.ensure_future(drop())))
        return Reply(text="All done.")

    async def drop() -> None:
        await drop_blocked_statement(db_dsn, holder)

    dropping: list[asyncio.Future[None]] = []
    fake_llm.script(lock_the_turn)
    try:
        assert answer(await run(core, incoming("go", message_id="m1"))).text == "All done."
        await asyncio.gather(*dropping)
    finally:
        await holder.close()
    assert "storing the answer lost its database connection" in caplog.text
    roles = [r["role"] for r in await pool.fetch("SELECT role FROM messages ORDER BY id")]
    assert roles == ["user", "assistant"]
    assert await pool.fetchval("SELECT status FROM turns") == "done"


async def test_connections_dropped_mid_turn_do_not_lose_or_duplicate_anything(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, db_dsn: str
) -> None:
    core = make_core()

    def drop_then(reply: Reply) -> Callable[[dict[str, Any]], Awaitable[Reply]]:
        async def responder(_: dict[str, Any]) -> Reply:
            await _drop_all_connections(db_dsn)  # while the model "thinks", every pooled connection dies
            return reply

        return responder

    fake_llm.script(
        drop_then(Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Milk"})])),
        drop_then(Reply(tool_calls=[("manage_tasks", {"action": "list"})])),
        drop_then(Reply(text="All done.")),
    )
    a = answer(await run(core, incoming("add milk", message_id="m1")))
    assert a.text == "All done." and [s.ok for s in a.steps] == [True, True]
    assert tool_messages(fake_llm.requests[2])[-1]["ok"]
    roles = [r["role"] for r in await pool.fetch("SELECT role FROM messages ORDER BY id")]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert await pool.fetchval("SELECT status FROM turns") == "done"
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


async def test_retried_begin_turn_takes_back_its_own_committed_turn(pool: Pool) -> None:
    inc = incoming("hello", message_id="77")
    due_before = datetime(2100, 1, 1, tzinfo=UTC)
    start = await conversations.begin_turn(pool, inc, "UTC", 40, due_before, 10)
    chat, first = start.chat, start.turn_id
    assert first is not None
    # the first attempt committed but its answer was lost: the retry must answer, not call it a duplicate
    row = await pool.fetchrow(
        conversations._BEGIN_WITH_CONTEXT_SQL,
        inc.platform,
        inc.user_id,
        inc.user_name,
        inc.chat_id,
        inc.thread_id,
        inc.chat_kind,
        inc.chat_title,
        inc.message_id,
        inc.text,
        True,
        True,
        39,
        due_before,
        10,
        False,
        True,
        [],
        [],
        [],
        "job:%",
        *conversations._NO_BUDGET,
        inc.chat_platform,
        False,
    )
    assert row is not None and row["turn_id"] == first
    assert row["history"] == []  # the taken-back turn's own message is not replayed twice
    assert row["memory"] == []  # a private turn loads the (empty) core memory in the same round trip
    assert await pool.fetchval("SELECT count(*) FROM messages") == 1
    # the same for the later writes: a retry after a commit whose answer was lost stores nothing twice
    calls = [{"id": "c1", "type": "function", "function": {"name": "manage_tasks", "arguments": "{}"}}]
    usage = (row["user_id"], None, due_before, "UTC", "fake-model", 5, 1, 0)  # usage_record's, with the answer
    for _ in range(2):
        await pool.execute(conversations._ADD_ASSISTANT_ONCE_SQL, chat.id, first, None, calls)
        await pool.execute(
            conversations._ADD_TOOL_ONCE_SQL, chat.id, first, '{"ok": true}', "c1", "manage_tasks", True, 1, None
        )
        await pool.execute(conversations._FINISH_ONCE_SQL, chat.id, first, "hi", "done", 1, *usage)
    roles = [r["role"] for r in await pool.fetch("SELECT role FROM messages ORDER BY id")]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert await pool.fetchval("SELECT sum(calls) FROM token_usage") == 1  # its model call's usage counted once
    # once answered, the same message is a duplicate even on a retry
    assert (await conversations.begin_turn(pool, inc, "UTC", 40, due_before, 10)).turn_id is None


async def test_turn_cancelled_or_closed_midway_is_not_left_running(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    thinking, never = asyncio.Event(), asyncio.Event()

    async def slow(_: dict[str, Any]) -> Reply:
        thinking.set()
        await never.wait()
        return Reply(text="too late")

    fake_llm.script(slow)
    turn = asyncio.create_task(run(core, incoming("one", message_id="1")))
    await thinking.wait()
    turn.cancel()  # as drain() does with answers still running at shutdown
    with pytest.raises(asyncio.CancelledError):
        await turn
    fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "list"})]), Reply(text="unused"))
    async with aclosing(core.handle(incoming("two", message_id="2"))) as events:
        async for event in events:
            if isinstance(event, ToolCall):
                break  # the adapter gives up on the turn
    rows = await pool.fetch("SELECT platform_message_id, status FROM turns ORDER BY id")
    assert [(r["platform_message_id"], r["status"]) for r in rows] == [("1", "cut_short"), ("2", "cut_short")]


def test_half_closed_connection_errors_count_as_dropped() -> None:
    # seen under load: the server's "terminating connection" arrived, the socket close not yet
    assert is_dropped(asyncpg.InternalClientError("cannot switch to state 11; another operation (2) is in progress"))
    assert is_dropped(asyncpg.InterfaceError("connection is closed"))
    assert is_dropped(asyncpg.AdminShutdownError("terminating connection due to administrator command"))
    assert not is_dropped(asyncpg.InterfaceError("cannot perform operation: another operation is in progress"))
    assert not is_dropped(asyncpg.UniqueViolationError("duplicate key"))


class Connection:
    """Stands for asyncpg's Connection (its close's qualified name is what the handler knows)."""

    async def close(self) -> None:
        """A close whose socket broke."""
        raise BrokenPipeError(32, "Broken pipe")


async def test_a_dropped_connection_closed_in_the_background_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """asyncpg's unawaited close of an expired connection whose socket broke: one warning, no traceback; any other
    unretrieved task error still reaches asyncio's handler."""

    loop = asyncio.get_running_loop()
    task = loop.create_task(Connection().close())
    await asyncio.wait({task})
    caplog.set_level(logging.WARNING)
    quiet_dropped_connections(
        loop, {"message": "Task exception was never retrieved", "exception": task.exception(), "future": task}
    )
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "a dropped database connection could not be closed cleanly (BrokenPipeError)")
    ]
    caplog.clear()

    async def other() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    task2 = loop.create_task(other())
    await asyncio.wait({task2})
    quiet_dropped_connections(
        loop, {"message": "Task exception was never retrieved", "exception": task2.exception(), "future": task2}
    )
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    caplog.clear()
