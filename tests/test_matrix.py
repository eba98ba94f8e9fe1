"""The Matrix adapter (in progress) on the fake homeserver with the real mautrix: a direct chat answered through the
inbox; a restart syncs on from the kept next_batch (nothing replayed, nothing skipped), a kill -9 mid-turn or a dropped
sync loses nothing; group rooms answer mentions and replies; a stranger's invitation is declined and an encrypted room
refused with one line; a password logs in once; a reminder sent twice is one message."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.matrix import config_problem
from adapters.matrix.adapter import ENCRYPTED_REFUSAL, MatrixAdapter
from core import ReminderMessage, StartupError
from core.inbox import Pace
from core.settings import load_settings
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_matrix import BOT, BOT_NAME, PASSWORD, SERVER, TOKEN, FakeMatrix
from tests.fake_openai import FakeOpenAI
from tests.helpers import WAIT_S, die
from tests.test_inbox import Hold

ALICE, MALLORY = f"@alice:{SERVER}", f"@mallory:{SERVER}"
Start = Callable[..., Awaitable[MatrixAdapter]]


@pytest.fixture
async def mx() -> AsyncIterator[FakeMatrix]:
    """A fake homeserver with Alice (allowed) and Mallory (not)."""
    async with FakeMatrix() as fake:
        fake.person(ALICE, "Alice")
        fake.person(MALLORY, "Mallory")
        yield fake


@pytest.fixture
async def start(mx: FakeMatrix, make_core: MakeCore) -> AsyncIterator[Start]:
    """Start adapters (each on its own core, one database) against the fake; stopped at the end."""
    async with AsyncExitStack() as stack:

        async def started(lease_s: float = 30.0, **settings: Any) -> MatrixAdapter:
            given = {"MATRIX_HOMESERVER": mx.origin, "MATRIX_USER_ID": BOT, "MATRIX_ACCESS_TOKEN": TOKEN}
            given |= {"ALLOWED_USERS": f"matrix:{ALICE}", **settings}
            core = make_core(inbox_pace=Pace(lease_s=lease_s, poll_s=0.05), **given)
            adapter = MatrixAdapter(core, core.settings)
            await adapter.start()
            stack.push_async_callback(adapter.stop)
            return adapter

        yield started


def answers(mx: FakeMatrix, room_id: str) -> list[str]:
    """The bot's messages in a room, in order."""
    return [e["content"]["body"] for e in mx.sent if e["room_id"] == room_id and e["type"] == "m.room.message"]


async def test_a_direct_chat_is_joined_and_answered_once_pinging_nobody(
    start: Start, mx: FakeMatrix, pool: Pool
) -> None:
    await start()
    room = mx.direct(ALICE)
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining the direct chat")
    mx.say(room, ALICE, "hello")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the answer")
    await mx.wait_for(lambda: mx.typing[-1:] == [(room.id, False)], WAIT_S, what="typing… ended")
    assert (room.id, True) in mx.typing  # "typing…" while the turn ran
    [answer] = [e for e in mx.sent if e["type"] == "m.room.message"]
    assert answer["sender"] == BOT and answer["content"]["m.mentions"] == {} and answer["content"]["body"]
    assert await pool.fetchval("SELECT count(*) FROM inbox") == 1


async def test_a_restart_syncs_on_from_the_kept_token(start: Start, mx: FakeMatrix) -> None:
    first = await start()
    room = mx.direct(ALICE)
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining")
    mx.say(room, ALICE, "one")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the first answer")
    await first.stop()
    mx.say(room, ALICE, "two")  # said while the bot was away
    await start()
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 2, WAIT_S, what="the second answer")
    since = [q.get("since") for q in mx.syncs]
    assert since[0] is None and None not in since[1:]  # only the very first sync started from nothing
    mx.say(room, ALICE, "three")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 3, WAIT_S, what="the third answer")


async def test_in_a_group_room_a_mention_or_a_reply_to_the_bot_is_answered_and_a_stranger_refused(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI
) -> None:
    await start()
    room = mx.room(ALICE)
    mx.join(room, MALLORY)
    mx.invite(room, ALICE)
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining the group room")
    mx.say(room, ALICE, "just chatting")
    mx.say(room, ALICE, "what time is it?", mentions=[BOT])
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the mention's answer")
    mx.say(room, ALICE, f"{BOT_NAME}, and now?")  # the display name, as people write it
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 2, WAIT_S, what="the display name's answer")
    bots = [e["event_id"] for e in mx.sent]
    mx.say(room, ALICE, "why?", reply_to=bots[-1])  # a reply to the bot is for it
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 3, WAIT_S, what="the reply's answer")
    mx.say(room, MALLORY, "me too", mentions=[BOT])
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 4, WAIT_S, what="the stranger's refusal")
    assert MALLORY in answers(mx, room.id)[3]  # refused with their id
    assert "me too" not in json.dumps(fake_llm.requests)  # the stranger never reached the model


async def test_kill_9_mid_turn_and_a_stale_token_answer_once(
    start: Start, mx: FakeMatrix, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = hold = Hold()
    first = await start(lease_s=0.5)
    room = mx.direct(ALICE)
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining")
    mx.say(room, ALICE, "are you there?")
    await asyncio.wait_for(hold.asked.wait(), WAIT_S)
    await die(first.core)  # kill -9 mid-turn: the event stays in the inbox, its lease runs out
    assert first._sync is not None
    first._sync.cancel()  # the process's sync loop dies with it
    # and as if it had died before keeping the token after the event: the next process syncs it again
    await pool.execute("UPDATE platform_state SET value = 's1' WHERE key LIKE '%:next_batch'")
    await start(lease_s=0.5)
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the second process's answer")
    hold.release.set()  # the first process's model call ends: nobody is there to send its answer
    mx.say(room, ALICE, "still there?")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 2, WAIT_S, what="the next answer")
    assert await pool.fetchval("SELECT count(*) FROM inbox") == 2


async def test_a_dropped_sync_loses_nothing(start: Start, mx: FakeMatrix) -> None:
    await start()
    room = mx.direct(ALICE)
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining")
    mx.drop_syncs = 2  # the answers carrying the message are lost on the way (aiohttp may try a GET twice)
    mx.say(room, ALICE, "hello")
    await mx.wait_for(lambda: len(answers(mx, room.id)) == 1, WAIT_S, what="the answer after the dropped syncs")
    assert mx.drop_syncs == 0


async def test_a_strangers_invitation_is_declined_and_an_encrypted_room_refused(start: Start, mx: FakeMatrix) -> None:
    await start()
    theirs = mx.direct(MALLORY)
    locked = mx.room(ALICE, encrypted=True)
    mx.invite(locked, ALICE)
    await mx.wait_for(
        lambda: (
            BOT not in theirs.invited and answers(mx, locked.id) == [ENCRYPTED_REFUSAL] and BOT not in locked.members
        ),
        WAIT_S,
        what="the declined invitation and the refused room",
    )
    assert BOT not in theirs.members
    chat = mx.direct(ALICE)
    await mx.wait_for(lambda: BOT in chat.members, WAIT_S, what="the bot joining")
    mx.encrypt(chat, ALICE)  # encryption turned on later
    await mx.wait_for(
        lambda: answers(mx, chat.id) == [ENCRYPTED_REFUSAL] and BOT not in chat.members, WAIT_S, what="the refusal"
    )


async def test_a_password_logs_in_once_and_the_token_is_kept(start: Start, mx: FakeMatrix, pool: Pool) -> None:
    await start(MATRIX_ACCESS_TOKEN=None, MATRIX_PASSWORD=PASSWORD)
    await start(MATRIX_ACCESS_TOKEN=None, MATRIX_PASSWORD=PASSWORD)  # a restart: the kept token, no new login
    assert len(mx.logins) == 1
    kept = await pool.fetchval("SELECT value FROM platform_state WHERE key LIKE '%:access_token'")
    assert mx.tokens[kept] == BOT
    del mx.tokens[kept]  # the token was revoked (the session signed out): one new login
    await start(MATRIX_ACCESS_TOKEN=None, MATRIX_PASSWORD=PASSWORD)
    assert len(mx.logins) == 2
    with pytest.raises(StartupError, match="MATRIX_PASSWORD was refused"):
        await pool.execute("DELETE FROM platform_state")
        await start(MATRIX_ACCESS_TOKEN=None, MATRIX_PASSWORD="wrong")


async def test_a_reminder_sent_twice_is_one_message_in_its_room(start: Start, mx: FakeMatrix) -> None:
    adapter = await start()
    room = mx.direct(ALICE)
    await mx.wait_for(lambda: BOT in room.members, WAIT_S, what="the bot joining")
    when = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    msg = ReminderMessage(7, when, "matrix", room.id, "", "private", ALICE, "Alice", "⏰ Call mum")
    first = await adapter.send_reminder(msg)
    again = await adapter.send_reminder(msg)  # a retry of the same occurrence (its record was lost): the same event
    assert first == again and [a.split("\n\n")[0] for a in answers(mx, room.id)] == ["⏰ Call mum"]
    assert first is not None
    assert [r["content"]["m.relates_to"]["key"] for r in mx.reactions(first)] == ["✅", "😴", "💤"]


def test_the_settings_are_all_three_or_none() -> None:
    def problem(**env: str) -> str | None:
        return config_problem(load_settings(LLM_API_KEY="sk-x", **env))

    ok = {"MATRIX_HOMESERVER": "https://matrix.example.org", "MATRIX_USER_ID": "@bot:example.org"}
    assert problem() is None and problem(**ok, MATRIX_ACCESS_TOKEN="syt_x") is None
    assert "MATRIX_ACCESS_TOKEN (or MATRIX_PASSWORD) not set" in str(problem(**ok))
    assert problem(**ok, MATRIX_PASSWORD="secret") is None
    assert "MATRIX_USER_ID" in str(problem(**{**ok, "MATRIX_USER_ID": "bot"}, MATRIX_ACCESS_TOKEN="syt_x"))
