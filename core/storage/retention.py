"""Retention: rows that would otherwise pile up for ever are deleted after their time, in small batches.

Reminder occurrences that ended (delivered, failed, skipped) and dead letters (updates that could not be stored)
go after RETENTION_DAYS, refusal notices after a day, what an adapter kept for a while (platform_state) after its
time. Two more tables forget on their own: `processes`
(core/storage/fleet.py, each beat) and handled `inbox` rows (core/storage/inbox.forget_done, the inbox's renewal
loop). Conversations, tasks and memory are the user's and are never pruned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.constants import REFUSAL_KEEP, RETENTION_BATCH, RETENTION_EVERY_S, RETENTION_ROUNDS
from core.storage.db import Pool, affected, is_dropped
from core.timeutil import Clock

log = logging.getLogger(__name__)

# Ended occurrences older than $1, except the one that is still its open task's due time: the engine reads that
# row to know the time was handled (a one-shot reminder nobody marked done), so it stays as long as the task.
# A 'claimed' occurrence is still being delivered or retried and is never deleted. One batch reads the next $2 ended
# occurrences in (scheduled_at, task_id) order after the key ($3, $4) the previous batch ended at (sql/037's index)
# and deletes those not kept: a batch reads at most $2 rows however many kept ones lie before the rest (reading
# from the oldest each time reread them all, and every kept row of a year of one-shot reminders stays).
_OCCURRENCES_SQL = """
WITH batch AS (
    SELECT o.task_id, o.scheduled_at FROM occurrences o
    WHERE o.status <> 'claimed' AND o.scheduled_at < $1 AND (o.scheduled_at, o.task_id) > ($3::timestamptz, $4::bigint)
    ORDER BY o.scheduled_at, o.task_id
    LIMIT $2
), gone AS (
    DELETE FROM occurrences x USING batch b
    WHERE x.task_id = b.task_id AND x.scheduled_at = b.scheduled_at AND x.status <> 'claimed'
      AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = x.task_id AND t.due_at = x.scheduled_at
                      AND t.status IN ('pending', 'in_progress'))
    RETURNING 1
), last AS (SELECT scheduled_at, task_id FROM batch ORDER BY scheduled_at DESC, task_id DESC LIMIT 1)
SELECT (SELECT count(*) FROM batch) AS seen, (SELECT count(*) FROM gone) AS deleted,
       (SELECT scheduled_at FROM last) AS last_at, (SELECT task_id FROM last) AS last_task
"""
_START = (datetime.min.replace(tzinfo=UTC), 0)  # before every occurrence's key

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

# What adapters kept for a while (sql/039: a message's buttons), once its time is up.
_PLATFORM_STATE_SQL = """
DELETE FROM platform_state WHERE expires_at < $1 AND ctid = ANY(ARRAY(
    SELECT ctid FROM platform_state WHERE expires_at < $1 LIMIT $2))
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
    platform_state: int = 0


@dataclass
class PruneCursor:
    """Where the pass over ended occurrences stands: the key the last batch ended at (a process keeps one across its
    prunes, so each prune goes on from there; at the pass's end it starts over)."""

    after: tuple[datetime, int] = _START


async def _prune_occurrences(pool: Pool, cutoff: datetime, batch: int, rounds: int, cursor: PruneCursor) -> int:
    """Up to `rounds` batches of the pass over ended occurrences older than `cutoff`; the rows deleted."""
    total = 0
    for _ in range(rounds):
        row = await pool.fetchrow(_OCCURRENCES_SQL, cutoff, batch, *cursor.after)
        assert row is not None
        total += row["deleted"]
        if row["seen"] < batch:
            cursor.after = _START
            break
        cursor.after = (row["last_at"], row["last_task"])
    return total


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
    cursor: PruneCursor | None = None,
) -> Pruned:
    """Delete ended occurrences scheduled before `now - keep_occurrences` (and parked MCP calls that expired then, and
    dead letters kept since then), refusal notices older than `now - keep_notices` and adapters' values expired by
    `now`, at most `batch` rows per
    statement and `rounds` statements per table (`cursor`: where the last prune's pass over occurrences stopped; none:
    from the oldest)."""
    cutoff = now - keep_occurrences
    occurrences = await _prune_occurrences(pool, cutoff, batch, rounds, cursor or PruneCursor())
    notices = await _delete_in_batches(pool, _NOTICES_SQL, now - keep_notices, batch, rounds)
    confirmations = await _delete_in_batches(pool, _CONFIRMATIONS_SQL, cutoff, batch, rounds)
    dead = await _delete_in_batches(pool, _DEAD_LETTERS_SQL, cutoff, batch, rounds)
    kept = await _delete_in_batches(pool, _PLATFORM_STATE_SQL, now, batch, rounds)
    return Pruned(occurrences, notices, confirmations, dead, kept)


async def _prune_once(pool: Pool, clock: Clock, keep_occurrences: timedelta, cursor: PruneCursor) -> None:
    """One prune; a database that is away costs a warning (the next prune catches up), never the process."""
    try:
        pruned = await prune(pool, clock(), keep_occurrences, cursor=cursor)
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
    cursor = PruneCursor()
    while True:
        try:
            await _prune_once(pool, clock, keep_occurrences, cursor)
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
