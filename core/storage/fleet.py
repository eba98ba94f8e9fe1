"""The bot's processes on one database: each one beats (upserts its row) so /status can list the whole fleet."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from core.constants import FLEET_ADAPTER_CHARS, FLEET_ALIVE_S, FLEET_BEAT_S, FLEET_FORGET, FLEET_HOST_CHARS
from core.quoting import truncate
from core.storage.db import Pool, is_dropped, retry_dropped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessInfo:
    """What a process says about itself in each beat."""

    id: str  # host:pid:random, made once per process
    host: str
    pid: int
    version: str
    adapters: tuple[str, ...] = ()  # "name (state)" per running adapter


@dataclass(frozen=True)
class SeenProcess:
    """A process of the fleet as /status lists it."""

    id: str
    host: str
    pid: int
    version: str
    adapters: tuple[str, ...]
    started_at: datetime
    seen_s_ago: float  # by the database's clock


class Board(Protocol):
    """Where a beating process reads its adapters and shows its id (core.commands.StatusBoard)."""

    adapters: dict[str, str]
    process_id: str | None


def adapter_list(adapters: Mapping[str, str]) -> tuple[str, ...]:
    """`name (state)` per adapter, sorted, each cut to one short line."""
    return tuple(
        truncate(f"{name} ({state})", FLEET_ADAPTER_CHARS, one_line=True) for name, state in sorted(adapters.items())
    )


def _host() -> str:
    """This machine's name, cut to one short line."""
    return truncate(socket.gethostname() or "unknown", FLEET_HOST_CHARS, one_line=True)


def new_process_id() -> str:
    """A new id for this process (in /status and in the inbox leases it holds): host, pid and a random part
    (pids repeat across restarts and containers)."""
    return f"{_host()}:{os.getpid()}:{secrets.token_hex(3)}"


def this_process(version: str, adapters: Mapping[str, str] | None = None, process_id: str | None = None) -> ProcessInfo:
    """What this process says about itself, under `process_id` (a new one when not given)."""
    return ProcessInfo(process_id or new_process_id(), _host(), os.getpid(), version, adapter_list(adapters or {}))


async def beat(pool: Pool, me: ProcessInfo) -> None:
    """Record that `me` is alive now (and its adapters and version); forget processes not seen for a day."""
    await pool.execute(
        "WITH forgotten AS (DELETE FROM processes WHERE seen_at < now() - $6::interval AND id <> $1)"
        " INSERT INTO processes (id, host, pid, version, adapters) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (id) DO UPDATE SET version = excluded.version, adapters = excluded.adapters, seen_at = now()",
        me.id,
        me.host,
        me.pid,
        me.version,
        list(me.adapters),
        FLEET_FORGET,
    )


async def leave(pool: Pool, process_id: str) -> None:
    """Remove a process from the fleet (its clean stop)."""
    await pool.execute("DELETE FROM processes WHERE id = $1", process_id)


async def seen(pool: Pool, within: timedelta) -> list[SeenProcess]:
    """The processes that beat within `within`, by host, then oldest first."""
    rows = await pool.fetch(
        "SELECT id, host, pid, version, adapters, started_at,"
        " greatest(extract(epoch FROM now() - seen_at), 0)::float8 AS ago"
        " FROM processes WHERE seen_at >= now() - $1::interval ORDER BY host, started_at, id",
        within,
    )
    return [
        SeenProcess(r["id"], r["host"], r["pid"], r["version"], tuple(r["adapters"]), r["started_at"], r["ago"])
        for r in rows
    ]


async def peers(pool: Pool, adapter: str, me: str, within: timedelta = timedelta(seconds=FLEET_ALIVE_S)) -> int:
    """How many processes but `me` beat within `within` with `adapter` running (an entry `adapter (…)`)."""
    count = await pool.fetchval(
        "SELECT count(*) FROM processes WHERE seen_at >= now() - $3::interval AND id <> $2"
        " AND EXISTS (SELECT 1 FROM unnest(adapters) AS a WHERE starts_with(a, $1))",
        f"{adapter} (",
        me,
        within,
    )
    return int(count)


async def _beat_once(pool: Pool, board: Board, me: ProcessInfo) -> None:
    """One beat with the board's current adapters; a database that is away costs a warning, never the process."""
    current = replace(me, adapters=adapter_list(board.adapters))
    try:
        await retry_dropped(lambda: beat(pool, current), "the fleet heartbeat", pool=pool)
    except Exception as e:
        if not is_dropped(e) and not isinstance(e, TimeoutError):
            raise
        log.warning("the fleet heartbeat could not reach the database (%s); it beats again later", type(e).__name__)


async def _beat_forever(pool: Pool, board: Board, me: ProcessInfo, every_s: float) -> None:
    """Beat every `every_s` seconds until cancelled (an unexpected failure is logged and the next beat tried)."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await _beat_once(pool, board, me)
        except Exception:
            log.exception("the fleet heartbeat failed")


@contextlib.asynccontextmanager
async def beating(
    pool: Pool, board: Board, version: str, *, process_id: str | None = None, every_s: float = FLEET_BEAT_S
) -> AsyncIterator[ProcessInfo]:
    """While the block runs, this process is in the fleet under `process_id`: it beats at once and every `every_s`
    seconds (with the board's adapters) and shows its id on the board; on exit it leaves (its row is deleted)."""
    me = this_process(version, board.adapters, process_id)
    board.process_id = me.id
    await _beat_once(pool, board, me)
    task = asyncio.create_task(_beat_forever(pool, board, me, every_s), name="fleet heartbeat")
    try:
        yield me
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        board.process_id = None
        try:
            await retry_dropped(lambda: leave(pool, me.id), "leaving the fleet", pool=pool)
        except Exception as e:  # the row drops out of /status within FLEET_SEEN_S anyway
            log.warning("could not remove this process from the fleet table (%s)", type(e).__name__)
