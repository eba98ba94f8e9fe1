"""The turn journal: the one writer of a turn's conversation rows, which stops once its update was taken over."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from core.inbox import Delivery
from core.storage.db import Pool
from core.turn import journal
from core.types import Assistant, Error, ModelToolCalls, Step, ToolResult
from tests.helpers import incoming

DUE_BEFORE = datetime(2100, 1, 1, tzinfo=UTC)
CALLS = ({"id": "c1", "type": "function", "function": {"name": "manage_tasks", "arguments": "{}"}},)


async def open_turn(pool: Pool, delivery: Delivery | None) -> journal.TurnJournal:
    """A stored message with its running turn, and the journal that writes it."""
    start = await journal.begin(
        pool,
        incoming("hello", message_id="5"),
        delivery,
        default_tz="UTC",
        history=40,
        due_before=DUE_BEFORE,
        due_limit=10,
        authors=False,
        memory=False,
    )
    assert start.turn_id is not None
    return journal.TurnJournal(pool, start.chat, start.turn_id, delivery)


async def roles(pool: Pool) -> list[str]:
    """The stored messages' roles, in order."""
    return [r["role"] for r in await pool.fetch("SELECT role FROM messages ORDER BY id")]


async def test_the_journal_stores_each_step_and_the_answer_in_order(pool: Pool) -> None:
    writes = await open_turn(pool, None)
    step = Step("manage_tasks", {}, True, "ok", 0.01)
    await writes.record(ModelToolCalls(None, CALLS))
    await writes.record(ToolResult("c1", step, {"ok": True, "result": "ok"}))
    await writes.record(Assistant("Done.", writes.turn_id, (step,)))
    assert await roles(pool) == ["user", "assistant", "tool", "assistant"]
    row = await pool.fetchrow("SELECT status, steps FROM turns")
    assert row is not None and (row["status"], row["steps"]) == ("done", 1)
    await writes.close_unfinished("failed")  # after the answer: nothing to close
    assert await pool.fetchval("SELECT status FROM turns") == "done"


async def test_a_turn_whose_update_was_taken_over_writes_nothing_more(pool: Pool) -> None:
    # this process stalled past its lease: another one took the update over and runs the turn again
    delivery = Delivery("telegram", 1, 1, None)
    writes = await open_turn(pool, delivery)
    await writes.record(ModelToolCalls(None, CALLS))
    delivery.lost = True
    step = Step("manage_tasks", {}, True, "ok", 0.01)
    for event in (ToolResult("c1", step, {"ok": True}), Assistant("A stray second answer", writes.turn_id)):
        with pytest.raises(asyncio.CancelledError):
            await writes.record(event)
    with pytest.raises(asyncio.CancelledError):
        await writes.record(Error("llm_unavailable", "down", writes.turn_id))
    await writes.close_unfinished("cut_short")  # left to the new owner: not closed here either
    assert await roles(pool) == ["user", "assistant"]
    assert await pool.fetchval("SELECT status FROM turns") == "running"


async def test_an_error_answer_closes_the_turn_as_failed_with_its_text(pool: Pool) -> None:
    writes = await open_turn(pool, Delivery("telegram", 1, 1, None))
    await writes.record(Error("llm_unavailable", "The model is away.", writes.turn_id))
    row = await pool.fetchrow("SELECT status, error_code, error_message FROM turns")
    assert row is not None and tuple(row) == ("failed", "llm_unavailable", "The model is away.")


async def test_a_stored_updates_start_commits_without_the_disk_and_leaves_its_connection_as_it_was(
    pool: Pool,
) -> None:
    async with pool.acquire() as con:
        await con.execute("SET synchronous_commit = remote_apply")  # the tests' server runs with it off
        delivery = Delivery("telegram", 1, attempt=1, update=None)
        start = await journal.begin(
            con,  # type: ignore[arg-type]
            incoming("hello", message_id="6"),
            delivery,
            default_tz="UTC",
            history=40,
            due_before=DUE_BEFORE,
            due_limit=10,
            authors=False,
            memory=False,
        )
        assert start.turn_id is not None
        assert await con.fetchval("SHOW synchronous_commit") == "remote_apply"  # off for that transaction alone
        await con.execute("RESET synchronous_commit")
    assert await roles(pool) == ["user"]
