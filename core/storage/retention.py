"""Retention: rows that would otherwise pile up for ever are deleted after their time, in small batches.

Reminder occurrences that ended (delivered, failed, skipped) and dead letters (updates that could not be stored)
go after RETENTION_DAYS, refusal notices after a day. Two more tables forget on their own: `processes`
(core/storage/fleet.py, each beat) and handled `inbox` rows (core/storage/inbox.forget_done, the inbox's renewal
loop). Conversations, tasks and memory are the user's and are never pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from core.constants import REFUSAL_KEEP, RETENTION_BATCH, RETENTION_EVERY_S, RETENTION_ROUNDS
from core.storage.db import Pool, affected, is_dropped
from core.timeutil import Clock

log = logging.getLogger(__name__)

# Ended occurrences older than $1, except the one that is still its open task's due time: the engine reads that
# row to know the time was handled (a one-shot reminder nobody marked done), so it stays as long as the task.
# A 'claimed' occurrence is still being delivered or retried and is never deleted.
_OCCURRENCES_SQL = """
DELETE FROM occurrences WHERE status <> 'claimed' AND ctid = ANY(ARRAY(
    SELECT o.ctid FROM occurrences o
    WHERE o.status <> 'claimed' AND o.scheduled_at < $1
      AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = o.task_id AND t.due_at = o.scheduled_at
                      AND t.status IN ('pending', 'in_progress'))
    LIMIT $2))
"""

# A chat's last refusal notice only matters for REFUSAL_EVERY_S (an hour); an older one is as good as none.
_NOTICES_SQL = """
DELETE FROM refusal_notices WHERE told_at < $1 AND ctid = ANY(ARRAY(
    SELECT ctid FROM refusal_notices WHERE told_at < $1 LIMIT $2))
"""

# Parked MCP calls (sql/034) that expired or were answered, older than the kept history of reminders.
_CONFIRMATIONS_SQL = """
DELETE FROM mcp_confirmations WHERE expires_at < $1 AND ctid = ANY(ARRAY(
    SELECT ctid FROM mcp_confirmations WHERE expires_at < $1 LIMIT $2))
"""

# Updates quarantined as dead letters (sql/035), kept as long as the history of reminders.
_DEAD_LETTERS_SQL = """
DELETE FROM dead_letters WHERE created_at < $1 AND ctid = ANY(ARRAY(
    SELECT ctid FROM dead_letters WHERE created_at < $1 LIMIT $2))
"""


@dataclass(frozen=True)
class Pruned:
    """How many rows one prune deleted, per table."""

    occurrences: int = 0
    refusal_notices: int = 0
    confirmations: int = 0
    dead_letters: int = 0


async def _delete_in_batches(pool: Pool, sql: str, cutoff: datetime, batch: int, rounds: int) -> int:
    """Run a batched DELETE until a batch comes back short or `rounds` ran; the rows deleted."""
    total = 0
    for _ in range(rounds):
        status = await pool.execute(sql, cutoff, batch)
        deleted = affected(status)
        total += deleted
        if deleted < batch:
            break
    return total


async def prune(
    pool: Pool,
    now: datetime,
    keep_occurrences: timedelta,
    *,
    keep_notices: timedelta = REFUSAL_KEEP,
    batch: int = RETENTION_BATCH,
    rounds: int = RETENTION_ROUNDS,
) -> Pruned:
    """Delete ended occurrences scheduled before `now - keep_occurrences` (and parked MCP calls that expired then, and
    dead letters kept since then), and refusal notices older than `now - keep_notices`, at most `batch` rows per
    statement and `rounds` statements per table."""
    occurrences = await _delete_in_batches(pool, _OCCURRENCES_SQL, now - keep_occurrences, batch, rounds)
    notices = await _delete_in_batches(pool, _NOTICES_SQL, now - keep_notices, batch, rounds)
    confirmations = await _delete_in_batches(pool, _CONFIRMATIONS_SQL, now - keep_occurrences, batch, rounds)
    dead = await _delete_in_batches(pool, _DEAD_LETTERS_SQL, now - keep_occurrences, batch, rounds)
    return Pruned(occurrences, notices, confirmations, dead)


async def _prune_once(pool: Pool, clock: Clock, keep_occurrences: timedelta) -> None:
    """One prune; a database that is away costs a warning (the next prune catches up), never the process."""
    try:
        pruned = await prune(pool, clock(), keep_occurrences)
    except Exception as e:
        if not is_dropped(e) and not isinstance(e, TimeoutError):
            raise
        log.warning("pruning old rows could not reach the database (%s); it tries again later", type(e).__name__)
        return
    if pruned.occurrences or pruned.refusal_notices:
        log.info(
            "pruned %d ended reminder occurrences and %d refusal notices", pruned.occurrences, pruned.refusal_notices
        )


async def _prune_forever(pool: Pool, clock: Clock, keep_occurrences: timedelta, every_s: float) -> None:
    """Prune now and then every `every_s` seconds until cancelled (an unexpected failure is logged)."""
    while True:
        try:
            await _prune_once(pool, clock, keep_occurrences)
        except Exception:
            log.exception("pruning old rows failed")
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def pruning(
    pool: Pool, clock: Clock, keep_occurrences: timedelta, *, every_s: float = RETENTION_EVERY_S
) -> AsyncIterator[None]:
    """While the block runs, this process prunes old rows in the background: at once, then every `every_s`."""
    task = asyncio.create_task(_prune_forever(pool, clock, keep_occurrences, every_s), name="retention")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
