"""Bringing the core up for bot/: the database (embedded or DATABASE_URL, migrated), the model client, the Core."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from core.agent.llm import LLM
from core.front_door import Core
from core.memory.embeddings import Embedder, openai_embedder, prepare_embeddings
from core.metrics import Metrics
from core.settings import Settings
from core.storage.db import Pool, check_database, create_pool
from core.storage.embedded import EmbeddedPostgres, start_embedded
from core.storage.migrations import migrate

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
        await check_database(dsn)  # a bad DATABASE_URL: one line, within CONNECT_TIMEOUT_S
        pool = await create_pool(dsn)
        try:
            await migrate(pool)
            yield pool
        finally:
            await pool.close()
    finally:
        if embedded is not None:
            embedded.stop()


async def embeddings(settings: Settings, pool: Pool, llm: LLM) -> Embedder | None:
    """The archival memory's embedder when EMBEDDING_MODEL is set and pgvector is there (else a warning, text only)."""
    if settings.EMBEDDING_MODEL is None:
        return None
    if not await prepare_embeddings(pool):
        return None
    log.info("archival memory embeddings: %s", settings.EMBEDDING_MODEL)
    return openai_embedder(llm.client, settings.EMBEDDING_MODEL)


@asynccontextmanager
async def open_core(settings: Settings) -> AsyncIterator[Core]:
    """The database, the model client and the Core, with turns a dead process left running closed and the enabled
    capabilities loaded (one that fails to load is logged and skipped); everything is closed on exit."""
    async with database(settings) as pool:
        metrics = Metrics()  # the process's; /metrics serves it when PORT is set
        llm = LLM.from_settings(settings, metrics=metrics)
        try:
            core = Core(settings, pool, llm, embedder=await embeddings(settings, pool, llm), metrics=metrics)
            await core.close_abandoned_turns()
            await core.capabilities.load_all()
            core.mcp.start()  # MCP tool servers connect in the background: start-up never waits for them
            try:
                yield core
            finally:
                await core.close()
        finally:
            await llm.aclose()
