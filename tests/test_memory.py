"""Memory: core blocks, archival memory and conversation search, per user, through the real tool registry."""

from __future__ import annotations

import json
import os
from dataclasses import astuple
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import openai
import pytest

from core.agent.prompt import GROUP_MEMORY_NOTE
from core.capabilities.runtime import run_query
from core.front_door import Core
from core.memory.blocks import render_prompt_section
from core.memory.embeddings import Embedder, openai_embedder, prepare_embeddings
from core.memory.show_and_erase import delete_memory_line, memory_overview, wipe_memory
from core.memory.tools import memory_tools
from core.startup import embeddings
from core.storage.conversations import begin_turn, finish_turn_with_answer
from core.storage.db import Pool, create_pool
from core.storage.migrations import migrate
from core.tools.framework import ToolContext, ToolRegistry
from core.types import JOB_MESSAGE_PREFIX, ChatRef, Incoming, UserRef
from tests.conftest import FakeClock, MakeCore, with_database
from tests.fake_openai import EMBEDDING_DIMENSIONS, FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_messages, tool_names

ALICE, BOB = "100", "200"


async def turn(pool: Pool, user: str, text: str, reply: str | None = None, *, group: bool = False) -> UserRef:
    """Store a message (and the bot's answer) the way a real turn does; the speaking user's reference."""
    chat = "-500" if group else user
    inc = Incoming("telegram", user, chat, text, user_name=f"u{user}", chat_kind="group" if group else "private")
    start = await begin_turn(pool, inc, "UTC", 40, datetime(2100, 1, 1, tzinfo=UTC), 5)
    assert start.turn_id is not None
    if reply is not None:
        await finish_turn_with_answer(pool, start.chat, start.turn_id, reply, "done", 1)
    return start.user


class Person:
    """One user talking to the bot in a private chat, calling memory tools through a registry."""

    def __init__(self, pool: Pool, user: UserRef, clock: FakeClock, registry: ToolRegistry) -> None:
        """Bind the user's tool context."""
        chat = ChatRef(0, "telegram", user.platform_user_id, "", "private")
        self.ctx = ToolContext(pool, user, chat, False, clock)
        self.registry = registry

    async def call(self, name: str, **args: Any) -> dict[str, Any]:
        """Run one tool call; the envelope."""
        return await self.registry.run(name, json.dumps(args), self.ctx, 30)

    async def ok(self, name: str, **args: Any) -> str:
        """Run one call that must succeed; its result text."""
        env = await self.call(name, **args)
        assert env["ok"], env
        result: str = env["result"]
        return result

    async def refused(self, name: str, **args: Any) -> str:
        """Run one call that must fail with invalid_args; its message."""
        env = await self.call(name, **args)
        assert not env["ok"] and env["error"]["code"] == "invalid_args", env
        message: str = env["error"]["message"]
        return message


async def link_on_discord(pool: Pool, telegram: UserRef) -> UserRef:
    """The same person writing from Discord too, their identity linked to the Telegram one's account."""
    inc = Incoming("discord", f"d{telegram.platform_user_id}", f"dm{telegram.platform_user_id}", "hi", user_name="d")
    start = await begin_turn(pool, inc, "UTC", 40, datetime(2100, 1, 1, tzinfo=UTC), 5)
    await pool.execute("UPDATE users SET account_id = $1 WHERE id = $2", telegram.account_id, start.user.id)
    await pool.execute("DELETE FROM accounts WHERE id = $1", start.user.account_id)
    return UserRef(telegram.account_id, *astuple(start.user)[1:])


@pytest.fixture(params=["one identity", "linked on two platforms"])
def people(pool: Pool, clock: FakeClock, request: pytest.FixtureRequest) -> Any:
    """A factory: Person for a platform user id, with the default 500-word limit (or another). Linked: each person
    also writes from Discord, and the Person calls the tools from there (their Telegram turns stay Telegram's), so
    every isolation test runs again with two people who are each one account on two platforms."""

    async def make(uid: str, words: int = 500, embedder: Embedder | None = None) -> Person:
        user = await turn(pool, uid, "hello")
        if request.param == "linked on two platforms":
            user = await link_on_discord(pool, user)
        return Person(pool, user, clock, ToolRegistry(memory_tools(words, embedder)))

    return make


async def test_core_memory_tools_and_their_texts(people: Any, pool: Pool) -> None:
    alice = await people(ALICE)
    assert await alice.ok("core_memory_append", block="human", content="Name: Alice") == (
        'Appended to [human] at line 1: "Name: Alice" (2/500 words)'
    )
    assert await alice.ok("core_memory_append", block="user", content="  Works at: Google ") == (
        'Appended to [human] at line 2: "Works at: Google" (5/500 words)'
    )
    assert await alice.ok("core_memory_append", block="Human", content="Name: Alice") == (
        'Line already exists in [human] at line 1: "Name: Alice" (no change)'
    )
    assert await alice.ok("core_memory_read", block="me") == (
        "[human] Core Memory (2 lines, 5/500 words):\n1: Name: Alice\n2: Works at: Google"
    )
    assert await alice.ok("core_memory_replace", block="human", line_number=2, new_content="Works at: DeepMind") == (
        'Replaced line 2 in [human]: "Works at: Google" → "Works at: DeepMind" (5/500 words)'
    )
    await alice.ok("core_memory_append", block="human", content="Likes tea")
    assert await alice.ok("core_memory_delete", block="human", line_number=1) == (
        "Deleted line 1 from [human]; lines below moved up"
    )
    assert await alice.ok("core_memory_read", block="human") == (
        "[human] Core Memory (2 lines, 5/500 words):\n1: Works at: DeepMind\n2: Likes tea"
    )
    assert await alice.ok("core_memory_read", block="persona") == "[persona] Core Memory (0 lines, 0/500 words):"
    await alice.ok("core_memory_append", block="Travel Plans", content="Lisbon in May")
    assert await alice.ok("core_memory_list_blocks") == (
        "[human] Facts about the user (2 lines, 5/500 words)\n"
        "[persona] How you behave with this user (0 lines, 0/500 words)\n"
        "[travel_plans] Custom block (1 line, 3/500 words)"
    )
    # an emptied custom block goes away; human and persona always stay
    await alice.ok("core_memory_delete", block="travel-plans", line_number=1)
    assert "[travel_plans]" not in await alice.ok("core_memory_list_blocks")
    await alice.ok("core_memory_delete", block="human", line_number=2)
    await alice.ok("core_memory_delete", block="human", line_number=1)
    assert (await alice.ok("core_memory_list_blocks")).startswith("[human] Facts about the user (0 lines, 0/500")


async def test_block_names_are_normalised_and_invalid_ones_explained(people: Any) -> None:
    alice = await people(ALICE)
    await alice.ok("core_memory_append", block="YOU", content="Answer briefly")
    await alice.ok("core_memory_append", block="self", content="Use metric units")
    await alice.ok("core_memory_append", block="assistant", content="No emojis")
    assert "3 lines" in await alice.ok("core_memory_read", block=" Persona ")
    await alice.ok("core_memory_append", block="My-Projects", content="Garden shed")
    assert "1: Garden shed" in await alice.ok("core_memory_read", block="my projects")
    message = await alice.refused("core_memory_append", block="!!!", content="x")
    assert "invalid block name '!!!'" in message and "human, persona, my_projects" in message
    message = await alice.refused("core_memory_read", block="hobbies")
    assert message.startswith("no block [hobbies]; blocks: human, persona, my_projects")
    for i in range(7):
        await alice.ok("core_memory_append", block=f"b{i}", content="x")
    assert "at most 10 blocks" in await alice.refused("core_memory_append", block="one_too_many", content="x")


async def test_line_numbers_are_checked_with_the_valid_range(people: Any) -> None:
    alice = await people(ALICE)
    await alice.ok("core_memory_append", block="human", content="one")
    await alice.ok("core_memory_append", block="human", content="two")
    message = await alice.refused("core_memory_replace", block="human", line_number=3, new_content="three")
    assert message == "line 3 does not exist in [human]; valid lines: 1-2"
    assert "valid lines: 1-2" in await alice.refused("core_memory_delete", block="human", line_number=9)
    assert "line 0 does not exist in [human]; valid lines: 1-2" in await alice.refused(
        "core_memory_delete", block="human", line_number=0
    )
    assert await alice.refused("core_memory_delete", block="persona", line_number=1) == "[persona] has no lines"
    assert "one line" in await alice.refused("core_memory_append", block="human", content="a\nb")
    assert await alice.refused("core_memory_append", block="human", content="   ") == "content is empty"
    assert await alice.refused("core_memory_append", block="human", content="x" * 1001) == (
        "content is 1001 characters; a line holds at most 1000 (details go to archival memory)"
    )
    assert "1: one\n2: two" in await alice.ok("core_memory_read", block="human")  # nothing changed


async def test_warning_at_80_percent_and_refusal_past_the_limit(people: Any, pool: Pool) -> None:
    alice = await people(ALICE, words=20)
    result = await alice.ok("core_memory_append", block="human", content="w " * 15)
    assert result.startswith('Appended to [human] at line 1: "') and "(15/20 words)" in result
    assert "Warning" not in result
    result = await alice.ok("core_memory_append", block="human", content="one more")
    assert result.endswith(
        "(17/20 words)\nWarning: [human] is 85% full (17/20 words): "
        "consolidate its lines or move detail to archival memory."
    )
    assert "Warning: [human] is 85% full" in await alice.ok("core_memory_read", block="human")
    env = await alice.call("core_memory_append", block="human", content="four more words here")
    assert env == {
        "ok": False,
        "error": {
            "code": "invalid_args",
            "message": "cannot append to [human]: it would hold 21/20 words; 3 words left. Consolidate lines "
            "(core_memory_replace/core_memory_delete) or move detail to archival memory.",
        },
    }
    message = await alice.refused("core_memory_replace", block="human", line_number=2, new_content="a b c d e f")
    assert "it would hold 21/20 words; 3 words left" in message
    assert "(17/20 words)" in await alice.ok("core_memory_read", block="human")  # nothing cut, nothing stored
    rows = await pool.fetch("SELECT memory_blocks_json($1) AS b", alice.ctx.user.account_id)
    section = render_prompt_section(rows[0]["b"], 20)
    assert "Warning: [human] is 85% full (17/20 words)" in section
    await alice.ok("core_memory_replace", block="human", line_number=1, new_content="short")
    rows = await pool.fetch("SELECT memory_blocks_json($1) AS b", alice.ctx.user.account_id)
    assert "Warning" not in render_prompt_section(rows[0]["b"], 20)


async def test_prompt_section_format(people: Any, pool: Pool) -> None:
    alice = await people(ALICE)
    blocks = await pool.fetchval("SELECT memory_blocks_json($1)", alice.ctx.user.account_id)
    assert render_prompt_section(blocks, 500) == (
        "<core_memory>\n[human] Facts about the user (0 lines, 0/500 words)\n"
        "[persona] How you behave with this user (0 lines, 0/500 words)\n</core_memory>"
    )
    await alice.ok("core_memory_append", block="zeta", content="custom first")
    await alice.ok("core_memory_append", block="persona", content="Be brief")
    await alice.ok("core_memory_append", block="human", content="Name: Alice")
    await alice.ok("core_memory_append", block="human", content="Works at: Google")
    blocks = await pool.fetchval("SELECT memory_blocks_json($1)", alice.ctx.user.account_id)
    assert render_prompt_section(blocks, 500) == (
        "<core_memory>\n"
        "[human] Facts about the user (2 lines, 5/500 words)\n"
        "1: Name: Alice\n"
        "2: Works at: Google\n"
        "[persona] How you behave with this user (1 line, 2/500 words)\n"
        "1: Be brief\n"
        "[zeta] Custom block (1 line, 2/500 words)\n"
        "1: custom first\n"
        "</core_memory>"
    )


async def test_archival_insert_dedupe_search_and_paging(people: Any, clock: FakeClock) -> None:
    alice = await people(ALICE)
    first = await alice.ok("archival_memory_insert", content="Coffee note 1")
    assert first.startswith("Stored in archival memory (#") and first.endswith(")")
    entry_id = first.removeprefix("Stored in archival memory (#").removesuffix(")")
    assert await alice.ok("archival_memory_insert", content=" Coffee note 1 ") == (
        f"Already in archival memory (#{entry_id}, no change)"
    )
    for i in range(2, 13):
        await alice.ok("archival_memory_insert", content=f"Coffee note {i}")
    await alice.ok("archival_memory_insert", content="Tea is fine too")
    page1 = await alice.ok("archival_memory_search", query="coffee")
    day = clock.now.strftime("%Y-%m-%d")
    assert page1 == "\n".join(
        [
            'Archival Memory Search for "coffee" (Page 1 of 3, 12 total):',
            *(f"[{n}] ({day}) Coffee note {13 - n}" for n in range(1, 6)),  # equal rank: newest first
            "(Use page=2 for more)",
        ]
    )
    assert "(Use page=3 for more)" in await alice.ok("archival_memory_search", query="coffee", page=2)
    assert await alice.ok("archival_memory_search", query="coffee", page=3) == (
        f'Archival Memory Search for "coffee" (Page 3 of 3, 12 total):\n[11] ({day}) Coffee note 2\n'
        f"[12] ({day}) Coffee note 1"
    )
    assert await alice.refused("archival_memory_search", query="coffee", page=4) == (
        "page 4 is past the last page (3) of 12 results"
    )
    assert await alice.refused("archival_memory_search", query="coffee", page=0) == (
        "page 0 does not exist; pages start at 1"
    )
    assert await alice.ok("archival_memory_search", query="zebra") == 'Archival Memory Search for "zebra": no matches'


async def test_search_ranks_full_text_and_trigram_in_any_language(people: Any) -> None:
    alice = await people(ALICE)
    for text in (
        "Ich trinke morgens gern Kaffee mit Hafermilch",
        "Мой кот любит тёплое молоко",
        "Loves coffee with oat milk",
        "Allergic to peanuts",
    ):
        await alice.ok("archival_memory_insert", content=text)
    assert "Hafermilch" in await alice.ok("archival_memory_search", query="Kaffee")
    found = await alice.ok("archival_memory_search", query="молоко")
    assert "(Page 1 of 1, 1 total)" in found and "Мой кот любит тёплое молоко" in found
    typo = await alice.ok("archival_memory_search", query="cofee")  # no word matches: trigrams do
    assert "(Page 1 of 1, 1 total)" in typo and "Loves coffee with oat milk" in typo
    partial = await alice.ok("archival_memory_search", query="peanut")
    assert "Allergic to peanuts" in partial
    both = await alice.ok("archival_memory_search", query="oat milk peanuts")  # any word; more words rank higher
    assert both.splitlines()[1].endswith("Loves coffee with oat milk")


async def test_conversation_search_sees_own_messages_and_replies_only(pool: Pool, people: Any) -> None:
    alice = await people(ALICE)
    bob = await people(BOB)
    await turn(pool, ALICE, "remember the blue umbrella", "Noted: the blue umbrella is in the hall")
    await turn(pool, BOB, "my umbrella is green", "Green umbrella, got it")
    await turn(pool, ALICE, "the umbrella in the office too", "Sure", group=True)
    await turn(pool, BOB, "Alice's umbrella is ugly", "Ha", group=True)
    found = await alice.ok("conversation_search", query="umbrella")
    assert found.startswith('Conversation Search for "umbrella" (Page 1 of 1, 3 total):')
    assert "user: remember the blue umbrella" in found and "assistant: Noted: the blue umbrella" in found
    assert "user: the umbrella in the office too" in found  # her own line in the group
    assert "green" not in found.lower() and "ugly" not in found  # Bob's private chat and group lines
    bobs = await bob.ok("conversation_search", query="umbrella")
    assert "3 total" in bobs and "blue" not in bobs and "office" not in bobs
    assert await bob.ok("conversation_search", query="blue") == 'Conversation Search for "blue": no matches'
    assert "umbrella" in await alice.ok("conversation_search", query="umbrela")  # a typo still finds it
    assert "past the last page (1)" in await alice.refused("conversation_search", query="umbrella", page=2)


async def test_user_b_can_read_search_or_change_nothing_of_user_a(people: Any, pool: Pool) -> None:
    alice = await people(ALICE)
    bob = await people(BOB)
    await alice.ok("core_memory_append", block="human", content="Secret: likes jazz")
    await alice.ok("core_memory_append", block="diary", content="Private plans")
    await alice.ok("archival_memory_insert", content="Alice's bank is Sparkasse")
    assert await bob.ok("core_memory_read", block="human") == "[human] Core Memory (0 lines, 0/500 words):"
    assert "no block [diary]" in await bob.refused("core_memory_read", block="diary")
    assert await bob.refused("core_memory_delete", block="human", line_number=1) == "[human] has no lines"
    assert "diary" not in await bob.ok("core_memory_list_blocks")
    assert (await bob.ok("archival_memory_search", query="Sparkasse")).endswith("no matches")
    assert (await bob.ok("archival_memory_insert", content="Alice's bank is Sparkasse")).startswith("Stored")
    # there is no parameter that names a user; forged ones are refused, not used
    for name, args in (
        ("core_memory_read", {"block": "human", "user_id": alice.ctx.user.account_id}),
        ("core_memory_delete", {"block": "human", "line_number": 1, "user": ALICE}),
        ("archival_memory_search", {"query": "Sparkasse", "user_id": alice.ctx.user.account_id}),
        ("conversation_search", {"query": "hello", "chat_id": alice.ctx.chat.id}),
        ("core_memory_list_blocks", {"user_id": alice.ctx.user.account_id}),
    ):
        message = await bob.refused(name, **args)
        assert message.startswith("unknown arguments: ")
    for tool in bob.registry.offered(False):
        props = tool.schema["function"]["parameters"].get("properties", {})
        assert not {"user", "user_id", "id", "chat_id", "row_id"} & set(props), tool.name
    assert "1: Secret: likes jazz" in await alice.ok("core_memory_read", block="human")
    assert "Sparkasse" in await alice.ok("archival_memory_search", query="Sparkasse")


async def test_capability_queries_of_non_admins_see_only_their_own_memory(people: Any, pool: Pool) -> None:
    alice = await people(ALICE)
    bob = await people(BOB)
    await alice.ok("core_memory_append", block="human", content="Alice fact")
    await alice.ok("archival_memory_insert", content="Alice entry")
    await bob.ok("core_memory_append", block="human", content="Bob fact")
    await bob.ok("archival_memory_insert", content="Bob entry")
    a, b = alice.ctx.user, bob.ctx.user
    sql_blocks, sql_entries = "SELECT lines FROM memory_blocks", "SELECT content FROM archival_memory"
    assert await run_query(pool, b, False, 5, sql_blocks, (), personal=True) == [{"lines": ["Bob fact"]}]
    assert await run_query(pool, b, False, 5, sql_entries, (), personal=True) == [{"content": "Bob entry"}]
    forged = "SELECT a.content FROM (SELECT set_config('app.user_id', $1, true)) s, archival_memory a"
    assert await run_query(pool, b, False, 5, forged, (str(a.account_id),), personal=True) == []
    forged = "SELECT m.lines FROM (SELECT set_config('app.user_id', $1, true)) s, memory_blocks m"
    assert await run_query(pool, b, False, 5, forged, (str(a.account_id),), personal=True) == []
    direct = "SELECT content FROM archival_memory WHERE user_id = $1::bigint"
    assert await run_query(pool, b, False, 5, direct, (a.account_id,), personal=True) == []
    assert len(await run_query(pool, a, True, 5, sql_entries, ())) == 2  # admins see all (read only)


async def test_memory_command_functions(people: Any, pool: Pool) -> None:
    alice = await people(ALICE)
    bob = await people(BOB)
    await alice.ok("core_memory_append", block="human", content="Name: Alice")
    await alice.ok("core_memory_append", block="human", content="Lives in Porto")
    await alice.ok("core_memory_append", block="pets", content="Cat: Miso")
    await alice.ok("archival_memory_insert", content="one")
    await alice.ok("archival_memory_insert", content="two")
    await bob.ok("core_memory_append", block="human", content="Name: Bob")
    overview = await memory_overview(pool, alice.ctx.user.account_id)
    assert overview.text(500) == (
        "[human] Facts about the user (2 lines, 5/500 words)\n1: Name: Alice\n2: Lives in Porto\n"
        "[persona] How you behave with this user (0 lines, 0/500 words)\n"
        "[pets] Custom block (1 line, 2/500 words)\n1: Cat: Miso\n"
        "Archival memory: 2 entries"
    )
    assert await delete_memory_line(pool, alice.ctx.user.account_id, "human", 1) == "Name: Alice"
    with pytest.raises(Exception, match="valid lines: 1-1"):
        await delete_memory_line(pool, alice.ctx.user.account_id, "human", 2)
    await alice.ok("archival_memory_insert", content="Sparkasse account")
    await turn(pool, ALICE, "my umbrella is red")
    wiped = await wipe_memory(pool, alice.ctx.user.account_id)
    assert (wiped.lines, wiped.archival) == (2, 3)
    words = {
        r["word"]
        for r in await pool.fetch("SELECT word FROM memory_search_words WHERE user_id = $1", alice.ctx.user.account_id)
    }
    assert "sparkasse" not in words and "umbrella" in words  # archival words gone, the conversation's stay
    assert (await memory_overview(pool, alice.ctx.user.account_id)).text(500).endswith("Archival memory: 0 entries")
    assert "1: Name: Bob" in (await memory_overview(pool, bob.ctx.user.account_id)).text(500)  # Bob's memory stays


def _topic(text: str) -> list[float]:
    """Fake embeddings with meaning: drinks point one way, everything else another."""
    vec = [0.0] * EMBEDDING_DIMENSIONS
    vec[0 if any(w in text.lower() for w in ("espresso", "beverage")) else 1] = 1.0
    return vec


async def test_embeddings_join_the_ranking_and_failures_lose_nothing(
    people: Any, pool: Pool, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    client = openai.AsyncOpenAI(base_url=fake_llm.base_url, api_key="test", max_retries=0)
    try:
        assert await prepare_embeddings(pool)
        assert await prepare_embeddings(pool)  # idempotent at every start
        fake_llm.embed = _topic
        alice = await people(ALICE, embedder=openai_embedder(client, "fake-embed"))
        plain = await people(BOB)
        await alice.ok("archival_memory_insert", content="I adore a double espresso")
        await alice.ok("archival_memory_insert", content="The car is blue")
        assert await pool.fetchval("SELECT count(*) FROM archival_memory WHERE embedding IS NOT NULL") == 2
        found = await alice.ok("archival_memory_search", query="hot beverage")  # no word in common
        assert "(Page 1 of 1, 1 total)" in found and "double espresso" in found
        assert fake_llm.embedding_inputs[-1] == "hot beverage"
        await plain.ok("archival_memory_insert", content="I adore a double espresso")
        assert (await plain.ok("archival_memory_search", query="hot beverage")).endswith("no matches")

        fake_llm.embeddings_fail = True
        stored = await alice.ok("archival_memory_insert", content="Espresso beans from Lisbon")
        assert stored.startswith("Stored in archival memory (#")
        row = await pool.fetchrow("SELECT embedding IS NULL AS missing FROM archival_memory WHERE content LIKE 'Esp%'")
        assert row is not None and row["missing"]
        assert "Lisbon" in await alice.ok("archival_memory_search", query="lisbon")  # text search still runs
        assert "stored without an embedding" in caplog.text and "without embeddings this time" in caplog.text
    finally:
        await client.close()


async def test_embeddings_off_without_pgvector_rights_and_inserts_still_stored(
    pg_server: str, template_dsn: str, fake_llm: FakeOpenAI, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    admin = await asyncpg.connect(pg_server)
    login, dbname = f"mem_plain_{os.getpid()}", f"mem_plain_db_{os.getpid()}"
    client = openai.AsyncOpenAI(base_url=fake_llm.base_url, api_key="test", max_retries=0)
    try:
        await admin.execute(f"CREATE ROLE {login} LOGIN")  # may not create the untrusted vector extension
        await admin.execute(f"CREATE DATABASE {dbname} OWNER {login}")
        parts = urlsplit(with_database(pg_server, dbname))
        pool = await create_pool(urlunsplit(parts._replace(netloc=f"{login}@{parts.netloc.rsplit('@', 1)[-1]}")))
        try:
            assert "006_memory.sql" in await migrate(pool)  # pg_trgm and btree_gin are trusted
            assert not await prepare_embeddings(pool)
            assert "pgvector is unavailable" in caplog.text
            user = await turn(pool, ALICE, "hi")
            alice = Person(pool, user, clock, ToolRegistry(memory_tools(500, openai_embedder(client, "m"))))
            assert (await alice.ok("archival_memory_insert", content="kept anyway")).startswith("Stored")
            assert "kept anyway" in await alice.ok("archival_memory_search", query="kept")
        finally:
            await pool.close()
    finally:
        await client.close()
        await admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        await admin.execute(f"DROP ROLE IF EXISTS {login}")
        await admin.close()


def test_tool_schemas_are_small() -> None:
    tools = memory_tools(500)
    assert [t.name for t in tools] == [
        "core_memory_read",
        "core_memory_append",
        "core_memory_replace",
        "core_memory_delete",
        "core_memory_list_blocks",
        "archival_memory_insert",
        "archival_memory_search",
        "conversation_search",
    ]
    chars = len(json.dumps([t.schema for t in tools]))
    assert chars // 4 <= 490, chars  # what the memory tools add to every private prompt (tokens ≈ chars / 4)


def test_memory_settings() -> None:
    from core.settings import SettingsError, load_settings

    assert load_settings().MEMORY_BLOCK_WORDS == 500
    assert load_settings(EMBEDDING_MODEL="  ").EMBEDDING_MODEL is None  # empty, as in .env.example: off
    assert load_settings(EMBEDDING_MODEL="text-embedding-3-small").EMBEDDING_MODEL == "text-embedding-3-small"
    with pytest.raises(SettingsError, match="MEMORY_BLOCK_WORDS"):
        load_settings(MEMORY_BLOCK_WORDS=5)


# ---- memory inside every turn (through Core: the real context query, prompt and registry) -----------------

ALICE_BLOCKS = (
    "<core_memory>\n"
    "[human] Facts about the user (2 lines, 5/500 words)\n"
    "1: Name: Alice\n"
    "2: Works at: Google\n"
    "[persona] How you behave with this user (0 lines, 0/500 words)\n"
    "</core_memory>"
)
MEMORY_TOOLS = {
    "core_memory_read",
    "core_memory_append",
    "core_memory_replace",
    "core_memory_delete",
    "core_memory_list_blocks",
    "archival_memory_insert",
    "archival_memory_search",
    "conversation_search",
}


def _system(request: dict[str, Any]) -> str:
    """The system prompt of an LLM request."""
    content: str = request["messages"][0]["content"]
    return content


async def _remember_alice(core: Core, fake_llm: FakeOpenAI) -> None:
    """Alice introduces herself in her private chat; the model stores two lines in [human]."""
    fake_llm.script(
        Reply(
            tool_calls=[
                ("core_memory_append", {"block": "human", "content": "Name: Alice"}),
                ("core_memory_append", {"block": "human", "content": "Works at: Google"}),
            ]
        ),
        Reply(text="Nice to meet you, Alice."),
    )
    a = answer(await run(core, incoming("My name is Alice and I work at Google", user=ALICE, name="Alice")))
    assert [s.ok for s in a.steps] == [True, True]


async def test_appended_lines_are_in_every_later_prompt_and_after_a_restart(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    """ "My name is Alice and I work at Google" → two appends → the next turns' prompts carry the block."""
    core = make_core(ALLOWED_USERS="*")  # not an admin: memory is for every allowed user
    await _remember_alice(core, fake_llm)
    first = fake_llm.requests[0]
    assert MEMORY_TOOLS <= set(tool_names(first)) and "execute_sql" not in tool_names(first)
    assert "[human] Facts about the user (0 lines, 0/500 words)" in _system(first)
    fake_llm.script(Reply(text="Hi Alice"))
    await run(core, incoming("hi", user=ALICE, name="Alice"))
    assert ALICE_BLOCKS in _system(fake_llm.requests[-1])
    restarted = make_core(ALLOWED_USERS="*")  # a new Core on the same database
    fake_llm.script(Reply(text="Hi again"))
    await run(restarted, incoming("hi again", user=ALICE, name="Alice"))
    assert ALICE_BLOCKS in _system(fake_llm.requests[-1])


async def test_group_prompt_has_no_personal_memory_and_memory_tools_are_not_offered(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    """In a group: no <core_memory>, one line about private memory, no memory tool; a forged call is unknown."""
    core = make_core(ALLOWED_USERS="*")
    await _remember_alice(core, fake_llm)
    before = len(fake_llm.requests)
    fake_llm.script(
        Reply(
            tool_calls=[
                ("core_memory_read", {"block": "human"}),
                ("core_memory_append", {"block": "human", "content": "Likes: group secrets"}),
            ]
        ),
        Reply(text="ok"),
    )
    a = answer(await run(core, incoming("what do you know about me?", user=ALICE, chat="-500", kind="group")))
    group = fake_llm.requests[before]
    assert "<core_memory>" not in _system(group) and "Google" not in _system(group)
    assert GROUP_MEMORY_NOTE in _system(group)
    assert not MEMORY_TOOLS & set(tool_names(group))
    refused = tool_messages(fake_llm.requests[before + 1])
    assert [e["error"]["code"] for e in refused] == ["unknown_function", "unknown_function"]
    assert "there is no tool named 'core_memory_read'" in refused[0]["error"]["message"]
    assert "core_memory" not in refused[0]["error"]["message"].split("available:")[1]
    assert [s.ok for s in a.steps] == [False, False]
    lines = await pool.fetchval("SELECT lines FROM memory_blocks WHERE name = 'human'")
    assert lines == ["Name: Alice", "Works at: Google"]


async def test_an_agent_job_sees_its_owners_memory(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    """A scheduled agent turn (job message id) in the owner's private chat gets their blocks and the tools."""
    core = make_core(ALLOWED_USERS="*")
    await _remember_alice(core, fake_llm)
    fake_llm.script(Reply(text="Good morning, Alice"))
    job = incoming("[scheduled job: greet] greet me", user=ALICE, name="Alice", message_id=f"{JOB_MESSAGE_PREFIX}7:x")
    assert await core.answer_text(job) == "Good morning, Alice"
    request = fake_llm.requests[-1]
    assert ALICE_BLOCKS in _system(request)
    assert MEMORY_TOOLS <= set(tool_names(request))


async def test_prompt_warns_while_a_block_is_80_percent_full(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    """At ≥ 80 % of MEMORY_BLOCK_WORDS the prompt asks to consolidate; below it, it does not."""
    core = make_core(ALLOWED_USERS="*", MEMORY_BLOCK_WORDS=10)
    fake_llm.script(
        Reply(tool_calls=[("core_memory_append", {"block": "human", "content": "one two three four five six seven"})]),
        Reply(text="noted"),
        Reply(text="hi"),
    )
    await run(core, incoming("remember this", user=ALICE))
    await run(core, incoming("hi", user=ALICE))
    assert "Warning" not in _system(fake_llm.requests[-1])
    assert "[human] Facts about the user (1 line, 7/10 words)" in _system(fake_llm.requests[-1])
    fake_llm.script(
        Reply(tool_calls=[("core_memory_append", {"block": "human", "content": "eight"})]),
        Reply(text="noted"),
        Reply(text="hi"),
    )
    await run(core, incoming("and this", user=ALICE))
    await run(core, incoming("hi", user=ALICE))
    assert (
        "[human] Facts about the user (2 lines, 8/10 words)\n1: one two three four five six seven\n2: eight\n"
        "Warning: [human] is 80% full (8/10 words): consolidate its lines or move detail to archival memory.\n"
        "[persona]"
    ) in _system(fake_llm.requests[-1])


async def test_start_up_wires_embeddings_only_when_an_embedding_model_is_set(
    make_settings: Any, make_llm: Any, pool: Pool, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    """core.startup.embeddings: none without EMBEDDING_MODEL; with it, a turn's archival insert gets a vector."""
    plain = make_settings()
    assert await embeddings(plain, pool, make_llm(plain)) is None
    settings = make_settings(EMBEDDING_MODEL="fake-embed")
    embedder = await embeddings(settings, pool, make_llm(settings))
    assert embedder is not None and embedder.model == "fake-embed"
    core = Core(settings, pool, make_llm(settings), clock=clock, embedder=embedder)
    fake_llm.script(
        Reply(tool_calls=[("archival_memory_insert", {"content": "Alice's dentist is Dr Who"})]), Reply(text="ok")
    )
    await run(core, incoming("remember my dentist", user=ALICE))
    assert fake_llm.embedding_inputs == ["Alice's dentist is Dr Who"]
    assert await pool.fetchval("SELECT embedding_model FROM archival_memory") == "fake-embed"
