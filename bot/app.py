"""The composition root: settings → database → LLM → core → adapters → run."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from adapters import console
from core.db import EmbeddedPostgres, Pool, create_pool, migrate, start_embedded
from core.llm import LLM
from core.service import Core
from core.settings import Settings

log = logging.getLogger(__name__)


@asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[Pool]:
    """A migrated pool on DATABASE_URL, or on an embedded server in DATA_DIR/pg (stopped on exit)."""
    embedded: EmbeddedPostgres | None = None
    if settings.DATABASE_URL is not None:
        dsn = settings.DATABASE_URL.get_secret_value()
    else:
        embedded = start_embedded(settings.DATA_DIR)
        dsn = embedded.uri
    try:
        pool = await create_pool(dsn)
        try:
            await migrate(pool)
            yield pool
        finally:
            await pool.close()
    finally:
        if embedded is not None:
            embedded.stop()


async def run_bot(settings: Settings, *, ask_text: str | None = None) -> int:
    """Run until stopped; with `ask_text`, answer it in the terminal and return."""
    async with database(settings) as pool:
        core = Core(settings, pool, LLM.from_settings(settings))
        if ask_text is not None:
            answer, answered = await console.ask(core, ask_text)
            print(answer)
            return 0 if answered else 1
        if settings.TELEGRAM_BOT_TOKEN is None and settings.DISCORD_BOT_TOKEN is None:
            await console.chat_loop(core, console.stdin_lines(), lambda s: print(s, end="", flush=True))
            return 0
        print("Platform adapters are not available yet; unset the tokens to use the terminal chat.", file=sys.stderr)
        return 2
