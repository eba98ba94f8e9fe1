"""The inbox table (sql/008; the claim is sql/011): store an update once, claim the next one of each chat, finish it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.storage.db import Pool

_PUT_SQL = """
INSERT INTO inbox (platform, update_id, chat_key, payload) VALUES ($1, $2, $3, $4)
ON CONFLICT (platform, update_id) DO NOTHING
"""

_RENEW_SQL = """
UPDATE inbox SET lease_until = now() + make_interval(secs => $3)
WHERE owner = $1 AND done_at IS NULL AND update_id = ANY($2::bigint[])
"""


@dataclass(frozen=True)
class InboxItem:
    """A claimed update: handle it, then finish it (attempts > 1: an earlier claim may have half done it)."""

    platform: str
    update_id: int
    chat_key: str
    payload: dict[str, Any]
    attempts: int
    waited_s: float  # from storing to this claim


async def put(pool: Pool, platform: str, update_id: int, chat_key: str, payload: dict[str, Any]) -> bool:
    """Store an update durably (committed on return); False when it was stored before (a redelivery)."""
    status = await pool.execute(_PUT_SQL, platform, update_id, chat_key, payload)
    return status.endswith(" 1")


async def claim(pool: Pool, owner: str, platforms: Sequence[str], lease_s: float, limit: int) -> list[InboxItem]:
    """Lease up to `limit` updates that may run now (each the next one of its chat), oldest first."""
    rows = await pool.fetch("SELECT * FROM inbox_claim($1, $2, $3, $4)", list(platforms), owner, lease_s, limit)
    items = [
        InboxItem(r["platform"], r["update_id"], r["chat_key"], r["payload"], r["attempts"], r["waited"]) for r in rows
    ]
    return sorted(items, key=lambda i: i.update_id)


async def renew(pool: Pool, owner: str, update_ids: Sequence[int], lease_s: float) -> None:
    """Extend the leases this process still holds."""
    await pool.execute(_RENEW_SQL, owner, list(update_ids), lease_s)


_FINISH_SQL = """
UPDATE inbox SET done_at = now(), owner = NULL, lease_until = NULL WHERE platform = $1 AND update_id = $2
RETURNING EXISTS (SELECT 1 FROM inbox j WHERE j.platform = $1 AND j.chat_key = $3 AND j.done_at IS NULL
                  AND j.update_id <> $2)
"""


async def finish(pool: Pool, item: InboxItem) -> bool:
    """Mark an update handled (also when its lease had run out: its chat's next update may go); True when another
    update of its chat waits."""
    return bool(await pool.fetchval(_FINISH_SQL, item.platform, item.update_id, item.chat_key))


async def release(pool: Pool, owner: str, update_ids: Sequence[int]) -> int:
    """Hand leased updates back at once (shutting down): another process takes them without waiting for the lease."""
    status = await pool.execute(
        "UPDATE inbox SET owner = NULL, lease_until = NULL WHERE owner = $1 AND done_at IS NULL"
        " AND update_id = ANY($2::bigint[])",
        owner,
        list(update_ids),
    )
    return int(status.rsplit(" ", 1)[-1])


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
    return int(status.rsplit(" ", 1)[-1])
