"""Numbered SQL migrations from sql/, applied once each under an advisory lock."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from core.storage.db import Pool, untrusted_sql_connection

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parent.parent.parent / "sql"
MIGRATION_LOCK_KEY = 0x5A17_B07  # advisory lock id shared by every process of the bot
_MIGRATION_RE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


def migration_files(sql_dir: Path = SQL_DIR) -> list[tuple[int, str, str]]:
    """The numbered migrations as (version, name, sql), in order."""
    out: list[tuple[int, str, str]] = []
    for path in sorted(sql_dir.iterdir()):
        m = _MIGRATION_RE.match(path.name)
        if m:
            out.append((int(m.group(1)), path.name, path.read_text(encoding="utf-8")))
    return out


async def migrate(pool: Pool, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply pending migrations once each, in order, in transactions, under an advisory lock."""
    applied: list[str] = []
    async with pool.acquire() as conn:
        untrusted_sql_connection(conn)  # the migrations' own SQL may leave session state
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version int PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in migration_files(sql_dir):
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql)
                    await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
                log.info("applied migration %s", name)
                applied.append(name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return applied
