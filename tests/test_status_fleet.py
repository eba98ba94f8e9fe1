"""/status lists the fleet: every process on the database that beat in the last minute, with adapters and version."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from core.constants import FLEET_SEEN_S
from core.front_door import Core
from core.storage.db import Pool
from core.storage.fleet import SeenProcess, beat, beating, seen
from core.types import Error
from tests.conftest import MakeCore, MakeSettings
from tests.helpers import drop_blocked_statement, incoming

FAST_BEAT_S = 0.01  # tests that watch the heartbeat itself beat this often
WITHIN_S = 10.0  # what they wait for at most
FLEET_WINDOW = timedelta(seconds=FLEET_SEEN_S)


@pytest.fixture
def core_b(pool_b: Pool, make_settings: MakeSettings, make_llm: Callable[..., Any], tmp_path: Path) -> Core:
    """The second process's Core (its own pool), with the same admin as the first."""
    settings = make_settings(ADMINS="telegram:1")
    return Core(settings, pool_b, make_llm(settings), capabilities_dir=tmp_path / "capabilities_b")


async def status(core: Core) -> str:
    """The admin's /status through the core's front door."""
    answer = await core.command(incoming("/status", user="1"), "status")
    assert isinstance(answer, str) and not isinstance(answer, Error)
    return answer


def line_of(text: str, process_id: str) -> str:
    """The fleet line that lists `process_id` (exactly one)."""
    found = [line for line in text.splitlines() if line.startswith(f"  - `{process_id}`")]
    assert len(found) == 1, text
    return found[0]


async def seen_at(pool: Pool, process_id: str) -> datetime | None:
    """When the process last beat (None: no row)."""
    value: datetime | None = await pool.fetchval("SELECT seen_at FROM processes WHERE id = $1", process_id)
    return value


def adapters_of(procs: Sequence[SeenProcess], process_id: str) -> tuple[str, ...]:
    """The adapters a listed process reported in its last beat."""
    return next(p.adapters for p in procs if p.id == process_id)


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll an async check every few milliseconds until it holds; fail after WITHIN_S."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < WITHIN_S, "not seen in time"
        await asyncio.sleep(0.005)


async def test_two_beating_processes_each_list_both_with_their_adapters_and_versions(
    make_core: MakeCore, core_b: Core, pool: Pool, pool_b: Pool
) -> None:
    a = make_core(ADMINS="telegram:1")
    a.report_state("telegram", "@assistant_bot")
    core_b.report_state("discord", "assistant#0001 in 2 server(s), shards 1 of 2")
    async with beating(pool, a.status_board, "1.4.0") as me_a, beating(pool_b, core_b.status_board, "1.5.0") as me_b:
        assert me_a.id != me_b.id and me_a.id.split(":")[:2] == me_b.id.split(":")[:2]  # same host and pid here
        for core, me, other in ((a, me_a, me_b), (core_b, me_b, me_a)):
            text = await status(core)
            assert f"- this process: `{me.id}`\n- fleet: 2 processes seen in the last minute:" in text
            assert line_of(text, me.id).startswith(f"  - `{me.id}` (this one): ")
            assert "(this one)" not in line_of(text, other.id)
        text = await status(a)
        assert re.fullmatch(
            r".*: telegram \(@assistant_bot\) · version 1\.4\.0 · seen \d+ s ago",
            line_of(text, me_a.id),
        )
        assert re.fullmatch(
            r".*: discord \(assistant#0001 in 2 server\(s\), shards 1 of 2\) · version 1\.5\.0 · seen \d+ s ago",
            line_of(text, me_b.id),
        )


async def test_a_single_process_is_one_readable_line(make_core: MakeCore, pool: Pool) -> None:
    core = make_core(ADMINS="telegram:1")
    assert "this process" not in await status(core) and "fleet" not in await status(core)  # not beating: as before
    async with beating(pool, core.status_board, "1.4.0", process_id=core.process_id) as me:
        text = await status(core)
        assert text.endswith(f"\n- this process: `{me.id}`, the only one seen in the last minute")
        assert "fleet:" not in text
        assert me.id == core.process_id == core.inbox.owner  # the id /status shows is the one in its inbox leases


async def test_a_process_not_seen_for_a_minute_is_not_listed_and_one_gone_a_day_is_deleted(
    make_core: MakeCore, core_b: Core, pool: Pool, pool_b: Pool
) -> None:
    a = make_core(ADMINS="telegram:1")
    async with beating(pool, a.status_board, "1.4.0") as me_a, beating(pool_b, core_b.status_board, "1.4.0") as me_b:
        await pool.execute("UPDATE processes SET seen_at = now() - interval '61 seconds' WHERE id = $1", me_b.id)
        text = await status(a)
        assert text.endswith(f"\n- this process: `{me_a.id}`, the only one seen in the last minute")
        assert me_b.id not in text
        text = await status(core_b)  # B itself still says who it is, but it is not among those seen
        assert f"- this process: `{me_b.id}`\n- fleet: 1 process seen in the last minute:" in text
        assert "(this one)" not in line_of(text, me_a.id)
        # a row older than a day goes with the next beat of any process; the beating process's own row never does
        await pool.execute("UPDATE processes SET seen_at = now() - interval '25 hours'")
        await beat(pool, me_a)
        assert await seen_at(pool, me_b.id) is None
        assert [p.id for p in await seen(pool, FLEET_WINDOW)] == [me_a.id]


async def test_a_clean_stop_leaves_the_fleet(make_core: MakeCore, core_b: Core, pool: Pool, pool_b: Pool) -> None:
    a = make_core(ADMINS="telegram:1")
    async with beating(pool, a.status_board, "1.4.0") as me_a:
        async with beating(pool_b, core_b.status_board, "1.4.0") as me_b:
            assert "2 processes seen" in await status(a)
        assert await seen_at(pool, me_b.id) is None
        assert core_b.status_board.process_id is None
        assert (await status(a)).endswith(f"\n- this process: `{me_a.id}`, the only one seen in the last minute")
    assert await pool.fetchval("SELECT count(*) FROM processes") == 0


async def test_the_heartbeat_carries_adapters_reported_after_the_start(make_core: MakeCore, pool: Pool) -> None:
    core = make_core(ADMINS="telegram:1")
    async with beating(pool, core.status_board, "1.4.0", every_s=FAST_BEAT_S) as me:
        assert adapters_of(await seen(pool, FLEET_WINDOW), me.id) == ()
        core.report_state("telegram", "@assistant_bot")

        async def reported() -> bool:
            return adapters_of(await seen(pool, FLEET_WINDOW), me.id) == ("telegram (@assistant_bot)",)

        await until(reported)


async def test_the_heartbeat_survives_a_dropped_connection_and_beats_again(
    make_core: MakeCore, pool: Pool, db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    core = make_core(ADMINS="telegram:1")
    async with beating(pool, core.status_board, "1.4.0", every_s=FAST_BEAT_S) as me:
        holder = await asyncpg.connect(db_dsn)
        try:
            await holder.execute("BEGIN; LOCK TABLE processes IN ACCESS EXCLUSIVE MODE")
            before = await holder.fetchval("SELECT now()")
            await drop_blocked_statement(db_dsn, holder)  # the next beat waits for the lock; its connection dies
        finally:
            await holder.close()

        async def beat_again() -> bool:
            last = await seen_at(pool, me.id)
            return last is not None and last > before

        await until(beat_again)
        assert "the fleet heartbeat lost its database connection" in caplog.text
        assert me.id in await status(core)
