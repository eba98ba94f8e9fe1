"""Retention: ended reminder occurrences and refusal notices are pruned after their time; nothing else is."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from core.reminders.engine import ReminderEngine
from core.storage.db import Pool
from core.storage.platform_state import PlatformState
from core.storage.retention import PruneCursor, Pruned, prune, pruning

NOW = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
KEEP = timedelta(days=90)


async def a_task(pool: Pool, *, status: str = "pending", due_at: datetime | None = None, user: str = "1") -> int:
    """A task (of a user with a private chat) and its id."""
    user_id = await pool.fetchval(
        "INSERT INTO users (platform, platform_user_id) VALUES ('telegram', $1)"
        " ON CONFLICT (platform, platform_user_id) DO UPDATE SET display_name = '' RETURNING id",
        user,
    )
    chat_id = await pool.fetchval(
        "INSERT INTO chats (platform, platform_chat_id) VALUES ('telegram', $1)"
        " ON CONFLICT (platform, platform_chat_id, thread_id) DO UPDATE SET title = '' RETURNING id",
        user,
    )
    task_id: int = await pool.fetchval(
        "INSERT INTO tasks (user_id, chat_id, title, status, due_at) VALUES ($1, $2, 'water the plants', $3, $4)"
        " RETURNING id",
        user_id,
        chat_id,
        status,
        due_at or NOW + timedelta(days=1),
    )
    return task_id


async def an_occurrence(pool: Pool, task_id: int, days_ago: float, status: str) -> datetime:
    """An occurrence of the task scheduled `days_ago` before NOW, in `status`; its scheduled time."""
    at = NOW - timedelta(days=days_ago)
    await pool.execute(
        "INSERT INTO occurrences (task_id, scheduled_at, status, lease_until) VALUES ($1, $2, $3, $4)",
        task_id,
        at,
        status,
        at + timedelta(minutes=2) if status == "claimed" else None,
    )
    return at


async def occurrences(pool: Pool) -> set[tuple[int, datetime, str]]:
    """Every occurrence as (task, scheduled time, status)."""
    rows = await pool.fetch("SELECT task_id, scheduled_at, status FROM occurrences")
    return {(r["task_id"], r["scheduled_at"], r["status"]) for r in rows}


async def notices(pool: Pool) -> set[str]:
    """The chats with a stored refusal notice."""
    return {r["chat_key"] for r in await pool.fetch("SELECT chat_key FROM refusal_notices")}


async def test_ended_occurrences_older_than_the_retention_are_pruned_newer_and_claimed_ones_stay(pool: Pool) -> None:
    daily = await a_task(pool)  # a recurring task: its due time has moved on past these occurrences
    for days_ago, status in ((120, "delivered"), (91, "failed"), (95, "skipped")):
        await an_occurrence(pool, daily, days_ago, status)
    stuck = await an_occurrence(pool, daily, 100, "claimed")  # still being delivered or retried: never pruned
    recent = await an_occurrence(pool, daily, 89, "delivered")
    edge = await an_occurrence(pool, daily, 90, "failed")  # exactly at the cut: kept
    assert await prune(pool, NOW, KEEP) == Pruned(occurrences=3)
    assert await occurrences(pool) == {(daily, stuck, "claimed"), (daily, recent, "delivered"), (daily, edge, "failed")}
    assert await prune(pool, NOW, KEEP) == Pruned()  # nothing left to prune


async def test_the_occurrence_of_an_open_tasks_due_time_stays_until_the_task_ends(pool: Pool) -> None:
    due = NOW - timedelta(days=200)
    once = await a_task(pool, due_at=due)  # a one-shot reminder, delivered, never marked done
    await an_occurrence(pool, once, 200, "delivered")
    assert await prune(pool, NOW, KEEP) == Pruned()
    # the row is what tells the engine that this time was handled: without it the sweep would record it as missed
    await ReminderEngine(pool, {}, lambda: NOW).skip_stale()
    assert await occurrences(pool) == {(once, due, "delivered")}
    await pool.execute("UPDATE tasks SET status = 'done' WHERE id = $1", once)
    assert await prune(pool, NOW, KEEP) == Pruned(occurrences=1)
    assert await occurrences(pool) == set()


async def test_refusal_notices_older_than_a_day_are_pruned(pool: Pool) -> None:
    for chat, ago in (("telegram:1", timedelta(days=2)), ("telegram:2", timedelta(hours=23)), ("discord:3", None)):
        told = NOW - ago if ago is not None else NOW - timedelta(minutes=5)
        await pool.execute("INSERT INTO refusal_notices (chat_key, told_at) VALUES ($1, $2)", chat, told)
    assert await prune(pool, NOW, KEEP) == Pruned(refusal_notices=1)
    assert await notices(pool) == {"telegram:2", "discord:3"}


async def test_a_prune_deletes_in_bounded_batches(pool: Pool) -> None:
    daily = await a_task(pool)
    for day in range(7):
        await an_occurrence(pool, daily, 100 + day, "delivered")
    assert await prune(pool, NOW, KEEP, batch=2, rounds=2) == Pruned(occurrences=4)  # the rest goes next time
    assert len(await occurrences(pool)) == 3
    assert await prune(pool, NOW, KEEP, batch=2, rounds=5) == Pruned(occurrences=3)
    assert await occurrences(pool) == set()


async def test_a_batch_reads_past_the_rows_it_keeps_and_the_pass_goes_on_where_it_stopped(pool: Pool) -> None:
    kept = []
    for days in range(300, 295, -1):  # five one-shot reminders delivered long ago, never marked done: kept
        task = await a_task(pool, due_at=NOW - timedelta(days=days))
        kept.append((task, await an_occurrence(pool, task, days, "delivered"), "delivered"))
    daily = await a_task(pool)
    for days in (120, 110, 100):  # after them: three that go
        await an_occurrence(pool, daily, days, "delivered")
    cursor = PruneCursor()
    # each batch reads two rows: the first two batches only find kept ones, and the next prune goes on from there
    assert await prune(pool, NOW, KEEP, batch=2, rounds=2, cursor=cursor) == Pruned()
    assert await prune(pool, NOW, KEEP, batch=2, rounds=2, cursor=cursor) == Pruned(occurrences=3)
    assert await occurrences(pool) == set(kept)
    assert await prune(pool, NOW, KEEP, batch=2, rounds=5, cursor=cursor) == Pruned()  # a new pass, from the oldest


async def test_pruning_runs_in_the_background_from_the_start(pool: Pool) -> None:
    daily = await a_task(pool)
    await an_occurrence(pool, daily, 120, "delivered")
    kept = await an_occurrence(pool, daily, 10, "delivered")
    async with pruning(pool, lambda: NOW, KEEP, every_s=3600):
        started = time.monotonic()
        while len(await occurrences(pool)) > 1:
            assert time.monotonic() - started < 5, "not pruned at start"
            await asyncio.sleep(0.005)
    assert await occurrences(pool) == {(daily, kept, "delivered")}


async def test_parked_mcp_calls_that_expired_long_ago_are_pruned(pool: Pool) -> None:
    task = await a_task(pool)
    row = await pool.fetchrow("SELECT u.id, u.account_id, t.chat_id FROM tasks t JOIN users u ON u.id = t.user_id"
                              " WHERE t.id = $1", task)  # fmt: skip
    assert row is not None
    for server, expired in (("old", NOW - KEEP - timedelta(days=1)), ("recent", NOW - timedelta(days=1))):
        await pool.execute(
            "INSERT INTO mcp_confirmations (account_id, identity_id, chat_id, server, tool, arguments, created_at,"
            " expires_at) VALUES ($1, $2, $3, $4, 'forget', '{}', $5, $5)",
            row["account_id"], row["id"], row["chat_id"], server, expired,
        )  # fmt: skip
    assert await prune(pool, NOW, KEEP) == Pruned(confirmations=1)
    assert [r["server"] for r in await pool.fetch("SELECT server FROM mcp_confirmations")] == ["recent"]


async def test_what_an_adapter_kept_for_a_while_goes_after_its_time_and_the_rest_stays(pool: Pool) -> None:
    kept = PlatformState(pool)
    await kept.put("buttons:old", "spent", keep=timedelta(microseconds=1))
    await kept.put("buttons:new", "fresh", keep=timedelta(days=90))
    await kept.put("sync", "s42")  # for good
    await pool.execute("UPDATE platform_state SET expires_at = now() - interval '1 second' WHERE key = 'buttons:old'")
    assert await kept.get("buttons:old") is None  # expired: as good as gone before retention runs
    assert await prune(pool, datetime.now(UTC), KEEP) == Pruned(platform_state=1)
    assert {r["key"] for r in await pool.fetch("SELECT key FROM platform_state")} == {"buttons:new", "sync"}
    assert await kept.get("buttons:new") == "fresh" and await kept.get("sync") == "s42"
    await kept.forget("buttons:new")
    assert await kept.get("buttons:new") is None
