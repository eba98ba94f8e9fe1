"""Small values an adapter keeps across restarts and shares between processes, by key (sql/038, 039): a sync token, a
room's kind, a person's direct room, what a message's reactions press. A value about one person names them (`owner`,
an identity such as `matrix:@ann:example.org`) and goes with /forget_me; one worth keeping only a while has a `keep`
and goes with retention after it."""

from __future__ import annotations

from datetime import timedelta

from core.storage.db import Pool

_PUT_SQL = """
INSERT INTO platform_state (key, value, owner, expires_at) VALUES ($1, $2, $3, now() + $4::interval)
ON CONFLICT (key) DO UPDATE
SET value = excluded.value, owner = excluded.owner, expires_at = excluded.expires_at, updated_at = now()
"""
# an expired value is as good as none, also before retention deletes it
_GET_SQL = "SELECT value FROM platform_state WHERE key = $1 AND (expires_at IS NULL OR expires_at > now())"


class PlatformState:
    """What adapters keep, by key: `Core.kept`."""

    def __init__(self, pool: Pool) -> None:
        """Kept in the pool's database."""
        self.pool = pool

    async def get(self, key: str) -> str | None:
        """The value kept under key (None: none, or it expired)."""
        value = await self.pool.fetchval(_GET_SQL, key)
        return None if value is None else str(value)

    async def put(self, key: str, value: str, *, owner: str | None = None, keep: timedelta | None = None) -> None:
        """Keep value under key, replacing what was there: about `owner` (an identity, platform:id), for `keep` (None:
        for good). Raises while the database is away."""
        await self.pool.execute(_PUT_SQL, key, value, owner, keep)

    async def forget(self, key: str) -> None:
        """Delete what is kept under key (nothing kept: nothing to do)."""
        await self.pool.execute("DELETE FROM platform_state WHERE key = $1", key)
