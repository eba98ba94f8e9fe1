"""sql/020: every existing user becomes an account with one identity, and nothing they own is lost."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import asyncpg

from core.storage.db import create_pool
from core.storage.migrations import SQL_DIR, migrate
from tests.conftest import with_database

_databases = itertools.count()


async def test_existing_users_become_accounts_owning_their_rows(pg_server: str, tmp_path: Path) -> None:
    before = tmp_path / "sql"
    before.mkdir()
    for path in SQL_DIR.glob("*.sql"):
        if int(path.name[:3]) < 20:
            shutil.copy(path, before / path.name)
    admin = await asyncpg.connect(pg_server)
    name = f"accounts_{os.getpid()}_{next(_databases)}"
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        pool = await create_pool(with_database(pg_server, name), min_size=1, max_size=2)
        try:
            await migrate(pool, before)
            ann, bob = [
                await pool.fetchval(
                    "INSERT INTO users (platform, platform_user_id, display_name, timezone)"
                    " VALUES ($1, $2, $3, $4) RETURNING id",
                    *row,
                )
                for row in (("telegram", "1", "Ann", "Europe/Berlin"), ("discord", "2", "Bob", None))
            ]
            chat = await pool.fetchval(
                "INSERT INTO chats (platform, platform_chat_id) VALUES ('telegram', '1') RETURNING id"
            )
            await pool.execute(
                "INSERT INTO tasks (user_id, chat_id, title, due_at) VALUES ($1, $2, 'call mum', now())", ann, chat
            )
            await pool.execute(
                "INSERT INTO memory_blocks (user_id, name, lines) VALUES ($1, 'human', '{likes tea}')", ann
            )
            await pool.execute(
                "INSERT INTO archival_memory (user_id, content, sha256) VALUES ($1, 'b1', sha256('b1'::bytea))", bob
            )

            assert "020_accounts.sql" in await migrate(pool)

            accounts = await pool.fetch(
                "SELECT u.id, u.account_id, a.timezone FROM users u JOIN accounts a ON a.id = u.account_id"
                " ORDER BY u.id"
            )
            assert [tuple(r) for r in accounts] == [(ann, ann, "Europe/Berlin"), (bob, bob, None)]
            assert await pool.fetchval("SELECT count(*) FROM accounts") == 2
            owned = await pool.fetchrow(
                "SELECT (SELECT user_id FROM tasks) AS task, (SELECT created_by FROM tasks) AS made_by,"
                " (SELECT user_id FROM memory_blocks) AS block, (SELECT user_id FROM archival_memory) AS note"
            )
            assert owned is not None and tuple(owned) == (ann, ann, ann, bob)
            # a new identity gets an account of its own with its own id, and an account made later never takes one
            cat = await pool.fetchval(
                "INSERT INTO users (platform, platform_user_id) VALUES ('telegram', '3') RETURNING id"
            )
            assert await pool.fetchval("SELECT account_id FROM users WHERE id = $1", cat) == cat
            later = await pool.fetchval("INSERT INTO accounts DEFAULT VALUES RETURNING id")
            dog = await pool.fetchval(
                "INSERT INTO users (platform, platform_user_id) VALUES ('telegram', '4') RETURNING id"
            )
            assert len({cat, later, dog}) == 3
            # the bot's upsert of a known identity makes no account
            await pool.execute(
                "INSERT INTO users (platform, platform_user_id) VALUES ('telegram', '3')"
                " ON CONFLICT (platform, platform_user_id) DO UPDATE SET display_name = 'Cat'"
            )
            assert await pool.fetchval("SELECT count(*) FROM accounts") == 5
            # deleting an account takes its identities, tasks and memory along
            await pool.execute("DELETE FROM accounts WHERE id = $1", ann)
            left = await pool.fetchrow(
                "SELECT (SELECT count(*) FROM users WHERE id = $1) AS u, (SELECT count(*) FROM tasks) AS t,"
                " (SELECT count(*) FROM memory_blocks) AS m",
                ann,
            )
            assert left is not None and tuple(left) == (0, 0, 0)
        finally:
            await pool.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()
