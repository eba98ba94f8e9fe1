"""Every SQL statement of the reminders, each with the small function that runs it (no retries, no logging)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from asyncpg import Record

from core.constants import FLEET_ALIVE_S, REMINDER_ERROR_CHARS
from core.reminders import recurrence
from core.storage.db import Pool
from core.timeutil import zone

Key = tuple[int, datetime]  # an occurrence: (task id, scheduled time)
# task id, scheduled time, ran at, delivered at, platform message id, the series' next time
Delivered = tuple[int, datetime, datetime, datetime, str | None, datetime | None]

CLAIM_SQL = """
WITH claimed AS (
    INSERT INTO occurrences (task_id, scheduled_at, claimed_by, lease_until, late)
    SELECT t.id, t.due_at, $1, $2::timestamptz + $5::interval, $2::timestamptz - t.due_at > $4::interval
    FROM tasks t
    WHERE t.status IN ('pending', 'in_progress') AND t.due_at <= $2 AND t.due_at >= $2::timestamptz - $6::interval
      AND t.chat_id IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM occurrences o WHERE o.task_id = t.id AND o.scheduled_at = t.due_at
          AND (o.status <> 'claimed' OR o.lease_until > $2))
    ORDER BY t.due_at
    LIMIT $3
    ON CONFLICT (task_id, scheduled_at) DO UPDATE
        SET claimed_by = EXCLUDED.claimed_by, lease_until = EXCLUDED.lease_until,
            attempts = occurrences.attempts + 1, late = EXCLUDED.late
        WHERE occurrences.status = 'claimed' AND occurrences.lease_until <= $2
    RETURNING task_id, scheduled_at, late, attempts, sent_parts, sent_text
)
SELECT c.task_id, c.scheduled_at, c.late, c.attempts, t.title, t.details, t.kind, t.agent_prompt, t.own_words,
       t.recurrence, t.chat_id,
       t.timezone AS task_tz, u.platform_user_id, u.display_name, a.timezone AS user_tz,
       ch.platform, ch.platform_chat_id, ch.thread_id, ch.kind AS chat_kind,
       c.sent_parts, c.sent_text
FROM claimed c
JOIN tasks t ON t.id = c.task_id
JOIN accounts a ON a.id = t.user_id
JOIN chats ch ON ch.id = t.chat_id
-- who the reminder is for in that chat: the account's identity on the chat's platform, the one that made the task
-- first (a task moved to another platform's chat after a refusal is for the identity there)
JOIN LATERAL (
    SELECT x.platform_user_id, x.display_name FROM users x WHERE x.account_id = t.user_id
    ORDER BY x.platform = ch.platform DESC, x.id = t.created_by DESC, x.id LIMIT 1) u ON true
"""

STALE_SQL = """
SELECT t.id, t.due_at, t.recurrence, t.timezone AS task_tz, a.timezone AS user_tz
FROM tasks t JOIN accounts a ON a.id = t.user_id
WHERE t.status IN ('pending', 'in_progress') AND t.due_at < $1::timestamptz - $2::interval
  AND NOT EXISTS (SELECT 1 FROM occurrences o WHERE o.task_id = t.id AND o.scheduled_at = t.due_at)
LIMIT $3
"""
# Between full passes, only what left the grace window since ($4): an index range, not every task ever due (a one-shot
# reminder delivered but never marked done stays open, due in the past, for good).
STALE_SINCE_SQL = STALE_SQL.replace("LIMIT $3", "  AND t.due_at >= $4\nLIMIT $3")

_SKIPPED_SQL = """
INSERT INTO occurrences (task_id, scheduled_at, status, error) VALUES ($1, $2, 'skipped', $3) ON CONFLICT DO NOTHING
"""

_MOVE_SQL = "UPDATE tasks SET due_at = $2 WHERE id = $1 AND due_at = $3"

# Occurrences still waiting for a retry when their grace window has passed (no live process holds them).
_EXPIRED_SQL = """
SELECT o.task_id, o.scheduled_at, o.error, t.recurrence, t.timezone AS task_tz, a.timezone AS user_tz,
       t.due_at IS DISTINCT FROM o.scheduled_at OR t.status NOT IN ('pending', 'in_progress') AS superseded
FROM occurrences o JOIN tasks t ON t.id = o.task_id JOIN accounts a ON a.id = t.user_id
WHERE o.status = 'claimed' AND o.lease_until <= $1 AND o.scheduled_at < $1::timestamptz - $2::interval
LIMIT $3
"""

_DELIVERED_SQL = """
WITH d AS (
    SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::text[],
                         $6::timestamptz[]) AS d(task_id, scheduled_at, ran_at, delivered_at, message_id, next_due)
), o AS (
    UPDATE occurrences o SET status = 'delivered', ran_at = d.ran_at, delivered_at = d.delivered_at,
        platform_message_id = d.message_id, error = NULL, sent_text = NULL
    FROM d WHERE o.task_id = d.task_id AND o.scheduled_at = d.scheduled_at AND o.status = 'claimed'
)
UPDATE tasks t SET due_at = d.next_due, updated_at = now()
FROM d WHERE t.id = d.task_id AND t.due_at = d.scheduled_at AND d.next_due IS NOT NULL
"""

_ENDED_SQL = """
WITH o AS (
    UPDATE occurrences SET status = $3, error = $4, sent_text = NULL
    WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed'
)
UPDATE tasks SET due_at = $5, updated_at = now() WHERE id = $1 AND due_at = $2 AND $5::timestamptz IS NOT NULL
"""

_RETRY_SQL = """
UPDATE occurrences SET lease_until = $3, error = $4
WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed' AND claimed_by = $5
"""

# The platform accepted the first $3 parts of this text (whoever holds the claim now: it is a fact either way).
_PART_SENT_SQL = """
UPDATE occurrences SET sent_parts = greatest(sent_parts, $3), sent_text = coalesce(sent_text, $4)
WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed'
"""

# Where a reminder goes when its chat refused it for good: the owning account's most recently used private chat not
# tried yet ($2), on a platform this process ($3) or a live process of the fleet runs (turns.user_id is the identity
# that spoke there), with that identity.
_FALLBACK_CHAT_SQL = """
SELECT ch.id, ch.platform, ch.platform_chat_id, ch.thread_id, u.platform_user_id, u.display_name
FROM tasks t
JOIN users u ON u.account_id = t.user_id
JOIN turns tu ON tu.user_id = u.id
JOIN chats ch ON ch.id = tu.chat_id
WHERE t.id = $1 AND ch.kind = 'private' AND ch.id <> ALL($2::bigint[])
  AND (ch.platform = ANY($3::text[]) OR EXISTS (
      SELECT 1 FROM processes p, unnest(p.adapters) AS a
      WHERE p.seen_at >= now() - $4::interval AND starts_with(a, ch.platform || ' (')))
GROUP BY ch.id, u.id
ORDER BY max(tu.started_at) DESC, ch.id
LIMIT 1
"""

# The occurrence goes to another chat: its task moves there (later occurrences too) and the text to send there
# replaces what was sent before (none of it is in that chat), while $3 still holds the claim; no row: it lost it.
_MOVE_CHAT_SQL = """
WITH o AS (
    UPDATE occurrences SET sent_parts = 0, sent_text = $6
    WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed' AND claimed_by = $3
    RETURNING task_id
), t AS (
    UPDATE tasks SET chat_id = $5, updated_at = now() WHERE id IN (SELECT task_id FROM o) AND chat_id = $4
)
SELECT count(*) FROM o
"""

_RENEW_SQL = """
UPDATE occurrences o SET lease_until = $4
FROM unnest($1::bigint[], $2::timestamptz[]) AS k(task_id, scheduled_at)
WHERE o.task_id = k.task_id AND o.scheduled_at = k.scheduled_at AND o.claimed_by = $3 AND o.status = 'claimed'
"""

# Due times of open tasks and next attempts of retried occurrences in ($1, $2].
_UPCOMING_SQL = """
SELECT due_at AS t FROM tasks WHERE status IN ('pending', 'in_progress') AND due_at > $1 AND due_at <= $2
UNION SELECT lease_until FROM occurrences WHERE status = 'claimed' AND lease_until > $1 AND lease_until <= $2
ORDER BY 1 LIMIT $3
"""

# Open cron tasks whose next time was computed in another zone than their owner's (account's) current one.
_MOVED_ZONE_SQL = """
SELECT t.id, t.due_at, t.recurrence, coalesce(a.timezone, $2, t.timezone) AS tz
FROM tasks t JOIN accounts a ON a.id = t.user_id
WHERE t.status IN ('pending', 'in_progress') AND t.due_at > $1 AND t.recurrence->>'kind' = 'cron'
  AND t.timezone IS DISTINCT FROM coalesce(a.timezone, $2, t.timezone) AND ($3::bigint IS NULL OR t.user_id = $3)
LIMIT $4
"""

_REZONE_SQL = "UPDATE tasks SET due_at = $2, timezone = $3, updated_at = now() WHERE id = $1 AND due_at = $4"

_OWNED_TASK_SQL = """
SELECT t.id, t.title, t.status, t.recurrence, a.timezone
FROM tasks t JOIN accounts a ON a.id = t.user_id JOIN users u ON u.account_id = t.user_id
WHERE t.id = $1 AND u.platform = $2 AND u.platform_user_id = $3
"""

_DONE_SQL = "UPDATE tasks SET status = 'done', updated_at = now() WHERE id = $1"

_SNOOZE_SQL = "UPDATE tasks SET due_at = $2, status = 'pending', updated_at = now() WHERE id = $1"


async def claim(
    pool: Pool, instance: str, now: datetime, *, batch: int, late_after: timedelta, lease: timedelta, grace: timedelta
) -> list[Record]:
    """Claim up to `batch` due occurrences for `instance` (new ones, or ones whose lease ran out) with their task,
    owner and chat; an occurrence more than `late_after` behind is marked late."""
    return await pool.fetch(CLAIM_SQL, instance, now, batch, late_after, lease, grace)


async def stale(pool: Pool, now: datetime, grace: timedelta, batch: int, since: datetime | None = None) -> list[Record]:
    """Open tasks due before the grace window that were never tried (only those due at or after `since`, if given)."""
    if since is None:
        return await pool.fetch(STALE_SQL, now, grace, batch)
    return await pool.fetch(STALE_SINCE_SQL, now, grace, batch, since)


async def skip(pool: Pool, task_id: int, due_at: datetime, reason: str, next_due: datetime | None) -> None:
    """Record an occurrence as skipped with `reason` and move its series to `next_due`, in one transaction."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_SKIPPED_SQL, task_id, due_at, reason)
        if next_due is not None:
            await conn.execute(_MOVE_SQL, task_id, next_due, due_at)


async def expired(pool: Pool, now: datetime, grace: timedelta, batch: int) -> list[Record]:
    """Claimed occurrences past their grace window that no live process holds; `superseded` when the task moved."""
    return await pool.fetch(_EXPIRED_SQL, now, grace, batch)


async def delivered(pool: Pool, records: Sequence[Delivered]) -> None:
    """Mark these occurrences delivered and move their series on, in one statement."""
    columns = zip(*records, strict=True)
    await pool.execute(_DELIVERED_SQL, *map(list, columns))


async def end(pool: Pool, key: Key, status: str, reason: str, next_due: datetime | None) -> None:
    """End a claimed occurrence as `status` (failed or skipped) with its reason; a series moves to `next_due`."""
    await pool.execute(_ENDED_SQL, key[0], key[1], status, reason[:REMINDER_ERROR_CHARS], next_due)


async def retry_at(pool: Pool, key: Key, at: datetime, error: str, instance: str) -> None:
    """Keep `instance`'s claim until `at`, the next attempt, with the last error."""
    await pool.execute(_RETRY_SQL, key[0], key[1], at, error[:REMINDER_ERROR_CHARS], instance)


async def part_sent(pool: Pool, key: Key, parts: int, text: str) -> None:
    """Store that the platform has the first `parts` parts of `text` (a retry then sends only the rest)."""
    await pool.execute(_PART_SENT_SQL, key[0], key[1], parts, text)


async def fallback_chat(pool: Pool, task_id: int, tried: Sequence[int], platforms: Sequence[str]) -> Record | None:
    """The task owner's most recently used private chat not in `tried`, on one of `platforms` or a platform a live
    fleet process runs; with the identity there."""
    alive = timedelta(seconds=FLEET_ALIVE_S)
    return await pool.fetchrow(_FALLBACK_CHAT_SQL, task_id, list(tried), list(platforms), alive)


async def move_chat(pool: Pool, key: Key, instance: str, old_chat: int, new_chat: int, text: str) -> bool:
    """Move a claimed occurrence and its task from `old_chat` to `new_chat`, to be sent there as `text` (nothing of
    it sent yet); False when `instance` no longer holds the claim."""
    moved = await pool.fetchval(_MOVE_CHAT_SQL, key[0], key[1], instance, old_chat, new_chat, text)
    return bool(moved)


async def renew(pool: Pool, keys: Sequence[Key], instance: str, until: datetime) -> None:
    """Extend the leases of `instance`'s claims on these occurrences to `until`."""
    await pool.execute(_RENEW_SQL, [k[0] for k in keys], [k[1] for k in keys], instance, until)


async def upcoming(pool: Pool, after: datetime, until: datetime, limit: int) -> list[datetime]:
    """Distinct due times and retry times in (after, until], earliest first."""
    return [r["t"] for r in await pool.fetch(_UPCOMING_SQL, after, until, limit)]


async def replan_zones(
    pool: Pool, now: datetime, default_tz: str | None, user_id: int | None = None, limit: int = 500
) -> int:
    """Move open cron tasks set in another zone to their next time in their owner's current zone."""
    moved = 0
    for r in await pool.fetch(_MOVED_ZONE_SQL, now, default_tz, user_id, limit):
        rec = recurrence.from_json(r["recurrence"])
        if rec is None:
            continue
        times = recurrence.next_times(rec, zone(r["tz"]), now, None, count=1)
        if times:
            await pool.execute(_REZONE_SQL, r["id"], times[0], r["tz"], r["due_at"])
            moved += 1
    return moved


async def owned_task(pool: Pool, task_id: int, platform: str, user_id: str) -> Record | None:
    """The task with its owner's zone, if this platform user owns it."""
    return await pool.fetchrow(_OWNED_TASK_SQL, task_id, platform, user_id)


async def mark_done(pool: Pool, task_id: int) -> None:
    """Mark a task done (a series ends)."""
    await pool.execute(_DONE_SQL, task_id)


async def delete_task(pool: Pool, task_id: int) -> bool:
    """Delete a task (its occurrences go with it); False when it was already gone."""
    return await pool.fetchval("DELETE FROM tasks WHERE id = $1 RETURNING true", task_id) is not None


async def snooze(pool: Pool, task_id: int, until: datetime) -> None:
    """Move a task's next time to `until` and reopen it."""
    await pool.execute(_SNOOZE_SQL, task_id, until)


# ---- watches (core/reminders/watching.py) ------------------------------------------------------------------------

_WATCH_SQL = """
SELECT w.url, w.title, w.seen_hash, w.seen_text, w.failures, w.failing_since, w.reported, t.user_id,
       coalesce(t.created_by, (SELECT min(u.id) FROM users u WHERE u.account_id = t.user_id)) AS created_by
FROM watches w JOIN tasks t ON t.id = w.task_id WHERE w.task_id = $1
"""

_SEEN_SQL = """
UPDATE watches SET title = $2, seen_hash = $3, seen_text = $4, failures = $5, failing_since = $6, reported = $7,
    last_error = $8, checked_at = CASE WHEN $8::text IS NULL THEN $9 ELSE checked_at END
WHERE task_id = $1
"""

# A check with something to say keeps its text on the occurrence, to be sent like a reminder (a retry sends it).
_TO_SAY_SQL = """
UPDATE occurrences SET sent_text = $4, ran_at = $5
WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed' AND claimed_by = $3
"""

# A quiet check: its occurrence ends as checked (with why the page could not be read), the series moves on.
_CHECKED_SQL = """
UPDATE occurrences SET status = 'checked', ran_at = $5, error = $4
WHERE task_id = $1 AND scheduled_at = $2 AND status = 'claimed' AND claimed_by = $3
"""


async def watch_of(pool: Pool, task_id: int) -> Record | None:
    """A watch with what its last checks found, and its task's owner and maker."""
    return await pool.fetchrow(_WATCH_SQL, task_id)


async def watch_checked(
    pool: Pool,
    key: Key,
    instance: str,
    seen: tuple[str, str | None, str | None, int, datetime | None, bool, str | None],
    now: datetime,
    say: str | None,
    next_due: datetime | None,
    pause: bool,
) -> bool:
    """Store one check's outcome while `instance` holds its claim, in one transaction: the watch's new state (title,
    hash, text, failures, failing since, reported, error); with `say`, that text on the occurrence to send; without,
    the occurrence ends as checked and the series moves to `next_due`; `pause` pauses the watch. False (nothing
    stored) when the claim is no longer this instance's."""
    async with pool.acquire() as conn, conn.transaction():
        if say is not None:
            held = await conn.execute(_TO_SAY_SQL, key[0], key[1], instance, say, now)
        else:
            held = await conn.execute(_CHECKED_SQL, key[0], key[1], instance, seen[6], now)
        if held.endswith(" 0"):
            return False
        await conn.execute(_SEEN_SQL, key[0], *seen, now)
        if say is None and next_due is not None:
            await conn.execute(_MOVE_SQL, key[0], next_due, key[1])
        if pause:
            await conn.execute("UPDATE tasks SET status = 'paused', updated_at = now() WHERE id = $1", key[0])
    return True
