"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import asyncpg

from core.front_door import Core
from core.types import Assistant, Error, Event, Incoming
from tests.conftest import connect_server

WAIT_S = 10.0  # a wait of a test for something the code under test does (room for a machine whose cores are busy)


def incoming(
    text: str,
    *,
    user: str = "100",
    chat: str | None = None,
    platform: str = "telegram",
    message_id: str | None = None,
    kind: str = "private",
    name: str = "Ann",
) -> Incoming:
    """An Incoming as a platform adapter would build it."""
    return Incoming(
        platform=platform,
        user_id=user,
        chat_id=chat or user,
        text=text,
        user_name=name,
        chat_kind="group" if kind == "group" else "private",
        message_id=message_id,
    )


async def run(core: Core, inc: Incoming, *, stream: bool = False) -> list[Event]:
    """All events of one handled message."""
    async with aclosing(core.handle(inc, stream=stream)) as events:
        return [e async for e in events]


def final(events: list[Event]) -> Assistant | Error:
    """The last event, which ends every answered turn."""
    assert events, "no events"
    last = events[-1]
    assert isinstance(last, Assistant | Error), last
    return last


def answer(events: list[Event]) -> Assistant:
    """The final Assistant event (fails on an Error)."""
    last = final(events)
    assert isinstance(last, Assistant), last
    return last


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoded envelopes of the tool messages in an LLM request."""
    return [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def tool_names(request: dict[str, Any]) -> list[str]:
    """The names of the tools offered in an LLM request."""
    return [t["function"]["name"] for t in request.get("tools", [])]


async def drop_blocked_statement(dsn: str, holder: asyncpg.Connection) -> None:
    """Wait until a pooled backend waits for `holder`'s lock, then terminate every backend but the holder's."""
    conn = await connect_server(dsn)
    try:
        try:
            await conn.execute(
                "DO $$ BEGIN WHILE NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock')"
                " LOOP PERFORM pg_sleep(0.002); PERFORM pg_stat_clear_snapshot(); END LOOP; END $$",
                timeout=WAIT_S,
            )
        except TimeoutError:
            raise AssertionError(f"no statement waited for the holder's lock within {WAIT_S:g} s") from None
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid NOT IN (pg_backend_pid(), $1)",
            holder.get_server_pid(),
        )
    finally:
        await conn.close()
    await holder.execute("ROLLBACK")


async def until(predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Wait in tiny steps until `predicate()` holds (fails after `timeout` s: room for a busy machine)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s")
        await asyncio.sleep(0.01)


async def die(core: Core) -> None:
    """The core's process dies (as with kill -9, in this test process): its inbox's handlers stop where they are, its
    leases are neither renewed nor handed back, and it sends nothing more."""
    inbox = core.inbox
    dead = [lease.task for lease in inbox._leases.values()] + inbox._tasks
    for task in dead:
        task.cancel()
    await asyncio.wait(dead)
    inbox._leases.clear()
    inbox._tasks = []
