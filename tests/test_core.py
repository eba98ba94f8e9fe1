"""The core entry: access policy, admin tools, de-duplication, per-chat order, cross-chat concurrency."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from core.storage.db import Pool
from core.types import Error
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, final, incoming, run, tool_messages, tool_names


async def test_not_allowed_user_refused_with_id_and_nothing_stored(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(ADMINS="telegram:1", ALLOWED_USERS="telegram:2")
    events = await run(core, incoming("hello", user="666"))
    last = final(events)
    assert isinstance(last, Error) and last.code == "not_allowed"
    assert "666" in last.message and "telegram:666" in last.message
    assert fake_llm.requests == []
    assert await pool.fetchval("SELECT count(*) FROM messages") == 0
    # told once per chat per hour, not on every message
    assert await run(core, incoming("hello again", user="666")) == []


async def test_allowed_users_default_is_admins_only(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(ADMINS="telegram:1", ALLOWED_USERS="")
    fake_llm.script(Reply(text="hi admin"))
    assert answer(await run(core, incoming("hi", user="1"))).text == "hi admin"
    assert isinstance(final(await run(core, incoming("hi", user="2"))), Error)
    core = make_core(ADMINS="", ALLOWED_USERS="*")
    fake_llm.script(Reply(text="hi anyone"))
    assert answer(await run(core, incoming("hi", user="2"))).text == "hi anyone"


async def test_non_admin_never_sees_execute_sql_and_forged_call_forbidden(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(ADMINS="telegram:1", ALLOWED_USERS="telegram:2")
    fake_llm.script(Reply(tool_calls=[("execute_sql", {"query": "DELETE FROM users"})]), Reply(text="no"))
    a = answer(await run(core, incoming("drop everything", user="2")))
    assert "execute_sql" not in tool_names(fake_llm.requests[0])
    assert "execute_sql" not in fake_llm.requests[0]["messages"][0]["content"]
    assert tool_messages(fake_llm.requests[1])[0]["error"]["code"] == "forbidden"
    assert a.steps[0].outcome == "forbidden: execute_sql is only available to admins"
    assert await pool.fetchval("SELECT count(*) FROM users") == 1


async def test_admin_execute_sql_rows_and_counts(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(ADMINS="telegram:1", AGENT_STEP_TIMEOUT=1.5)
    fake_llm.script(
        Reply(
            tool_calls=[
                ("execute_sql", {"query": "SELECT platform, platform_user_id FROM users"}),
                ("execute_sql", {"query": "UPDATE users SET display_name = 'Boss'"}),
                ("execute_sql", {"query": "SELECT pg_sleep(10)"}),
                ("execute_sql", {"query": "SELEC nonsense"}),
            ]
        ),
        Reply(text="done"),
    )
    answer(await run(core, incoming("sql", user="1")))
    assert "execute_sql" in tool_names(fake_llm.requests[0])
    rows, update, slow, bad = tool_messages(fake_llm.requests[1])
    assert rows["result"]["rows"] == [{"platform": "telegram", "platform_user_id": "1"}]
    assert update["result"]["row_count"] == 1
    assert slow["error"]["code"] == "tool_error" and "cancelled" in slow["error"]["message"]
    assert bad["error"]["code"] == "tool_error" and "syntax" in bad["error"]["message"].lower()


async def test_execute_sql_caps_rows(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(ADMINS="telegram:1")
    fake_llm.script(
        Reply(tool_calls=[("execute_sql", {"query": "SELECT g FROM generate_series(1, 500) g"})]), Reply(text="ok")
    )
    answer(await run(core, incoming("sql", user="1")))
    res = tool_messages(fake_llm.requests[1])[0]["result"]
    assert len(res["rows"]) == 50 and res["row_count"] == 500 and res["truncated"] is True


async def test_same_message_id_answered_once(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    fake_llm.script(Reply(text="once"))
    first = await run(core, incoming("hi", message_id="42"))
    second = await run(core, incoming("hi", message_id="42"))
    assert answer(first).text == "once" and second == []
    assert len(fake_llm.requests) == 1
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 1
    # the same id in another chat is another message
    fake_llm.script(Reply(text="other chat"))
    assert answer(await run(core, incoming("hi", message_id="42", chat="-5", kind="group"))).text == "other chat"


async def test_duplicate_delivered_concurrently_answered_once(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(text="once", delay=0.2))
    results = await asyncio.gather(*(run(core, incoming("hi", message_id="7")) for _ in range(3)))
    assert sorted(len(r) for r in results) == [0, 0, 1]
    assert len(fake_llm.requests) == 1


async def test_one_turn_at_a_time_per_chat(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    active = 0
    peak = 0

    async def responder(req: dict[str, Any]) -> Reply:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        return Reply(text=f"re: {req['messages'][-1]['content']}")

    fake_llm.script(responder, responder, responder)
    results = await asyncio.gather(*(run(core, incoming(f"m{i}", message_id=str(i))) for i in range(3)))
    assert peak == 1
    assert [answer(r).text for r in results] == ["re: m0", "re: m1", "re: m2"]
    # each later turn saw the earlier answers in order
    last = fake_llm.requests[-1]["messages"]
    assert [m["content"] for m in last[1:]] == ["m0", "re: m0", "m1", "re: m1", "m2"]


async def test_chats_run_concurrently(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(*[Reply(text="slow", delay=0.5) for _ in range(10)])
    start = time.perf_counter()
    results = await asyncio.gather(*(run(core, incoming("hi", user=str(u))) for u in range(10)))
    assert all(answer(r).text == "slow" for r in results)
    assert time.perf_counter() - start < 4.0  # ten 0.5 s answers in parallel, not 5 s in a row


async def test_huge_message_refused_without_llm(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    last = final(await run(core, incoming("x" * 16001)))
    assert isinstance(last, Error) and last.code == "too_long" and "16,000" in last.message
    assert fake_llm.requests == []
    assert await run(core, incoming("   ")) == []


async def test_group_messages_attributed_by_name(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.script(Reply(text="hi Ann"), Reply(text="hi Bob"))
    await run(core, incoming("hello", user="1", chat="-100", kind="group", name="Ann"))
    await run(core, incoming("me too", user="2", chat="-100", kind="group", name="Bob"))
    msgs = fake_llm.requests[-1]["messages"]
    assert [m["content"] for m in msgs[1:]] == ["Ann: hello", "hi Ann", "Bob: me too"]
    assert "group chat" in msgs[0]["content"]


async def test_reset_stops_replay_but_keeps_messages(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    fake_llm.script(Reply(text="a1"), Reply(text="a2"))
    await run(core, incoming("first"))
    await core.reset(incoming("/reset"))
    await run(core, incoming("second"))
    assert [m["content"] for m in fake_llm.requests[-1]["messages"][1:]] == ["second"]
    assert await pool.fetchval("SELECT count(*) FROM messages") == 4


async def test_commands_apply_the_access_policy_inside_the_core(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(ADMINS="telegram:1", ALLOWED_USERS="telegram:2")
    tasks = await core.command(incoming("/tasks", user="2"), "tasks")
    assert isinstance(tasks, str) and "no open tasks" in tasks
    refused = await core.command(incoming("/tasks", user="666"), "tasks")
    assert isinstance(refused, Error) and refused.code == "not_allowed" and "telegram:666" in refused.message
    assert await core.command(incoming("/status", user="666"), "status") is None  # told once per chat per hour
    again = await core.command(incoming("/help", user="666"), "help", must_answer=True)  # a slash command: always
    assert isinstance(again, Error) and "telegram:666" in again.message
    assert await core.command(incoming("/timezone", user="666"), "timezone", "Asia/Tokyo", must_answer=True) == again
    assert await pool.fetchval("SELECT count(*) FROM users") == 1  # the stranger left no trace
    assert fake_llm.requests == []


async def test_reminder_button_and_steps_only_for_their_owner_or_an_admin(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(ADMINS="telegram:1", ALLOWED_USERS="telegram:2,telegram:3,discord:2")
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum", "due_at": "2030-01-01T10:00"})]),
        Reply(text="Will do."),
    )
    assert answer(await run(core, incoming("remind me", user="2"))).text == "Will do."
    task_id = await pool.fetchval("SELECT id FROM tasks")
    turn_id = await pool.fetchval("SELECT id FROM turns")

    ok, text = await core.press_reminder(incoming("", user="666"), task_id, "done")  # may not use the bot
    assert not ok and "telegram:666" in text
    ok, text = await core.press_reminder(incoming("", user="3"), task_id, "done")  # allowed, not the owner
    assert not ok and text.startswith("Only the person")
    assert await pool.fetchval("SELECT status FROM tasks") == "pending"
    ok, text = await core.press_reminder(incoming("", user="2"), task_id, "done")
    assert ok and text == "✅ Done: Call mum"

    steps = await core.turn_steps(incoming("", user="2"), turn_id)
    assert not isinstance(steps, Error) and [s.name for s in steps.steps] == ["manage_tasks"]
    admin = await core.turn_steps(incoming("", user="1"), turn_id)
    assert not isinstance(admin, Error) and admin.turn_id == turn_id
    other = await core.turn_steps(incoming("", user="3"), turn_id)
    assert isinstance(other, Error) and other.code == "not_yours"
    stranger = await core.turn_steps(incoming("", user="666"), turn_id)
    assert isinstance(stranger, Error) and stranger.code == "not_allowed"
    elsewhere = await core.turn_steps(incoming("", user="2", platform="discord"), turn_id)
    assert isinstance(elsewhere, Error) and elsewhere.code == "gone"
    assert isinstance(await core.turn_steps(incoming("", user="2"), turn_id + 100), Error)


async def test_adapters_report_their_state_into_status(make_core: MakeCore) -> None:
    core = make_core(ADMINS="telegram:1")
    core.report_state("telegram", "@bot")
    core.report_poll("telegram")
    core.report_failed_delivery()
    status = await core.command(incoming("/status", user="1"), "status")
    assert isinstance(status, str)
    assert "adapters: telegram (@bot)" in status and "last successful telegram poll: 0 s ago" in status
    assert "(1 since this start)" in status
    core.report_state("telegram", None)
    assert "adapters: none" in str(await core.command(incoming("/status", user="1"), "status"))


def _request_chars(request: dict[str, Any]) -> int:
    """What a request costs in the prompt: its messages' text and the tools' JSON as the openai SDK sends it (no
    spaces after , and :), chars / 4 ≈ tokens (bench/prompt_size.py counts o200k_base tokens: about 7% fewer)."""
    messages = sum(len(m.get("content") or "") for m in request["messages"])
    return messages + len(json.dumps(request.get("tools", []), ensure_ascii=False, separators=(",", ":")))


async def test_prompt_for_hi_with_all_tools_stays_within_2000_tokens(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    """An admin's "hi" in a private chat with empty memory: every tool offered, ≤ 8,000 characters (2,000 tokens)."""
    core = make_core(ADMINS="telegram:1")
    fake_llm.script(Reply(text="hello"))
    await run(core, incoming("hi", user="1"))
    request = fake_llm.requests[0]
    offered = set(tool_names(request))
    assert {"execute_sql", "write_capability", "core_memory_append", "conversation_search"} <= offered
    # everything but read_attachment, which comes only with a document in the context (tests/test_media_telegram.py)
    assert offered == {t.name for t in core.registry.offered(True, True)} - {
        "read_attachment",
        "archival_memory_insert_file",
    }
    assert "<core_memory>" in request["messages"][0]["content"]
    chars = _request_chars(request)
    print(f"prompt for 'hi': {chars} characters ≈ {chars // 4} tokens")
    assert chars <= 8000
