"""Small values an adapter keeps across restarts and shares between processes, by key (sql/038): a sync token, a
room's kind."""

from __future__ import annotations

from core.storage.db import Pool

_PUT_SQL = """
INSERT INTO platform_state (key, value) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()
"""


class PlatformState:
    """What adapters keep, by key: `Core.kept`."""

    def __init__(self, pool: Pool) -> None:
        """Kept in the pool's database."""
        self.pool = pool

    async def get(self, key: str) -> str | None:
        """The value kept under key (None: none yet)."""
        value = await self.pool.fetchval("SELECT value FROM platform_state WHERE key = $1", key)
        return None if value is None else str(value)

    async def put(self, key: str, value: str) -> None:
        """Keep value under key, replacing what was there (raises while the database is away)."""
        await self.pool.execute(_PUT_SQL, key, value)
