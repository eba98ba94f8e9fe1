"""Settings validation, migrations (twice, and from two processes at once), the embedded server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import asyncpg
import pytest

from core.settings import Settings, SettingsError, load_settings
from core.storage.db import create_pool
from core.storage.migrations import migrate, migration_files


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No configuration from the environment or a .env in the working directory."""
    monkeypatch.chdir(tmp_path)
    for name in Settings.model_fields:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_defaults(clean_env: Path) -> None:
    s = load_settings()
    assert (s.LLM_PROVIDER, s.DEFAULT_TIMEZONE, s.AGENT_MAX_STEPS, s.HISTORY_MESSAGES) == ("openai", "UTC", 10, 40)
    assert (s.AGENT_STEP_TIMEOUT, s.AGENT_TOTAL_TIMEOUT) == (60.0, 180.0)
    assert s.DATABASE_URL is None and s.DATA_DIR == Path(".data") and s.allowed_users == frozenset()


def test_env_file_is_read(clean_env: Path) -> None:
    (clean_env / ".env").write_text("LLM_PROVIDER=Ollama\nADMINS=telegram:1, discord:2\nALLOWED_USERS=*\n")
    s = load_settings()
    assert s.LLM_PROVIDER == "ollama"
    assert s.admins == {"telegram:1", "discord:2"}
    assert "*" in s.allowed_users


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"AGENT_MAX_STEPS": "lots"}, "AGENT_MAX_STEPS: must be a valid integer"),
        ({"DEFAULT_TIMEZONE": "Mars/Base"}, "DEFAULT_TIMEZONE: 'Mars/Base' is not an IANA time zone"),
        ({"ADMINS": "telegram123"}, "ADMINS: 'telegram123' is not of the form platform:id"),
        ({"LLM_PROVIDER": "skynet"}, "LLM_PROVIDER: must be 'openai', 'anthropic'"),
        ({"HISTORY_MESSAGES": "1"}, "HISTORY_MESSAGES: must be greater than or equal to 2 (got '1')"),
    ],
)
def test_invalid_value_is_one_clear_line(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as e:
        load_settings()
    msg = str(e.value)
    assert msg.startswith(expected) and "\n" not in msg  # the variable first, no prefix


def test_secrets_never_printed(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:secret-token")
    monkeypatch.setenv("AGENT_MAX_STEPS", "-1")
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert "secret" not in str(e.value)
    monkeypatch.setenv("AGENT_MAX_STEPS", "3")
    s = load_settings()
    assert "secret" not in repr(s) and "secret" not in str(s.model_dump())


async def test_migrations_apply_once(db_dsn: str) -> None:
    pool = await create_pool(db_dsn, min_size=1, max_size=2)
    try:
        # the test database is a copy of a migrated template: nothing is left to apply
        assert await migrate(pool) == []
        versions = [r["version"] for r in await pool.fetch("SELECT version FROM schema_migrations ORDER BY 1")]
        assert versions == [v for v, _, _ in migration_files()]
    finally:
        await pool.close()


async def _fresh_db(pg_server: str, name: str) -> str:
    """Create an empty database and return its URL."""
    from tests.conftest import with_database

    conn = await asyncpg.connect(pg_server)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return with_database(pg_server, name)


async def test_migrations_from_empty_twice(pg_server: str) -> None:
    dsn = await _fresh_db(pg_server, "bot_test_migrate_twice")
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        first = await migrate(pool)
        assert first == [name for _, name, _ in migration_files()]
        assert await migrate(pool) == []
        assert await pool.fetchval("SELECT count(*) FROM users") == 0
    finally:
        await pool.close()


async def test_migrations_from_two_processes_at_once(pg_server: str) -> None:
    dsn = await _fresh_db(pg_server, "bot_test_migrate_concurrent")
    code = (
        "import asyncio, sys\n"
        "from core.storage.db import create_pool\nfrom core.storage.migrations import migrate\n"
        "async def main():\n"
        "    pool = await create_pool(sys.argv[1], min_size=1, max_size=1)\n"
        "    print(len(await migrate(pool)))\n"
        "    await pool.close()\n"
        "asyncio.run(main())\n"
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            dsn,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
        for _ in range(2)
    ]
    outs = [await p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1].decode() for o in outs]
    applied = sorted(int(o[0]) for o in outs)
    assert applied == [0, len(migration_files())]  # one process applied everything, the other nothing
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(migration_files())
    finally:
        await conn.close()


def test_env_example_lists_every_variable() -> None:
    example = (Path(__file__).resolve().parent.parent / ".env.example").read_text()
    missing = [name for name in Settings.model_fields if f"\n{name}=" not in example]
    assert missing == []
