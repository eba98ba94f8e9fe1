"""Issue 19, memory: capability queries see no memory outside personal turns; archival numbers per user, its cap,
core_memory_replace without duplicates, and answers that stay true when a connection drops after a commit."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest

from core.capabilities.runtime import run_query
from core.memory.tools import memory_tools
from core.storage.db import Pool, create_pool
from core.storage.migrations import SQL_DIR, migrate
from core.tools.framework import ToolContext, ToolRegistry
from tests.conftest import FakeClock, MakeCore, with_database
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import answer, incoming, run, tool_messages
from tests.test_capabilities import MEMBER, admin_core, write
from tests.test_memory import ALICE, BOB, Person, turn


@pytest.fixture
def people(pool: Pool, clock: FakeClock) -> Any:
    """A factory: Person for a platform user id (private chat), with an archival cap."""

    async def make(uid: str, entries: int = 5000) -> Person:
        user = await turn(pool, uid, "hello")
        return Person(pool, user, clock, ToolRegistry(memory_tools(500, archival_max_entries=entries)))

    return make


# ---- 2. a capability called in a group sees no memory --------------------------------------------------------------

MEMORY_CAP = """
async def my_memory(params, ctx):
    forge = "SELECT set_config('app.personal', 'on', true) AS p" if params.get("forge") else "SELECT 1 AS p"
    blocks = await ctx.query(
        "SELECT b.lines FROM (" + forge + ") f, memory_blocks b WHERE b.user_id = capability_user_id()"
    )
    entries = await ctx.query("SELECT a.content FROM (" + forge + ") f, archival_memory a ORDER BY a.id")
    return {"blocks": [r["lines"] for r in blocks], "entries": [r["content"] for r in entries]}
"""
GROUP = "-900"
_databases = itertools.count()


async def _capability(
    core: Any, fake: FakeOpenAI, args: dict[str, Any], *, kind: str, text: str = "what do you know?"
) -> dict[str, Any]:
    """The member calls my_memory in their private chat or in the group; the envelope the model got back."""
    fake.script(Reply(tool_calls=[("my_memory", args)]), Reply(text="ok"))
    chat = GROUP if kind == "group" else MEMBER
    answer(await run(core, incoming(text, user=MEMBER, name="Max", chat=chat, kind=kind)))
    envelope: dict[str, Any] = tool_messages(fake.requests[-1])[-1]
    return envelope


async def test_a_capability_called_in_a_group_returns_no_private_memory(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = admin_core(make_core)
    assert (await write(core, fake_llm, "my_memory", MEMORY_CAP, {"type": "object"}))["ok"]
    fake_llm.script(
        Reply(
            tool_calls=[
                ("core_memory_append", {"block": "human", "content": "Max's PIN is 4711"}),
                ("archival_memory_insert", {"content": "Max's diagnosis: private"}),
            ]
        ),
        Reply(text="noted"),
    )
    answer(await run(core, incoming("remember this", user=MEMBER, name="Max")))
    private = await _capability(core, fake_llm, {}, kind="private")
    assert private["result"] == {"blocks": [["Max's PIN is 4711"]], "entries": ["Max's diagnosis: private"]}
    for args in ({}, {"forge": True}):  # setting the flag itself does not sign it
        group = await _capability(core, fake_llm, args, kind="group")
        assert group == {"ok": True, "result": {"blocks": [], "entries": []}}, args
    assert (await _capability(core, fake_llm, {}, kind="private"))["result"] == private["result"]  # and back again


async def test_a_forged_personal_signature_is_refused(people: Any, pool: Pool) -> None:
    bob = await people(BOB)
    await bob.ok("archival_memory_insert", content="Bob entry")
    b = bob.ctx.user
    copy_user_sig = (
        "SELECT a.content FROM (SELECT set_config('app.personal', 'on', true),"
        " set_config('app.personal_sig', current_setting('app.user_sig'), true)) s, archival_memory a"
    )
    assert await run_query(pool, b, False, 5, copy_user_sig, ()) == []
    assert await run_query(pool, b, False, 5, "SELECT content FROM archival_memory", ()) == []
    assert await run_query(pool, b, False, 5, "SELECT content FROM archival_memory", (), personal=True) == [
        {"content": "Bob entry"}
    ]


# ---- 14. archival numbers per user ---------------------------------------------------------------------------------


async def test_archival_numbers_count_per_user(people: Any) -> None:
    alice, bob = await people(ALICE), await people(BOB)
    assert await alice.ok("archival_memory_insert", content="a one") == "Stored in archival memory (#1)"
    assert await alice.ok("archival_memory_insert", content="a two") == "Stored in archival memory (#2)"
    assert await bob.ok("archival_memory_insert", content="b one") == "Stored in archival memory (#1)"
    assert await alice.ok("archival_memory_insert", content="a one") == "Already in archival memory (#1, no change)"
    assert await bob.ok("archival_memory_insert", content="b two") == "Stored in archival memory (#2)"


async def test_existing_entries_are_numbered_per_user_by_the_migration(pg_server: str, tmp_path: Path) -> None:
    before = tmp_path / "sql"
    before.mkdir()
    for path in SQL_DIR.glob("*.sql"):
        if int(path.name[:3]) < 15:
            shutil.copy(path, before / path.name)
    admin = await asyncpg.connect(pg_server)
    name = f"numbering_{os.getpid()}_{next(_databases)}"
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        pool = await create_pool(with_database(pg_server, name), min_size=1, max_size=2)
        try:
            await migrate(pool, before)
            users = [
                await pool.fetchval(
                    "INSERT INTO users (platform, platform_user_id, display_name) VALUES ('telegram', $1, $1)"
                    " RETURNING id",
                    uid,
                )
                for uid in (ALICE, BOB)
            ]
            for uid, text in ((0, "a1"), (1, "b1"), (0, "a2"), (1, "b2"), (0, "a3")):
                await pool.execute(
                    "INSERT INTO archival_memory (user_id, content, sha256)"
                    " VALUES ($1, $2, sha256(convert_to($2, 'UTF8')))",
                    users[uid],
                    text,
                )
            assert "015_personal_memory.sql" in await migrate(pool)
            rows = await pool.fetch("SELECT content, number FROM archival_memory ORDER BY id")
            assert [(r["content"], r["number"]) for r in rows] == [
                ("a1", 1),
                ("b1", 1),
                ("a2", 2),
                ("b2", 2),
                ("a3", 3),
            ]
        finally:
            await pool.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


# ---- 11. the per-user cap of archival entries ------------------------------------------------------------------------


async def test_archival_entries_stop_at_the_cap_with_a_clear_refusal(people: Any, pool: Pool) -> None:
    alice, bob = await people(ALICE, entries=3), await people(BOB, entries=3)
    for i in range(3):
        await alice.ok("archival_memory_insert", content=f"fact {i}")
    env = await alice.call("archival_memory_insert", content="one too many")
    assert env == {
        "ok": False,
        "error": {
            "code": "tool_error",
            "message": "archival memory is full: 3 of 3 entries, the most one person may keep; nothing was stored"
            " (/memory shows and erases it)",
        },
    }
    assert await alice.ok("archival_memory_insert", content="fact 1") == "Already in archival memory (#2, no change)"
    assert await bob.ok("archival_memory_insert", content="bob's own") == "Stored in archival memory (#1)"
    # at once, from two chats: the cap and the numbers hold
    results = await asyncio.gather(*(bob.call("archival_memory_insert", content=f"race {i}") for i in range(8)))
    assert sum(r["ok"] for r in results) == 2
    numbers = await pool.fetchval(
        "SELECT array_agg(number ORDER BY number) FROM archival_memory WHERE user_id = $1", bob.ctx.user.id
    )
    assert numbers == [1, 2, 3]


async def test_the_cap_comes_from_the_setting(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core(ARCHIVAL_MAX_ENTRIES=1)
    fake_llm.script(
        Reply(
            tool_calls=[("archival_memory_insert", {"content": "one"}), ("archival_memory_insert", {"content": "two"})]
        ),
        Reply(text="ok"),
    )
    answer(await run(core, incoming("remember both")))
    first, second = tool_messages(fake_llm.requests[-1])
    assert first == {"ok": True, "result": "Stored in archival memory (#1)"}
    assert not second["ok"] and "full: 1 of 1 entries" in second["error"]["message"]


# ---- 14. core_memory_replace never makes two equal lines -------------------------------------------------------------


async def test_replace_with_the_text_of_another_line_leaves_one_line(people: Any, pool: Pool) -> None:
    alice = await people(ALICE)
    for line in ("Lives in Porto", "Likes tea", "Works at Acme"):
        await alice.ok("core_memory_append", block="human", content=line)
    assert await alice.ok("core_memory_replace", block="human", line_number=1, new_content="Works at Acme") == (
        '"Works at Acme" is already line 3 of [human], so line 1 ("Lives in Porto") was removed instead of repeating'
        " it; lines below it moved up (5/500 words)"
    )
    assert await pool.fetchval("SELECT lines FROM memory_blocks WHERE name = 'human'") == ["Likes tea", "Works at Acme"]
    assert await alice.ok("core_memory_replace", block="human", line_number=2, new_content=" Works at Acme ") == (
        'Line 2 of [human] already reads "Works at Acme" (no change)'
    )
    assert await pool.fetchval("SELECT lines FROM memory_blocks WHERE name = 'human'") == ["Likes tea", "Works at Acme"]


# ---- 14. a write whose commit landed but whose answer was lost -------------------------------------------------------


class LosesAnswers:
    """The test's pool, except that an armed call's answer is lost after its commit, as when the connection drops
    between the server's commit and its reply reaching the bot."""

    def __init__(self, pool: Pool) -> None:
        """Nothing armed yet."""
        self.pool = pool
        self.armed = 0

    def __getattr__(self, name: str) -> Any:
        """Everything else is the real pool's."""
        return getattr(self.pool, name)

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        """Run the statement (committed), then maybe lose the answer."""
        row = await self.pool.fetchrow(sql, *args)
        self._lose()
        return row

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        """A real connection; after the caller's transaction committed, maybe lose the answer."""
        async with self.pool.acquire() as conn:
            yield conn
        self._lose()

    def _lose(self) -> None:
        """Raise the error asyncpg raises for a dropped connection, once per armed call."""
        if self.armed:
            self.armed -= 1
            raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")


@pytest.fixture
async def lossy(pool: Pool, clock: FakeClock) -> Person:
    """Alice, whose tool calls run on a pool that can lose an answer."""
    user = await turn(pool, ALICE, "hello")
    person = Person(pool, user, clock, ToolRegistry(memory_tools(500)))
    person.ctx = ToolContext(cast(Pool, LosesAnswers(pool)), user, person.ctx.chat, False, clock)
    return person


def _arm(person: Person) -> None:
    """Lose the answer of the next database call."""
    cast(LosesAnswers, person.ctx.pool).armed = 1


async def test_an_insert_retried_after_its_answer_was_lost_says_stored(lossy: Person, pool: Pool) -> None:
    await lossy.ok("archival_memory_insert", content="first")
    _arm(lossy)
    assert await lossy.ok("archival_memory_insert", content="landed once") == "Stored in archival memory (#2)"
    assert await pool.fetchval("SELECT count(*) FROM archival_memory") == 2
    _arm(lossy)
    assert await lossy.ok("archival_memory_insert", content="landed once") == (
        "Already in archival memory (#2, no change)"  # another call of the same text: it was there before it
    )


@pytest.mark.parametrize(
    ("tool", "args", "said", "lines"),
    [
        ("core_memory_append", {"content": "C"}, 'Appended to [human] at line 3: "C" (3/500 words)', ["A", "B", "C"]),
        (
            "core_memory_append",
            {"content": "B"},
            'Line already exists in [human] at line 2: "B" (no change)',
            ["A", "B"],
        ),
        (
            "core_memory_replace",
            {"line_number": 1, "new_content": "B"},
            '"B" is already line 2 of [human], so line 1'
            ' ("A") was removed instead of repeating it; lines below it moved up (1/500 words)',
            ["B"],
        ),
        (
            "core_memory_replace",
            {"line_number": 1, "new_content": "X"},
            'Replaced line 1 in [human]: "A" → "X" (2/500 words)',
            ["X", "B"],
        ),
    ],
)
async def test_a_block_write_retried_after_its_answer_was_lost_answers_as_done_once(
    lossy: Person, pool: Pool, tool: str, args: dict[str, Any], said: str, lines: list[str]
) -> None:
    for line in ("A", "B"):
        await lossy.ok("core_memory_append", block="human", content=line)
    _arm(lossy)
    assert await lossy.ok(tool, block="human", **args) == said
    assert await pool.fetchval("SELECT lines FROM memory_blocks WHERE name = 'human'") == lines
