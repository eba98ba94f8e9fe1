"""Refusal notices: when each chat was last told that the bot is private, shared by every process."""

from __future__ import annotations

from core.storage.db import Pool


async def claim_refusal_notice(pool: Pool, chat_key: str, every_s: float) -> bool:
    """Whether this process should tell the chat now (not told within `every_s` by any process); records it."""
    told: bool | None = await pool.fetchval(
        "INSERT INTO refusal_notices (chat_key, told_at) VALUES ($1, now())"
        " ON CONFLICT (chat_key) DO UPDATE SET told_at = excluded.told_at"
        " WHERE refusal_notices.told_at <= now() - make_interval(secs => $2)"
        " RETURNING true",
        chat_key,
        every_s,
    )
    return bool(told)
