"""manage_tasks and set_timezone: local times, past times refused, per-user isolation, recurrence."""

from __future__ import annotations

from datetime import UTC, datetime

from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_messages


async def _call(
    core: object,
    fake: FakeOpenAI,
    args: dict[str, object],
    *,
    user: str = "100",
    tool: str = "manage_tasks",
    platform: str = "telegram",
) -> dict[str, object]:
    """Have the fake model call one tool for `user`; return the envelope the model saw."""
    from core.front_door import Core

    assert isinstance(core, Core)
    fake.script(Reply(tool_calls=[(tool, args)]), Reply(text="ok"))
    answer(await run(core, incoming("do it", user=user, platform=platform)))
    env: dict[str, object] = tool_messages(fake.requests[-1])[-1]
    return env


async def test_create_in_user_zone_and_list(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    env = await _call(core, fake_llm, {"action": "create", "title": "Buy milk", "due_at": "2026-11-22T09:00"})
    assert env["ok"] is True
    assert env["result"]["summary"] == 'created #1 "Buy milk", Sun 22 Nov 09:00 CET'  # type: ignore[index]
    # 09:00 in Berlin (CET, UTC+1) is 08:00 UTC
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 22, 8, 0, tzinfo=UTC)
    env = await _call(core, fake_llm, {"action": "list"})
    assert env["result"]["tasks"] == [  # type: ignore[index]
        {"id": 1, "title": "Buy milk", "status": "pending", "due": "Sun 22 Nov 09:00 CET"}
    ]


async def test_explicit_offset_is_respected(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    await _call(core, fake_llm, {"action": "create", "title": "Call", "due_at": "2026-11-22T09:00-05:00"})
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 22, 14, 0, tzinfo=UTC)


async def test_past_time_refused_with_local_now(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core(DEFAULT_TIMEZONE="Asia/Tokyo")
    env = await _call(core, fake_llm, {"action": "create", "title": "Late", "due_at": "2026-11-21T18:00"})
    assert env["ok"] is False
    message = env["error"]["message"]  # type: ignore[index]
    # the fake clock is 10:00 UTC = 19:00 in Tokyo
    assert "is in the past" in message and "Sat 21 Nov 19:00 JST" in message and "Asia/Tokyo" in message
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_update_complete_delete(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    await _call(core, fake_llm, {"action": "create", "title": "Draft", "due_at": "2026-11-23T10:00"})
    env = await _call(core, fake_llm, {"action": "update", "id": 1, "title": "Final", "status": "in_progress"})
    assert env["result"]["task"]["title"] == "Final"  # type: ignore[index]
    assert env["result"]["task"]["due"] == "Mon 23 Nov 10:00 UTC"  # type: ignore[index]
    env = await _call(core, fake_llm, {"action": "complete", "id": 1})
    assert env["result"]["task"]["status"] == "done"  # type: ignore[index]
    env = await _call(core, fake_llm, {"action": "list"})
    assert env["result"]["tasks"] == []  # type: ignore[index]
    env = await _call(core, fake_llm, {"action": "delete", "id": 1})
    assert env["ok"] is True
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 0


async def test_user_b_cannot_touch_user_a_task(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    await _call(core, fake_llm, {"action": "create", "title": "A's secret", "due_at": "2026-11-23T10:00"}, user="1")
    for args in (
        {"action": "get", "id": 1},
        {"action": "update", "id": 1, "title": "pwned"},
        {"action": "complete", "id": 1},
        {"action": "delete", "id": 1},
    ):
        env = await _call(core, fake_llm, args, user="2")
        assert env["ok"] is False, args
        assert env["error"]["message"].startswith("task #1 not found"), args  # type: ignore[index]
    env = await _call(core, fake_llm, {"action": "list"}, user="2")
    assert env["result"]["tasks"] == []  # type: ignore[index]
    row = await pool.fetchrow("SELECT title, status FROM tasks WHERE id = 1")
    assert row is not None and (row["title"], row["status"]) == ("A's secret", "pending")


async def link(pool: Pool, telegram_id: str, discord_id: str) -> None:
    """Put the Discord identity on the Telegram identity's account (as /link does), dropping its own empty one."""
    await pool.execute(
        "WITH d AS (SELECT id, account_id FROM users WHERE platform = 'discord' AND platform_user_id = $2),"
        " moved AS (UPDATE users SET account_id = (SELECT account_id FROM users WHERE platform = 'telegram'"
        "  AND platform_user_id = $1) FROM d WHERE users.id = d.id)"
        " DELETE FROM accounts WHERE id = (SELECT account_id FROM d)",
        telegram_id,
        discord_id,
    )


async def test_two_people_each_linked_on_two_platforms_never_cross(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    for person in ("1", "2"):
        for platform in ("telegram", "discord"):
            await _call(core, fake_llm, {"action": "list"}, user=person, platform=platform)
        await link(pool, person, person)
    await _call(core, fake_llm, {"action": "create", "title": "A's secret", "due_at": "2026-11-23T10:00"}, user="1")
    env = await _call(core, fake_llm, {"action": "list"}, user="1", platform="discord")  # the same person elsewhere
    assert [t["title"] for t in env["result"]["tasks"]] == ["A's secret"]  # type: ignore[index]
    for platform in ("telegram", "discord"):
        for args in ({"action": "get", "id": 1}, {"action": "complete", "id": 1}, {"action": "delete", "id": 1}):
            env = await _call(core, fake_llm, args, user="2", platform=platform)
            assert env["ok"] is False and env["error"]["message"].startswith("task #1 not found"), args  # type: ignore[index]
        env = await _call(core, fake_llm, {"action": "list"}, user="2", platform=platform)
        assert env["result"]["tasks"] == []  # type: ignore[index]
    env = await _call(core, fake_llm, {"action": "complete", "id": 1}, user="1", platform="discord")
    assert env["ok"] is True


async def test_user_id_from_the_model_is_ignored(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    await _call(core, fake_llm, {"action": "create", "title": "mine"}, user="1")
    env = await _call(core, fake_llm, {"action": "list", "user_id": 1, "owner": "1"}, user="2")
    assert env["result"]["tasks"] == []  # type: ignore[index]


async def test_set_timezone_validated_and_used(make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool) -> None:
    core = make_core()
    env = await _call(core, fake_llm, {"timezone": "Mars/Olympus"}, tool="set_timezone")
    assert env["ok"] is False and "not an IANA time zone" in env["error"]["message"]  # type: ignore[index]
    env = await _call(core, fake_llm, {"timezone": "America/New_York"}, tool="set_timezone")
    assert env["result"]["summary"] == "time zone America/New_York, now Sat 21 Nov 05:00 EST"  # type: ignore[index]
    assert await pool.fetchval("SELECT timezone FROM accounts") == "America/New_York"
    await _call(core, fake_llm, {"action": "create", "title": "x", "due_at": "2026-11-21T09:00"})
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 11, 21, 14, 0, tzinfo=UTC)
    assert "(America/New_York, UTC-05:00)" in fake_llm.requests[-1]["messages"][0]["content"]


async def test_recurrence_next_occurrences_dst(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    clock.now = datetime(2026, 3, 27, 12, 0, tzinfo=UTC)  # Friday before the spring change in Berlin
    core = make_core(DEFAULT_TIMEZONE="Europe/Berlin")
    env = await _call(
        core,
        fake_llm,
        {
            "action": "create",
            "title": "Stretch",
            "recurrence": {"kind": "cron", "time": "09:00"},
        },
    )
    result = env["result"]
    assert result["next_occurrences"] == [  # type: ignore[index]
        "Sat 28 Mar 09:00 CET",
        "Sun 29 Mar 09:00 CEST",
        "Mon 30 Mar 09:00 CEST",
    ]
    assert result["task"]["repeats"] == "every day at 09:00"  # type: ignore[index]
    assert await pool.fetchval("SELECT due_at FROM tasks") == datetime(2026, 3, 28, 8, 0, tzinfo=UTC)


async def test_invalid_recurrence_is_explained(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    env = await _call(
        core,
        fake_llm,
        {
            "action": "create",
            "title": "x",
            "recurrence": {"kind": "cron", "time": "25:00", "days_of_week": "funday"},
        },
    )
    assert env["error"]["code"] == "invalid_args"  # type: ignore[index]
    assert "HH:MM" in env["error"]["message"] and "mon..sun" in env["error"]["message"]  # type: ignore[index]
