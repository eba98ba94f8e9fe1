"""Optional embeddings for archival memory (EMBEDDING_MODEL, same OpenAI-compatible provider, pgvector)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import asyncpg

from core.constants import MEMORY_EMBED_TIMEOUT_S
from core.storage.db import Pool
from core.types import UserRef

if TYPE_CHECKING:  # the SDK loads with the first client made (a start without a model never loads it)
    import openai

log = logging.getLogger(__name__)

EmbeddingUsage = Callable[[UserRef, str, int], object]
"""Told of each embedding call's tokens: the person it was made for, the model and its prompt tokens."""


@dataclass(frozen=True)
class Embedded:
    """One text's vector and the prompt tokens its call used (None when the server did not say)."""

    vector: list[float]
    prompt_tokens: int | None = None


@dataclass(frozen=True)
class Embedder:
    """An embedding model: its name (stored with each vector), the call that embeds one text, and (set by the Core,
    bound per person by the memory tools) where each call's token usage is recorded."""

    model: str
    call: Callable[[str], Awaitable[Embedded]]
    on_usage: EmbeddingUsage | None = None
    user: UserRef | None = None

    def metered(self, on_usage: EmbeddingUsage) -> Embedder:
        """This embedder, telling `on_usage` of each call's tokens."""
        return replace(self, on_usage=on_usage)

    def for_user(self, user: UserRef) -> Embedder:
        """This embedder, its calls made for `user` (whose account their usage counts for)."""
        return replace(self, user=user)

    async def embed(self, text: str) -> list[float]:
        """The text's vector; its usage is recorded (a failed record is logged, the vector still returned)."""
        done = await self.call(text)
        if self.on_usage is not None and self.user is not None and done.prompt_tokens is not None:
            try:
                self.on_usage(self.user, self.model, done.prompt_tokens)
            except Exception as e:
                log.warning("embedding token usage not recorded: %s: %s", type(e).__name__, e)
        return done.vector


def openai_embedder(client: openai.AsyncOpenAI, model: str, timeout: float = MEMORY_EMBED_TIMEOUT_S) -> Embedder:
    """Embeddings through the same client as the chat model (its base URL, key and retries)."""

    async def call(text: str) -> Embedded:
        resp = await client.embeddings.create(model=model, input=text, encoding_format="float", timeout=timeout)
        tokens = resp.usage.prompt_tokens if resp.usage is not None else None
        return Embedded(list(resp.data[0].embedding), tokens)

    return Embedder(model, call)


def vector_literal(values: Sequence[float]) -> str:
    """pgvector's text form, `[0.1,0.2]` (cast with `::text::vector`; asyncpg has no codec for it)."""
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


async def prepare_embeddings(pool: Pool) -> bool:
    """At start-up with EMBEDDING_MODEL: pgvector and the embedding columns; False (logged) when unavailable."""
    try:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            await conn.execute(
                "ALTER TABLE archival_memory ADD COLUMN IF NOT EXISTS embedding vector,"
                " ADD COLUMN IF NOT EXISTS embedding_model text"
            )
    except (asyncpg.PostgresError, OSError) as e:
        log.warning("EMBEDDING_MODEL is set but pgvector is unavailable (%s); archival search uses text only", e)
        return False
    return True


async def store_embedding(pool: Pool, embedder: Embedder, entry_id: int, content: str) -> bool:
    """Embed an entry and store the vector; a failure is logged and leaves the entry without one."""
    import openai

    try:
        vector = await embedder.embed(content)
        await pool.execute(
            "UPDATE archival_memory SET embedding = $2::text::vector, embedding_model = $3 WHERE id = $1",
            entry_id,
            vector_literal(vector),
            embedder.model,
        )
    except (openai.OpenAIError, asyncpg.PostgresError, OSError, ValueError, IndexError) as e:
        log.warning("archival entry #%s stored without an embedding: %s", entry_id, type(e).__name__)
        return False
    return True


async def embed_query(embedder: Embedder, query: str) -> str | None:
    """The query's vector literal, or None (logged) when the embedding call fails: text search still runs."""
    import openai

    try:
        return vector_literal(await embedder.embed(query))
    except (openai.OpenAIError, OSError, ValueError, IndexError) as e:
        log.warning("archival search without embeddings this time: %s", type(e).__name__)
        return None
