"""Token usage of embedding calls (issue 21): archival memory's inserts and searches with EMBEDDING_MODEL count their
prompt tokens for the speaking person's account under the embedding model; a failed record never breaks the tool."""

from __future__ import annotations

from typing import Any

import pytest

from core.front_door import Core
from core.memory.embeddings import Embedded, Embedder
from core.startup import embeddings
from core.storage.db import Pool
from core.types import UserRef
from tests.conftest import FakeClock
from tests.fake_openai import FakeOpenAI, Reply, _tokens
from tests.helpers import answer, incoming, run
from tests.test_usage import account_of, usage_rows, used


async def test_archival_embeddings_record_their_tokens_for_the_speaking_account(
    make_settings: Any, make_llm: Any, pool: Pool, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    settings = make_settings(EMBEDDING_MODEL="fake-embed")
    embedder = await embeddings(settings, pool, make_llm(settings))
    assert embedder is not None
    core = Core(settings, pool, make_llm(settings), clock=clock, embedder=embedder)
    try:
        fact, query, other = "Alice's dentist is Dr Who on Baker Street", "who is my dentist", "my shoe size please"
        fake_llm.script(
            Reply(tool_calls=[("archival_memory_insert", {"content": fact})], usage=used(100, 5)),
            Reply(tool_calls=[("archival_memory_search", {"query": query})], usage=used(110, 5)),
            Reply(text="Dr Who", usage=used(120, 3)),
            Reply(tool_calls=[("archival_memory_search", {"query": other})], usage=used(50, 2)),
            Reply(text="I don't know", usage=used(60, 4)),
        )
        assert answer(await run(core, incoming("remember my dentist", user="100"))).text == "Dr Who"
        assert answer(await run(core, incoming("my shoes?", user="200"))).text == "I don't know"
        assert fake_llm.embedding_inputs == [fact, query, other]
        ann, bob = await account_of(pool, "telegram", "100"), await account_of(pool, "telegram", "200")
        rows = [(a, m, p, c, k, n) for a, _day, m, p, c, k, n in await usage_rows(core)]
        assert rows == [
            (ann, "fake-embed", _tokens(fact) + _tokens(query), 0, 0, 2),
            (ann, "fake-model", 330, 13, 0, 3),
            (bob, "fake-embed", _tokens(other), 0, 0, 1),
            (bob, "fake-model", 110, 6, 0, 2),
        ]
    finally:
        await core.drain(0)


async def test_a_failed_usage_record_never_breaks_the_embedding(caplog: pytest.LogCaptureFixture) -> None:
    async def call(text: str) -> Embedded:
        return Embedded([1.0, 0.0], 7)

    def broken(user: UserRef, model: str, tokens: int) -> None:
        raise RuntimeError("no loop")

    user = UserRef(1, 1, "telegram", "100", "Ann", "UTC")
    assert await Embedder("m", call).metered(broken).for_user(user).embed("x") == [1.0, 0.0]
    assert "embedding token usage not recorded: RuntimeError: no loop" in caplog.text
