"""The inbox table (sql/008; the claim sql/013, store-and-claim sql/019): store an update once, claim the next one of
each chat, finish it.

A lease is the owner and the attempt that claimed it: renew, finish and hand-back touch an update only while this
process still holds it, so a process whose lease ran out and was taken over changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncpg import Record

from core.storage.db import Pool, affected

_RECEIVE_SQL = "SELECT stored, owner, attempts, handed_back, done FROM inbox_receive($1, $2, $3, $4, $5, $6)"

_RENEW_SQL = """
UPDATE inbox SET lease_until = now() + make_interval(secs => $3)
WHERE owner = $1 AND done_at IS NULL AND update_id = ANY($2::bigint[])
RETURNING update_id
"""


@dataclass(frozen=True)
class InboxItem:
    """A claimed update: handle it, then finish it (attempts > 1: an earlier claim may have half done it)."""

    platform: str
    update_id: int
    chat_key: str
    payload: dict[str, Any]
    attempts: int  # claims so far, this one included (with `owner`, it names this lease)
    waited_s: float  # from storing to this claim
    owner: str  # the process holding this lease
    handed_back: int  # earlier claims that ended in a clean hand-back (shutdown), not in a dead process

    @property
    def failed_attempts(self) -> int:
        """Earlier claims whose process died (or lost its lease) while handling the update."""
        return self.attempts - 1 - self.handed_back


async def receive(
    pool: Pool,
    platform: str,
    update_id: int,
    chat_key: str,
    payload: dict[str, Any],
    claimer: str | None,
    lease_s: float,
) -> tuple[bool, InboxItem | None]:
    """Store an update durably (committed on return), taken by `claimer` at once when its chat has nothing open
    (sql/019): whether it was new (False: a redelivery), and the item when `claimer` holds it now (also a redelivery
    that `claimer` took on an earlier try whose answer was lost)."""
    row = await pool.fetchrow(_RECEIVE_SQL, platform, update_id, chat_key, payload, claimer, lease_s)
    assert row is not None
    if claimer is None or row["owner"] != claimer or row["done"]:
        return bool(row["stored"]), None
    item = InboxItem(platform, update_id, chat_key, payload, row["attempts"], 0.0, claimer, row["handed_back"])
    return bool(row["stored"]), item


async def claim(pool: Pool, owner: str, platforms: Sequence[str], lease_s: float, limit: int) -> list[InboxItem]:
    """Lease up to `limit` updates that may run now (each the next one of its chat), oldest first."""
    rows = await pool.fetch("SELECT * FROM inbox_claim($1, $2, $3, $4)", list(platforms), owner, lease_s, limit)
    items = [_item(r, owner) for r in rows]
    return sorted(items, key=lambda i: i.update_id)


def _item(r: Record, owner: str) -> InboxItem:
    """A claimed row as an item held by `owner`."""
    return InboxItem(
        r["platform"], r["update_id"], r["chat_key"], r["payload"], r["attempts"], r["waited"], owner, r["handed_back"]
    )


async def renew(pool: Pool, owner: str, update_ids: Sequence[int], lease_s: float) -> list[int]:
    """Extend the leases this process still holds; returns the ids it no longer holds (another process took them
    over after their lease ran out, or they were finished meanwhile)."""
    kept = {r["update_id"] for r in await pool.fetch(_RENEW_SQL, owner, list(update_ids), lease_s)}
    return [u for u in update_ids if u not in kept]


# $6: the update's answer and its sent parts are stored (committed and flushed) already, so this mark needs no flush
# to disk of its own (synchronous_commit off for this statement's transaction alone): lost in a server crash, the
# update is only taken again, finds its answer sent and sends nothing
_FINISH_SQL = """
UPDATE inbox SET done_at = now(), owner = NULL, lease_until = NULL
WHERE platform = $1 AND update_id = $2 AND owner = $4 AND attempts = $5 AND done_at IS NULL
RETURNING EXISTS (SELECT 1 FROM inbox j WHERE j.platform = $1 AND j.chat_key = $3 AND j.done_at IS NULL
                  AND j.update_id <> $2),
          set_config('synchronous_commit', CASE WHEN $6 THEN 'off' ELSE current_setting('synchronous_commit') END, true)
"""


async def finish(pool: Pool, item: InboxItem, *, journaled: bool = False) -> bool | None:
    """Mark an update handled while its lease is still this claim's (also when it ran out and nobody took it): True
    when another update of its chat waits, False when none; None when the lease was lost (another process took the
    update over: it is theirs to finish, and its chat's next update waits for them). `journaled`: its answer and
    each part sent are stored already (a turn's), so the mark is committed without waiting for the disk."""
    row = await pool.fetchrow(
        _FINISH_SQL, item.platform, item.update_id, item.chat_key, item.owner, item.attempts, journaled
    )
    return None if row is None else bool(row[0])


async def release(pool: Pool, owner: str, update_ids: Sequence[int]) -> int:
    """Hand leased updates back at once (shutting down): another process takes them without waiting for the lease,
    and the attempt does not count as failed. Updates this process no longer holds are left alone."""
    status = await pool.execute(
        "UPDATE inbox SET owner = NULL, lease_until = NULL, handed_back = handed_back + 1"
        " WHERE owner = $1 AND done_at IS NULL AND update_id = ANY($2::bigint[])",
        owner,
        list(update_ids),
    )
    return affected(status)


async def depth(pool: Pool) -> tuple[int, float]:
    """How many updates wait or run, and the age in seconds of the oldest (0 when none)."""
    row = await pool.fetchrow(
        "SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(received_at)), 0)::float8 AS age"
        " FROM inbox WHERE done_at IS NULL"
    )
    assert row is not None
    return int(row["n"]), float(row["age"])


async def forget_done(pool: Pool, older_than_s: float, limit: int) -> int:
    """Delete handled updates older than `older_than_s` (kept that long so a redelivery is still recognised)."""
    status = await pool.execute(
        "DELETE FROM inbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM inbox"
        " WHERE done_at < now() - make_interval(secs => $1) LIMIT $2))",
        older_than_s,
        limit,
    )
    return affected(status)
