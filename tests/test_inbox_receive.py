"""Store-and-claim in one statement (sql/019): the receiving process takes an update at once, parsed as received,
and two processes receiving one chat's updates at the same moment never run two of them side by side."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from core.inbox import Delivery, Inbox
from core.metrics import Metrics
from core.storage import inbox_table as store
from core.storage.db import Pool
from tests.helpers import WAIT_S, until


@pytest.fixture
async def inboxes(pool: Pool, pool_b: Pool) -> AsyncIterator[tuple[Inbox, Inbox]]:
    """Two processes' inboxes on one database (no NOTIFY-driven polling to speak of: poll every 30 s)."""
    a, b = Inbox(pool, "a", Metrics(), poll_s=30.0), Inbox(pool_b, "b", Metrics(), poll_s=30.0)
    try:
        yield a, b
    finally:
        await a.stop(0)
        await b.stop(0)


def recorder(got: list[Delivery]) -> Callable[[Delivery], Awaitable[None]]:
    """A handler that only records the deliveries it gets."""

    async def handle(delivery: Delivery) -> None:
        got.append(delivery)

    return handle


def never_parsed(payload: dict[str, Any]) -> Any:
    """The parse function of a receiver that took every update itself: it must never run."""
    raise AssertionError(f"parsed again: {payload}")


async def test_the_receiver_takes_the_update_itself_with_the_object_it_parsed(
    inboxes: tuple[Inbox, Inbox], pool: Pool
) -> None:
    a, _ = inboxes
    got: list[Delivery] = []
    handle = recorder(got)
    a.serve("telegram", never_parsed, handle)
    parsed = object()
    assert await a.receive("telegram", 1, "telegram:7", {"n": 1}, parsed)
    await until(lambda: len(got) == 1, 2.0)  # long before the 30 s poll: no notification round trip
    assert got[0].update is parsed and got[0].attempt == 1 and not got[0].redelivered
    assert await until_done(pool, 1)
    assert not await a.receive("telegram", 1, "telegram:7", {"n": 1}, parsed)  # a redelivery: stored once
    await asyncio.sleep(0.05)
    assert len(got) == 1


HANDED_BACK_SQL = (
    "SELECT owner, done_at, handed_back, lease_until IS NOT NULL AS leased FROM inbox WHERE update_id = $1"
)


async def until_done(pool: Pool, update_id: int) -> bool:
    """Whether the update is marked done within a few seconds."""
    for _ in range(200):
        if await pool.fetchval("SELECT done_at IS NOT NULL FROM inbox WHERE update_id = $1", update_id):
            return True
        await asyncio.sleep(0.01)
    return False


def idle_after(handled: list[int], running: set[int], count: int) -> bool:
    """Whether `count` updates were handled and none runs now."""
    return len(handled) == count and not running


async def test_two_processes_receiving_one_chat_at_once_never_run_two_of_its_updates_together(
    inboxes: tuple[Inbox, Inbox], pool: Pool
) -> None:
    running: set[int] = set()
    overlaps: list[tuple[int, ...]] = []
    handled: list[int] = []

    async def handle(delivery: Delivery) -> None:
        running.add(delivery.update_id)
        if len(running) > 1:
            overlaps.append(tuple(sorted(running)))
        await asyncio.sleep(0.005)
        handled.append(delivery.update_id)
        running.discard(delivery.update_id)

    a, b = inboxes
    a.serve("telegram", dict, handle)
    b.serve("telegram", dict, handle)
    for n in range(0, 160, 2):  # pairs of updates of an idle chat arriving at both processes at the same moment
        await asyncio.gather(
            a.receive("telegram", n + 1, "telegram:7", {}, {}), b.receive("telegram", n + 2, "telegram:7", {}, {})
        )
        for inbox in (a, b):  # the one a process could not take on arrival waits for a claim: wake the takers now
            inbox._wake.set()
        await until(functools.partial(idle_after, handled, running, n + 2), 10.0)
    assert overlaps == [] and sorted(handled) == list(range(1, 161))
    assert await pool.fetchval("SELECT count(*) FROM inbox WHERE done_at IS NULL") == 0


async def test_a_claim_whose_answer_was_lost_is_taken_up_when_the_update_comes_again(
    inboxes: tuple[Inbox, Inbox], pool: Pool
) -> None:
    # the connection dropped after the store-and-claim committed: the process holds the lease but never heard so,
    # and the platform (told nothing) sends the update again
    a, _ = inboxes
    got: list[Delivery] = []
    handle = recorder(got)
    a.serve("telegram", dict, handle)
    stored, item = await store.receive(pool, "telegram", 9, "telegram:7", {"n": 9}, "a", 30.0)
    assert stored and item is not None and a.held == 0
    assert not await a.receive("telegram", 9, "telegram:7", {"n": 9}, {"n": 9})  # stored before…
    await until(lambda: len(got) == 1, 2.0)  # …and handled here, once, instead of waiting for its lease forever
    assert await until_done(pool, 9)
    assert len(got) == 1


async def test_an_update_its_stopping_adapter_declines_is_handed_back_at_once(
    inboxes: tuple[Inbox, Inbox], pool: Pool
) -> None:
    a, _ = inboxes

    async def decline(delivery: Delivery) -> None:
        a.unserve("telegram")  # the adapter is stopping (it unserves first) and turns new work away
        raise asyncio.CancelledError

    a.serve("telegram", dict, decline)
    assert await a.receive("telegram", 3, "telegram:7", {}, {})
    await until(lambda: a.held == 0)
    # back in the inbox for any process, well before its lease runs out (this process's take loop may have had a
    # claim on its way that took it once more: that one, finding the adapter gone too, hands it back again)
    deadline = time.monotonic() + WAIT_S
    while (row := await pool.fetchrow(HANDED_BACK_SQL, 3)) is not None and row["owner"] is not None:
        assert time.monotonic() < deadline, "not handed back"
        await asyncio.sleep(0.01)
    assert row is not None and row["done_at"] is None and row["handed_back"] >= 1 and not row["leased"]


async def test_a_journaled_finish_leaves_its_connection_as_it_found_it(pool: Pool) -> None:
    async with pool.acquire() as con:
        await con.execute("SET synchronous_commit = remote_apply")  # the tests' server runs with it off
        _, item = await store.receive(con, "telegram", 11, "telegram:8", {"n": 11}, "a", 30.0)  # type: ignore[arg-type]
        assert item is not None
        assert await store.finish(con, item, journaled=True) is False  # type: ignore[arg-type]
        assert await con.fetchval("SHOW synchronous_commit") == "remote_apply"  # off for that transaction alone
        await con.execute("RESET synchronous_commit")
    assert await pool.fetchval("SELECT done_at IS NOT NULL FROM inbox WHERE update_id = 11")
