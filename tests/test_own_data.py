"""A person's own data (issue 21): /export sends everything the bot keeps about their account as a JSON file (Telegram,
Discord, the terminal), /forget_me deletes all of it after a confirmation button, and afterwards no row of theirs is
left in any table of the database, while other people's rows stay."""

from __future__ import annotations

import json
import re
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters import console
from adapters.discord.adapter import DiscordAdapter
from adapters.telegram import TelegramAdapter
from core import FORGET_ME_CONFIRM, SENT_PRIVATELY, Buttons, CommandName, Core, Error, FileAnswer, Incoming
from core.accounts.own_data import export_account
from core.commands import HELP
from core.memory.blocks import Block, store
from core.memory.search import insert_archival
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import NOT_STARTED, FakeTelegram
from tests.helpers import incoming, until

# Ann: one account, two identities (Telegram and Discord), with ids and words nobody else has; Bob: someone else.
ANN_ID, ANN_DC_ID = 910001, 910002  # users.id of her identities (her account's id is the first)
ANN_TG, ANN_DC, ANN_DM = 7770001, 880000000000000001, 550000000000000001  # platform ids; ANN_DM: her Discord DM
ANN_NAME, ANN_WORDS = "Annzebra", "zebraquartz"
BOB_TG, BOB_DC, BOB_WORDS = 7770002, 880000000000000002, "walrusopal"
GROUP = -1007770099  # a Telegram group both write in


async def link_ann(pool: Pool, platform: str = "telegram", platform_id: int = ANN_TG) -> None:
    """Ann's identities before she wrote anything, linked by hand into one account (as /link leaves them)."""
    other = "discord" if platform == "telegram" else "telegram"
    await pool.execute(
        "INSERT INTO users (id, platform, platform_user_id, display_name) VALUES ($1, $2, $3, $5), ($4, $6, $7, $5)",
        ANN_ID,
        platform,
        str(platform_id),
        ANN_DC_ID,
        ANN_NAME,
        other,
        str(ANN_DC if other == "discord" else ANN_TG),
    )
    await pool.execute("UPDATE users SET account_id = $1 WHERE id = $2", ANN_ID, ANN_DC_ID)
    await pool.execute("DELETE FROM accounts WHERE id = $1", ANN_DC_ID)


async def say(core: Core, inc: Incoming) -> None:
    """One handled message (the fake model answers)."""
    async with aclosing(core.handle(inc)) as events:
        async for _ in events:
            pass


def ann(text: str, *, platform: str = "telegram", group: bool = False) -> Incoming:
    """Ann writing, in her private chat of the platform or in the group."""
    if platform == "discord":
        return incoming(text, platform="discord", user=str(ANN_DC), chat=str(ANN_DM), name=ANN_NAME)
    chat = str(GROUP) if group else None
    return incoming(text, user=str(ANN_TG), chat=chat, kind="group" if group else "private", name=ANN_NAME)


def bob(text: str, *, group: bool = False) -> Incoming:
    """Bob writing on Telegram, in his private chat or in the group."""
    return incoming(text, user=str(BOB_TG), chat=str(GROUP) if group else None, kind="group" if group else "private")


async def ann_keeps_things(core: Core, clock: FakeClock) -> None:
    """A task with a delivered reminder, memory lines and an archival note for Ann's account (Bob gets some too)."""
    pool = core.pool
    chat = await pool.fetchval("SELECT id FROM chats WHERE platform_chat_id = $1", str(ANN_TG))
    task = await pool.fetchval(
        "INSERT INTO tasks (user_id, chat_id, title, due_at, created_by) VALUES ($1, $2, $3, $4, $1) RETURNING id",
        ANN_ID,
        chat,
        f"water the {ANN_WORDS} plant",
        clock() - timedelta(hours=1),
    )
    await pool.execute(
        "INSERT INTO occurrences (task_id, scheduled_at, status, delivered_at, sent_text) VALUES ($1, $2, 'delivered',"
        " $2, $3)",
        task,
        clock() - timedelta(hours=1),
        f"⏰ water the {ANN_WORDS} plant",
    )
    bob_id = await pool.fetchval("SELECT account_id FROM users WHERE platform_user_id = $1", str(BOB_TG))
    async with pool.acquire() as conn:
        await store(conn, ANN_ID, Block("human", (f"Name: {ANN_NAME}", f"Secret: {ANN_WORDS}")))
        await store(conn, bob_id, Block("human", (f"Secret: {BOB_WORDS}",)))
    await insert_archival(pool, ANN_ID, f"{ANN_WORDS} passport number 123", clock())
    await insert_archival(pool, bob_id, f"{BOB_WORDS} passport number 456", clock())


async def conversations(core: Core, llm: FakeOpenAI) -> None:
    """Ann writes on Telegram (privately and in the group) and in her Discord DM; Bob privately and in the group."""
    llm.default = Reply(text="noted")
    await say(core, ann(f"{ANN_WORDS} from telegram"))
    await say(core, ann(f"{ANN_WORDS} from discord", platform="discord"))
    await say(core, bob(f"{BOB_WORDS} in private"))
    await say(core, bob(f"{BOB_WORDS} in the group", group=True))
    await say(core, ann(f"{ANN_WORDS} in the group", group=True))
    await core.spending.flush()  # their token usage is written


async def traces(pool: Pool, needles: Sequence[str], ids: Sequence[int]) -> list[str]:
    """Every row, in every table of the public schema (also ones added later), whose text holds one of `needles`
    or whose integer column holds one of `ids`: `table: row`."""
    found: list[str] = []
    tables = await pool.fetch(
        "SELECT c.oid, c.oid::regclass::text AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 2"
    )
    assert {"users", "accounts", "messages", "inbox"} <= {t["name"] for t in tables}
    pattern = "|".join(re.escape(n) for n in needles)
    for table in tables:
        columns = await pool.fetch(
            "SELECT quote_ident(attname) AS name FROM pg_attribute WHERE attrelid = $1 AND attnum > 0"
            " AND NOT attisdropped AND atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype)",
            table["oid"],
        )
        where = " OR ".join(["t::text ~* $1", *(f"t.{c['name']} = ANY($2::bigint[])" for c in columns)])
        args = [pattern, list(ids)] if columns else [pattern]
        rows = await pool.fetch(f"SELECT t::text AS row FROM {table['name']} t WHERE {where}", *args)
        found += [f"{table['name']}: {r['row'][:300]}" for r in rows]
    return found


def tables_of(found: list[str]) -> list[str]:
    """The tables of rows `traces` found, once per row (a row's text may change, e.g. an update marked handled)."""
    return sorted(f.partition(":")[0] for f in found)


ANN_NEEDLES = (ANN_WORDS, ANN_NAME, str(ANN_TG), str(ANN_DC), str(ANN_DM))


# ---- the core: what an export holds, what a forget deletes ----------------------------------------------------------


async def test_export_holds_the_whole_linked_account_and_nothing_of_anyone_else(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_core()
    await link_ann(core.pool)
    await conversations(core, fake_llm)
    await ann_keeps_things(core, clock)
    await core.pool.execute("UPDATE accounts SET timezone = 'Europe/Berlin' WHERE id = $1", ANN_ID)
    answer = await core.command(ann("/export", platform="discord"), "export", "", must_answer=True)
    assert isinstance(answer, FileAnswer) and re.fullmatch(r"export-[-\d]+\.json", answer.filename)
    assert "2 identities, " in answer.text and "1 task" in answer.text and "1 archival note" in answer.text
    assert BOB_WORDS not in answer.data.decode() and str(BOB_TG) not in answer.data.decode()
    data = json.loads(answer.data)
    assert (data["format"], data["version"]) == ("assistant-bot-export", 1)
    assert list(data) == [
        "format", "version", "exported_at", "account", "identities", "tasks", "memory", "chats", "usage",
        "attachments", "mcp_accounts",
    ]  # fmt: skip
    assert data["account"]["id"] == ANN_ID and data["account"]["timezone"] == "Europe/Berlin"
    assert [(u["model"], u["calls"]) for u in data["usage"]] == [("fake-model", 3)]  # her three answers
    assert set(data["usage"][0]) == {"day", "model", "prompt_tokens", "completion_tokens", "cached_tokens", "calls"}
    assert [(i["platform"], i["platform_user_id"]) for i in data["identities"]] == [
        ("telegram", str(ANN_TG)),
        ("discord", str(ANN_DC)),
    ]
    [task] = data["tasks"]
    assert task["title"] == f"water the {ANN_WORDS} plant" and task["created_by"] == f"telegram:{ANN_TG}"
    assert task["chat"] == {"platform": "telegram", "chat_id": str(ANN_TG), "thread_id": "", "kind": "private"}
    [occurrence] = task["occurrences"]
    assert occurrence["status"] == "delivered" and occurrence["sent_text"] == f"⏰ water the {ANN_WORDS} plant"
    assert data["memory"]["blocks"][0]["lines"] == [f"Name: {ANN_NAME}", f"Secret: {ANN_WORDS}"]
    assert [a["content"] for a in data["memory"]["archival"]] == [f"{ANN_WORDS} passport number 123"]
    chats = {(c["platform"], c["chat_id"], c["kind"]): c["messages"] for c in data["chats"]}
    assert set(chats) == {
        ("telegram", str(ANN_TG), "private"),
        ("discord", str(ANN_DM), "private"),
        ("telegram", str(GROUP), "group"),
    }
    # private chats whole (her words and the bot's answers), from both identities
    assert [(m["role"], m.get("identity"), m["content"]) for m in chats["telegram", str(ANN_TG), "private"]] == [
        ("user", f"telegram:{ANN_TG}", f"{ANN_WORDS} from telegram"),
        ("assistant", None, "noted"),
    ]
    assert [m["content"] for m in chats["discord", str(ANN_DM), "private"]] == [f"{ANN_WORDS} from discord", "noted"]
    # in the group: her message and the answer to it, never Bob's message or the answer to him
    group = chats["telegram", str(GROUP), "group"]
    assert [(m["role"], m["content"]) for m in group] == [("user", f"{ANN_WORDS} in the group"), ("assistant", "noted")]
    assert group[0]["author_name"] == ANN_NAME and "created_at" in group[0]
    # Bob's export has none of Ann
    bobs = await core.command(bob("/export"), "export", "", must_answer=True)
    assert isinstance(bobs, FileAnswer)
    assert not any(n in bobs.data.decode() for n in ANN_NEEDLES) and BOB_WORDS in bobs.data.decode()
    assert [i["platform_user_id"] for i in json.loads(bobs.data)["identities"]] == [str(BOB_TG)]


async def test_export_streams_the_conversation_so_its_memory_stays_near_the_files_size(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_core()
    fake_llm.default = Reply(text="noted")
    await say(core, ann(f"{ANN_WORDS} from telegram"))
    chat = await core.pool.fetchval("SELECT id FROM chats WHERE platform_chat_id = $1", str(ANN_TG))
    await core.pool.execute(  # a long conversation: about 1.5 MB of messages
        "INSERT INTO messages (chat_id, role, content) SELECT $1, 'assistant', g || ' ' || repeat('words ', 50)"
        " FROM generate_series(1, 5000) g",
        chat,
    )
    account = await core.pool.fetchval("SELECT account_id FROM users WHERE platform_user_id = $1", str(ANN_TG))
    tracemalloc.start()
    try:
        _, data = await export_account(core.pool, account, clock())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    [messages] = [c["messages"] for c in json.loads(data)["chats"]]
    assert len(messages) == 5002 and messages[-1]["content"].startswith("5000 words")
    # the file itself and a cursor's batch of rows; parsing the whole conversation and laying it out again took 5×
    assert peak < 2 * len(data), (peak, len(data))


async def test_forget_me_asks_then_leaves_no_row_of_the_person_in_any_table(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_core()
    await link_ann(core.pool)
    await conversations(core, fake_llm)
    await ann_keeps_things(core, clock)
    await core.pool.execute("INSERT INTO refusal_notices VALUES ($1, now())", f"telegram:{ANN_TG}:")  # refused once
    await core.pool.execute(  # a link code she asked for, and a wrong code her other identity tried
        "INSERT INTO link_codes (code_sha256, account_id, issued_by, created_at, expires_at)"
        " VALUES (sha256('abc'::bytea), $1, $1, now(), now() + interval '10 minutes')",
        ANN_ID,
    )
    await core.pool.execute("INSERT INTO link_tries (user_id, wrong, first_wrong_at) VALUES ($1, 1, now())", ANN_DC_ID)
    assert await core.pool.fetchval("SELECT count(*) FROM token_usage WHERE account_id = $1", ANN_ID) > 0
    await core.kept.put(f"x:dm:{ANN_DC}", "her direct room", owner=f"discord:{ANN_DC}")  # what an adapter keeps of her
    await core.kept.put(f"x:dm:{BOB_TG}", "his direct room", owner=f"telegram:{BOB_TG}")
    bob_before = tables_of(await traces(core.pool, [BOB_WORDS], []))
    bob_id = await core.pool.fetchval("SELECT id FROM users WHERE platform_user_id = $1", str(BOB_TG))
    assert await traces(core.pool, ANN_NEEDLES, [ANN_ID, ANN_DC_ID])
    asked = await core.command(ann("/forget_me"), "forget_me", "", must_answer=True)
    assert isinstance(asked, Buttons) and len(asked.rows) == 1  # with its "Yes, delete everything" button
    ask = asked.text
    assert "cannot be undone" in ask and "/forget_me confirm" in ask
    assert "2 identities, 6 stored messages, 1 task, 2 memory lines and 1 archival note" in ask
    assert f"telegram:{ANN_TG}, discord:{ANN_DC}" in ask
    assert await core.pool.fetchval("SELECT count(*) FROM users WHERE account_id = $1", ANN_ID) == 2  # only asked
    done = await core.command(ann("/forget_me confirm", platform="discord"), "forget_me", "confirm", must_answer=True)
    assert isinstance(done, str) and done.startswith("Done — I deleted your account") and "6 stored messages" in done
    assert await traces(core.pool, ANN_NEEDLES, [ANN_ID, ANN_DC_ID]) == []
    assert await core.kept.get(f"x:dm:{ANN_DC}") is None and await core.kept.get(f"x:dm:{BOB_TG}") == "his direct room"
    assert tables_of(await traces(core.pool, [BOB_WORDS], [])) == bob_before  # Bob's rows, in the group too, all stay
    group = await core.pool.fetch(
        "SELECT m.role, m.content FROM messages m JOIN chats c ON c.id = m.chat_id WHERE c.platform_chat_id = $1"
        " ORDER BY m.id",
        str(GROUP),
    )
    assert [(r["role"], r["content"]) for r in group] == [("user", f"{BOB_WORDS} in the group"), ("assistant", "noted")]
    turns = await core.pool.fetch(
        "SELECT t.user_id FROM turns t JOIN chats c ON c.id = t.chat_id WHERE c.platform_chat_id = $1", str(GROUP)
    )
    assert [t["user_id"] for t in turns] == [bob_id]  # the turn Ann started there is gone, Bob's stays
    again = await core.command(ann("/forget_me confirm"), "forget_me", FORGET_ME_CONFIRM, must_answer=True)
    assert again == "I keep nothing about you (any more)."
    # the next message starts afresh: a new identity and account, none of the old data
    await say(core, ann("hello again"))
    fresh = await core.pool.fetchrow("SELECT id, account_id FROM users WHERE platform_user_id = $1", str(ANN_TG))
    assert fresh is not None and fresh["id"] != ANN_ID
    assert await core.pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", fresh["account_id"]) == 0


async def test_own_data_commands_are_in_the_catalogue_and_refused_to_strangers(make_core: MakeCore) -> None:
    assert "/export" in HELP and "/forget_me" in HELP
    core = make_core(ALLOWED_USERS=f"telegram:{BOB_TG}")
    cases: tuple[tuple[CommandName, str], ...] = (("export", ""), ("forget_me", ""), ("forget_me", "confirm"))
    for name, arg in cases:
        refused = await core.command(ann("/x"), name, arg, must_answer=True)
        assert isinstance(refused, Error) and refused.code == "not_allowed"
    assert await core.pool.fetchval("SELECT count(*) FROM users") == 0


# ---- Telegram ------------------------------------------------------------------------------------------------------


class TelegramBot:
    """A running Telegram adapter, its core and its fakes."""

    def __init__(self, tg: FakeTelegram, core: Core) -> None:
        """Keep the pieces together."""
        self.tg, self.core = tg, core

    async def say(self, text: str, count: int = 1, **kw: Any) -> list[dict[str, Any]]:
        """Push a message and wait for `count` more sent messages; return the new ones."""
        before = len(self.tg.sent)
        self.tg.push_update(self.tg.message_update(text, **kw))
        await self.tg.wait_sent(before + count)
        return self.tg.sent[before:]


@pytest.fixture
async def telegram(tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore) -> AsyncIterator[TelegramBot]:
    """The real Telegram adapter against the fake Bot API; everyone may use the bot."""
    fake_llm.default = Reply(text="noted")
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url)
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    await adapter.start()
    try:
        yield TelegramBot(tg, core)
    finally:
        await adapter.stop()


def ann_tg(**kw: Any) -> dict[str, Any]:
    """Ann on Telegram (in her private chat unless a chat is given)."""
    return {"user_id": ANN_TG, "chat_id": ANN_TG, "first_name": ANN_NAME, **kw}


def bob_tg(**kw: Any) -> dict[str, Any]:
    """Bob on Telegram (in his private chat unless a chat is given)."""
    return {"user_id": BOB_TG, "chat_id": BOB_TG, "first_name": "Bob", **kw}


async def test_telegram_export_sends_a_document_privately(telegram: TelegramBot) -> None:
    await telegram.say(f"{ANN_WORDS} hello", **ann_tg())
    [sent] = await telegram.say("/export", **ann_tg())
    assert sent["chat_id"] == ANN_TG and sent["message"]["document"]["file_name"].endswith(".json")
    assert sent["message"]["document"]["mime_type"] == "application/json"
    assert "Everything I keep about you" in sent["message"]["caption"]
    data = json.loads(sent["document_data"])
    assert data["identities"][0]["platform_user_id"] == str(ANN_TG)
    assert [m["content"] for c in data["chats"] for m in c["messages"]] == [f"{ANN_WORDS} hello", "noted"]
    # asked in a group: the file goes to her private chat, the group only sees a note
    private, note = await telegram.say("/export@test_bot", 2, **ann_tg(chat_id=GROUP, chat_type="supergroup"))
    assert private["chat_id"] == ANN_TG and "document_data" in private
    assert note["chat_id"] == GROUP and note["text"] == SENT_PRIVATELY and "document" not in note["message"]
    # someone who never started the bot: the group is told how, and gets no file
    telegram.tg.refuse_chat(BOB_TG, NOT_STARTED)
    [pointer] = await telegram.say("/export", **bob_tg(chat_id=GROUP, chat_type="supergroup"))
    assert pointer["chat_id"] == GROUP and "t.me/test_bot" in pointer["text"] and "/export" in pointer["text"]
    assert all("document_data" not in s or s["chat_id"] == ANN_TG for s in telegram.tg.sent)


async def test_telegram_export_too_large_is_one_line(telegram: TelegramBot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("adapters.telegram.handlers.TELEGRAM_UPLOAD_LIMIT", 100)
    [sent] = await telegram.say("/export", **ann_tg())
    assert "document_data" not in sent and "\n" not in sent["text"]
    assert sent["text"].startswith("Your data export is ") and "(0.0 MB at most)" in sent["text"]


async def test_telegram_forget_me_button_only_for_its_person_then_nothing_of_them_remains(
    telegram: TelegramBot, clock: FakeClock
) -> None:
    core, tg = telegram.core, telegram.tg
    await link_ann(core.pool)
    await telegram.say(f"{ANN_WORDS} private", **ann_tg())
    await telegram.say(f"{BOB_WORDS} private", **bob_tg())
    await telegram.say(f"@test_bot {BOB_WORDS} group", **bob_tg(chat_id=GROUP, chat_type="supergroup"))
    await telegram.say(f"@test_bot {ANN_WORDS} group", **ann_tg(chat_id=GROUP, chat_type="supergroup"))
    await say(core, ann(f"{ANN_WORDS} from discord", platform="discord"))
    await ann_keeps_things(core, clock)
    await core.spending.flush()
    bob_before = tables_of(await traces(core.pool, [BOB_WORDS], []))
    [ask] = await telegram.say("/forget_me", **ann_tg())
    assert "cannot be undone" in ask["text"] and "/forget_me confirm" in ask["text"]
    [[button]] = ask["reply_markup"]["inline_keyboard"]
    assert button["callback_data"] == f"forget:{ANN_TG}"
    # Bob presses Ann's button (and a forged one naming himself, in Ann's chat): nothing is deleted
    for data in (f"forget:{ANN_TG}", f"forget:{BOB_TG}"):
        tg.push_update(tg.callback_update(data, message=ask, user_id=BOB_TG, first_name="Bob"))
    await tg.wait_for(lambda: len(tg.callback_answers) == 2)
    assert all("not for you" in a["text"] and "/forget_me" in a["text"] for a in tg.callback_answers)
    assert await core.pool.fetchval("SELECT count(*) FROM users WHERE account_id = $1", ANN_ID) == 2
    # Ann presses it: the question says it is done, and nothing of her is left anywhere (the inbox included)
    tg.push_update(tg.callback_update(f"forget:{ANN_TG}", message=ask, user_id=ANN_TG, first_name=ANN_NAME))
    await tg.wait_for(lambda: tg.sent[-1].get("edit_count", 0) == 1)
    assert tg.sent[-1]["text"].startswith("Done — I deleted your account") and "reply_markup" not in tg.sent[-1]
    await tg.wait_for(lambda: len(tg.callback_answers) == 3)
    await until(lambda: core.inbox.held == 0)  # the press's update is marked handled
    assert await traces(core.pool, ANN_NEEDLES, [ANN_ID, ANN_DC_ID]) == []
    assert tables_of(await traces(core.pool, [BOB_WORDS], [])) == bob_before  # Bob's messages, updates and memory stay
    assert await core.pool.fetchval("SELECT count(*) FROM inbox WHERE payload = '{}'::jsonb") >= 4


# ---- Discord -------------------------------------------------------------------------------------------------------


@pytest.fixture
async def discord_bot(dc: FakeDiscord, fake_llm: FakeOpenAI, make_core: MakeCore) -> AsyncIterator[Core]:
    """The real Discord adapter against the fake; everyone may use the bot."""
    fake_llm.default = Reply(text="noted")
    core = make_core(DISCORD_BOT_TOKEN=dc.token, DISCORD_API_BASE_URL=dc.api_base, DISCORD_GATEWAY_URL=dc.gateway_url)
    adapter = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    await adapter.start()
    try:
        yield core
    finally:
        await adapter.stop()


async def attachment(url: str) -> bytes:
    """The bytes the fake Discord serves for an attachment."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.read()


async def test_discord_export_is_an_ephemeral_attachment(dc: FakeDiscord, discord_bot: Core) -> None:
    alice = dc.user(ANN_DC, ANN_NAME)
    before = len(dc.sent)
    await dc.post_message(alice, f"{ANN_WORDS} hello", dm=True)
    await dc.wait_sent(before + 1)
    asked = await (await dc.slash("export", None, alice)).wait_done()  # in the server's channel
    assert asked.deferred and asked.ephemeral
    [followup] = asked.followups
    assert "Everything I keep about you" in followup["content"]
    [file] = followup["attachments"]
    assert file["filename"].startswith("export-") and file["filename"].endswith(".json")
    data = json.loads(await attachment(file["url"]))
    assert data["identities"][0]["platform_user_id"] == str(ANN_DC)
    assert [m["content"] for c in data["chats"] for m in c["messages"]] == [f"{ANN_WORDS} hello", "noted"]
    shared = [m for m in dc.messages_in(dc.channel_id) if m.get("attachments")]
    assert all(int(m.get("flags") or 0) & 64 for m in shared)  # the channel sees nothing: the file is ephemeral


async def test_discord_export_too_large_is_one_line(
    dc: FakeDiscord, discord_bot: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("adapters.discord.send.DISCORD_UPLOAD_LIMIT", 100)
    asked = await (await dc.slash("export", None, dc.user(ANN_DC, ANN_NAME))).wait_done()
    [followup] = asked.followups
    assert followup["content"].startswith("Your data export is ") and not followup["attachments"]


async def test_discord_forget_me_button_only_for_its_person_then_nothing_of_them_remains(
    dc: FakeDiscord, discord_bot: Core, clock: FakeClock
) -> None:
    core = discord_bot
    await link_ann(core.pool, "discord", ANN_DC)
    alice, bobby = dc.user(ANN_DC, ANN_NAME), dc.user(BOB_DC, "Bobby")
    for author, text in ((bobby, f"{BOB_WORDS} in the server"), (alice, f"{ANN_WORDS} in the server")):
        before = len(dc.sent)
        await dc.post_message(author, text, mention_bot=True)
        await dc.wait_sent(before + 1)
    await core.spending.flush()
    bob_before = tables_of(await traces(core.pool, [BOB_WORDS], []))
    ask = await (await dc.slash("forget_me", None, alice, dm=True)).wait_done()  # her DM: only slash commands there
    assert ask.ephemeral and "cannot be undone" in ask.texts()[0] and "/forget_me confirm:True" in ask.texts()[0]
    assert ask.message is not None
    ids = [c["custom_id"] for row in ask.message["components"] for c in row["components"]]
    assert ids == [f"forget:{ANN_DC}"]
    refused = await (await dc.click(ask.message, f"forget:{ANN_DC}", bobby)).wait_done()
    assert refused.ephemeral and "not for you" in refused.texts()[0]
    assert await core.pool.fetchval("SELECT count(*) FROM users WHERE account_id = $1", ANN_ID) == 2
    done = await (await dc.click(ask.message, f"forget:{ANN_DC}", alice, dm=True)).wait_done()
    assert done.responses[0]["type"] == 7 and done.texts()[0].startswith("Done — I deleted your account")
    await until(lambda: core.inbox.held == 0)
    needles = (*ANN_NEEDLES, str(dc.dm_channel_id(ANN_DC)))
    assert await traces(core.pool, needles, [ANN_ID, ANN_DC_ID]) == []
    assert tables_of(await traces(core.pool, [BOB_WORDS], [])) == bob_before


# ---- the terminal --------------------------------------------------------------------------------------------------


async def test_terminal_export_writes_the_file_and_prints_its_path(make_core: MakeCore, fake_llm: FakeOpenAI) -> None:
    core = make_core()
    fake_llm.default = Reply(text="noted")
    await say(core, console.console_incoming(f"{ANN_WORDS} typed"))
    printed = await console.command(core, "export", "")
    path = Path(re.findall(r"Saved to `([^`]+)`", printed)[0])
    assert path.parent == (core.settings.DATA_DIR / "exports").resolve() and path.stat().st_mode & 0o077 == 0
    data = json.loads(path.read_bytes())
    assert data["identities"][0]["platform"] == "console"
    assert [m["content"] for c in data["chats"] for m in c["messages"]] == [f"{ANN_WORDS} typed", "noted"]
    ask = await console.command(core, "forget_me", "")
    assert "/forget_me confirm" in ask and "button" not in ask
    assert (await console.command(core, "forget_me", "confirm")).startswith("Done — I deleted your account")
    assert await core.pool.fetchval("SELECT count(*) FROM messages") == 0
