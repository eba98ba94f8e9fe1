"""Discord messages go through the inbox: a process that dies (or is drained) mid-turn leaves the message to another
one, which answers it once by ids; a message seen twice is answered once; the slash commands follow the catalogue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.discord.adapter import DiscordAdapter
from core import COMMANDS, CUT_SHORT
from core.front_door import Core
from core.inbox import Pace
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import die
from tests.test_discord import Bot, bot
from tests.test_inbox import Hold, echo

__all__ = ["bot"]  # the fixture, imported for pytest

ALICE = 2001
OPTION_TYPES = {"text": 3, "integer": 4, "flag": 5}  # Discord's application command option types


@dataclass
class Proc:
    """One bot process: a core (with its inbox) and its Discord adapter."""

    core: Core
    adapter: DiscordAdapter


StartProc = Callable[..., Awaitable[Proc]]


@pytest.fixture
async def start_proc(dc: FakeDiscord, make_core: MakeCore) -> AsyncIterator[StartProc]:
    """Start processes on one database and one fake Discord (stopped at the end); `lease_s` shortens the lease."""
    started: list[Proc] = []

    async def start(lease_s: float = 30.0) -> Proc:
        core = make_core(
            DISCORD_BOT_TOKEN=dc.token,
            DISCORD_API_BASE_URL=dc.api_base,
            DISCORD_GATEWAY_URL=dc.gateway_url,
            ALLOWED_USERS="*",
            inbox_pace=Pace(lease_s=lease_s, poll_s=0.05),
        )
        adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
        await adapter.start()  # a later process's connection replaces the one before (one session per shard)
        started.append(Proc(core, adapter))
        return started[-1]

    try:
        yield start
    finally:
        for proc in started:
            await proc.adapter.stop()


async def caught_mid_turn(start_proc: StartProc, dc: FakeDiscord, fake_llm: FakeOpenAI, **kw: Any) -> tuple[Proc, Hold]:
    """A process whose turn on a server message waits for the model (until the Hold is released)."""
    fake_llm.default = hold = Hold()
    proc = await start_proc(**kw)
    await dc.post_message(dc.user(ALICE, "Alice"), "are you there?", mention_bot=True)
    await asyncio.wait_for(hold.asked.wait(), 5)
    return proc, hold


async def inbox_done(pool: Pool) -> None:
    """Wait until the one inbox row is marked done (at most 5 s)."""
    for _ in range(250):
        if await pool.fetchval("SELECT done_at IS NOT NULL FROM inbox"):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the inbox row was not marked done within 5 s")


async def answered_once(dc: FakeDiscord, pool: Pool, hold: Hold, attempts: int) -> None:
    """One answer, by the second process, replying to the message by its id; the inbox row done."""
    [sent] = await dc.wait_sent(1)
    posted = dc.messages_in(dc.channel_id)[0]
    assert sent["content"] == "re: Alice: are you there?" and sent["message_reference"]["message_id"] == posted["id"]
    assert sent["allowed_mentions"] == {"parse": []}
    hold.release.set()  # the first process's model call ends: nobody is there to send its answer
    await inbox_done(pool)
    await asyncio.sleep(0.2)  # room for a wrong second answer
    assert [m["content"] for m in dc.sent] == ["re: Alice: are you there?"]
    assert await pool.fetchval("SELECT attempts FROM inbox") == attempts
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE role = 'user'") == 1
    assert [r["status"] for r in await pool.fetch("SELECT status FROM turns")] == ["done"]


async def test_a_process_that_dies_mid_turn_leaves_the_message_to_another_that_answers_once(
    start_proc: StartProc, dc: FakeDiscord, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    first, hold = await caught_mid_turn(start_proc, dc, fake_llm, lease_s=0.5)
    await die(first.core)
    assert dc.sent == []
    await start_proc(lease_s=0.5)  # never saw the message: takes it from the inbox once the lease ran out
    await answered_once(dc, pool, hold, attempts=2)


async def test_a_drained_process_hands_its_message_back_without_a_cut_short_note(
    start_proc: StartProc, dc: FakeDiscord, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    first, hold = await caught_mid_turn(start_proc, dc, fake_llm)  # the default 30 s lease: a hand-back is quick
    assert await first.core.drain(0) == 1  # SIGTERM with the grace over: cut and handed back
    await first.adapter.stop()
    await start_proc()  # the next start (or another process) answers it
    await answered_once(dc, pool, hold, attempts=2)
    assert CUT_SHORT not in [m["content"] for m in dc.sent]


async def test_an_answer_stored_before_the_process_died_is_sent_not_recomputed(
    start_proc: StartProc, dc: FakeDiscord, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo()
    first = await start_proc(lease_s=0.5)
    dc.rate_limit_next("/messages", retry_after=60)  # the answer is stored, its send waits out a 429
    await dc.post_message(dc.user(ALICE, "Alice"), "remember me", dm=True)
    await dc.wait_for(lambda: bool(dc.rate_limited), 5, what="the rate-limited send")
    await die(first.core)
    await start_proc(lease_s=0.5)
    [sent] = await dc.wait_sent(1)
    assert sent["content"] == "re: remember me" and not sent.get("message_reference")
    assert len(fake_llm.requests) == 1  # the stored answer was sent; the model was not asked again


async def test_a_message_seen_twice_is_answered_once(bot: Bot) -> None:
    bot.llm.script(Reply(text="once"), Reply(text="twice"))
    message = await bot.dc.post_message(bot.alice, "hello", mention_bot=True)
    await bot.dc.wait_sent(1)
    await bot.dc.dispatch("MESSAGE_CREATE", message)  # e.g. a second session of the bot receiving it too
    await asyncio.sleep(0.2)  # room for a wrong second answer
    assert [m["content"] for m in bot.dc.sent] == ["once"] and len(bot.llm.requests) == 1


async def test_slash_commands_follow_the_catalogue(bot: Bot) -> None:
    synced = {c["name"]: c for c in bot.dc.commands}
    assert set(synced) == {"ask"} | {c.name for c in COMMANDS}
    for command in COMMANDS:
        slash = synced[command.name]
        assert slash["description"] == command.summary[0].upper() + command.summary[1:]
        options = [
            (
                o["name"],
                o["description"],
                o["type"],
                o.get("required", False),
                [c["value"] for c in o.get("choices", [])],
            )
            for o in slash.get("options") or []
        ]
        assert options == [
            (o.name, o.description, OPTION_TYPES[o.kind], False, list(o.choices)) for o in command.options
        ]
    for command in COMMANDS:  # personal answers are ephemeral, the others are not
        it = await (await bot.dc.slash(command.name, None, bot.bob)).wait_done()
        assert it.ephemeral == command.private, command.name
