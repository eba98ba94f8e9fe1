"""One update nobody can store or read never stops the bot: text PostgreSQL cannot hold (U+0000, lone surrogates) is
cleaned where it enters, and an update that still cannot be stored or parsed becomes a dead letter (kept, counted,
shown to admins, pruned) while the chats behind it go on."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.telegram.receive import SECRET_HEADER
from core.constants import DEAD_LETTER_PAYLOAD_CHARS, DEAD_LETTER_REASON_CHARS
from core.storage.db import Pool
from core.storage.retention import prune
from core.textsafe import clean_json, strip_nul
from core.types import Incoming, Quoted, Upload
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.test_discord import BOB
from tests.test_discord import Bot as DcBot
from tests.test_discord import bot as dcbot  # noqa: F401  (the running Discord adapter fixture)
from tests.test_inbox import Proc, StartProc, echo, start_proc  # noqa: F401  (webhook-mode processes)
from tests.test_telegram import Bot as TgBot
from tests.test_telegram import bot as tgbot  # noqa: F401  (the running Telegram adapter fixture)

NUL = "\x00"


def last_user_text(llm: FakeOpenAI) -> str:
    """The newest user message the model was sent."""
    return str([m for m in llm.requests[-1]["messages"] if m["role"] == "user"][-1]["content"])


async def dead_letters(pool: Pool) -> list[dict[str, Any]]:
    """The dead letters kept, oldest first."""
    return [dict(r) for r in await pool.fetch("SELECT * FROM dead_letters ORDER BY id")]


def metric(core_metrics: bytes, name: str) -> float:
    """The sum of a counter's samples in a /metrics exposition."""
    total = 0.0
    for line in core_metrics.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---- cleaning -----------------------------------------------------------------------------------------------------


def test_strip_nul_removes_nul_and_replaces_lone_surrogates_and_keeps_clean_text_as_is() -> None:
    clean = "Grüße 😀 plain"
    assert strip_nul(clean) is clean
    assert strip_nul("a\x00b\x00") == "ab"
    assert strip_nul("x\ud800y") == "x\ufffdy"
    assert clean_json({"k\x00": ["v\x00", {"n": 1, "s": "\udfff"}], "b": True}) == {
        "k": ["v", {"n": 1, "s": "\ufffd"}],
        "b": True,
    }


def test_core_types_hold_no_nul_whoever_builds_them() -> None:
    inc = Incoming(
        "telegram",
        "1",
        "1",
        "hi\x00 there",
        user_name="Mal\x00lory",
        chat_title="G\x00",
        attachments=("a\x00",),
        quoted=(Quoted("forward", "E\x00ve", "fw\x00d"),),
        uploads=(Upload("document", "re\x00port.txt", "text/plain", b"\x00raw bytes stay"),),
    )
    assert (inc.text, inc.user_name, inc.chat_title, inc.attachments) == ("hi there", "Mallory", "G", ("a",))
    assert inc.quoted[0] == Quoted("forward", "Eve", "fwd")
    assert inc.uploads[0].name == "report.txt" and inc.uploads[0].data == b"\x00raw bytes stay"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(codec=None, categories=None)))
async def test_any_text_is_storable_in_jsonb_and_text(pool: Pool, text: str) -> None:
    stored = await pool.fetchval("SELECT $1::jsonb", {"t": text, text: [text]})
    assert stored == clean_json({"t": text, text: [text]})
    assert await pool.fetchval("SELECT $1::text", strip_nul(text)) == strip_nul(text)


# ---- Telegram, long polling ----------------------------------------------------------------------------------------


async def test_a_group_message_with_nul_in_the_name_does_not_stop_the_bot(tgbot: TgBot) -> None:  # noqa: F811
    bot = tgbot
    poison = bot.tg.message_update("hi\x00 all", user_id=6666, chat_id=-500, chat_type="group", first_name="Mal\x00")
    bot.tg.push_update(poison)  # not even addressed to the bot: it is stored like every update
    bot.llm.script(Reply(text="answered at once"))
    [sent] = await asyncio.wait_for(bot.say("hello", user_id=1002, chat_id=1002), 10)
    assert sent["text"] == "answered at once"
    stored = await bot.pool.fetchval("SELECT payload FROM inbox WHERE chat_key = 'telegram:-500'")
    assert stored["message"]["from"]["first_name"] == "Mal" and stored["message"]["text"] == "hi all"
    assert await dead_letters(bot.pool) == []  # cleaned, not quarantined


async def test_a_message_with_nul_is_answered_like_any_other(tgbot: TgBot) -> None:  # noqa: F811
    bot = tgbot
    bot.llm.script(Reply(text="got it"))
    [sent] = await bot.say("remember\x00 this", first_name="A\x00nn")
    assert sent["text"] == "got it"
    assert last_user_text(bot.llm) == "remember this"
    assert await bot.pool.fetchval("SELECT content FROM messages WHERE role = 'user'") == "remember this"


async def test_an_update_that_cannot_be_parsed_is_a_dead_letter_and_the_next_message_is_answered(
    tgbot: TgBot,  # noqa: F811
) -> None:
    bot = tgbot
    bot.tg.push_update({"message": {"message_id": "not a number", "chat": "nor a chat", "date": "x"}})
    bot.llm.script(Reply(text="still here"))
    [sent] = await asyncio.wait_for(bot.say("hello", user_id=1002, chat_id=1002), 10)
    assert sent["text"] == "still here"
    [dead] = await dead_letters(bot.pool)
    assert dead["platform"] == bot.adapter.receiver.source and dead["update_id"] is not None
    assert dead["reason"].startswith("not a Telegram update") and "nor a chat" in dead["payload"]
    assert metric(bot.adapter.core.metrics_text(), "bot_dead_letters_total") == 1
    # the admin sees it in /status, someone else does not
    [status] = await bot.say("/status")
    assert "dead letters" in status["text"] and "1, newest" in status["text"]
    [status] = await bot.say("/status", user_id=1002, chat_id=1002)
    assert "dead letters" not in status["text"]


async def test_an_update_the_database_refuses_for_any_reason_is_quarantined_not_retried_for_ever(
    tgbot: TgBot,  # noqa: F811
) -> None:
    bot = tgbot
    # a refusal of this one row that no cleaning can fix (a constraint, a trigger, a bug): PostgreSQL says no
    await bot.pool.execute("""
        CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.payload::text LIKE '%poison%' THEN RAISE EXCEPTION 'this row cannot be stored'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION refuse_poison();
    """)
    bot.tg.push_update(bot.tg.message_update("poison"))
    bot.llm.script(Reply(text="next one answered"))
    [sent] = await asyncio.wait_for(bot.say("hello", user_id=1002, chat_id=1002), 10)
    assert sent["text"] == "next one answered"
    [dead] = await dead_letters(bot.pool)
    assert "could not be stored" in dead["reason"] and "this row cannot be stored" in dead["reason"]
    assert '"text": "poison"' in dead["payload"]


async def test_an_update_the_database_cannot_take_now_is_retried_not_quarantined(
    tgbot: TgBot,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = tgbot
    await bot.pool.execute("""
        CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'no room' USING ERRCODE = 'disk_full'; END $$;
        CREATE TRIGGER disk_full BEFORE INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION disk_full();
    """)
    bot.llm.script(Reply(text="stored once there was room"))
    bot.tg.push_update(bot.tg.message_update("hello"))
    async with asyncio.timeout(10):  # polling got it and could not store it: not acknowledged, asked for again
        while not any("no room" in r.getMessage() for r in caplog.records):  # noqa: ASYNC110 (a log line: no event)
            await asyncio.sleep(0.01)
    await bot.pool.execute("DROP TRIGGER disk_full ON inbox")
    [sent] = await bot.tg.wait_sent(1, timeout=15)
    assert sent["text"] == "stored once there was room"
    assert await dead_letters(bot.pool) == []


# ---- Telegram, webhook ---------------------------------------------------------------------------------------------


async def test_webhook_answers_200_to_a_poison_update_and_keeps_it(
    start_proc: StartProc,  # noqa: F811
    tg: FakeTelegram,
    fake_llm: FakeOpenAI,
    pool: Pool,
) -> None:
    p: Proc = await start_proc()
    fake_llm.default = echo()
    headers = {SECRET_HEADER: p.core.settings.webhook_secret}
    async with aiohttp.ClientSession() as http:
        poison = tg.message_update("x", first_name="E\x00ve", chat_id=-7, chat_type="group") | {"update_id": 900}
        assert await p.post(tg, poison) == 200
        bad = {"update_id": 901, "message": {"chat": 5}}
        async with http.post(p.url, json=bad, headers=headers) as resp:
            assert resp.status == 200  # kept as a dead letter: Telegram must not send it again for ever
        async with http.post(p.url, data=b"{not json", headers=headers) as resp:
            assert resp.status == 200
    tg.push_update(tg.message_update("hello"))
    [sent] = await tg.wait_sent(1)
    assert sent["text"] == "re: hello"
    dead = await dead_letters(pool)
    assert [d["update_id"] for d in dead] == [901, None]
    assert "{not json" in dead[1]["payload"]
    assert await pool.fetchval("SELECT payload->'message'->'from'->>'first_name' FROM inbox WHERE update_id = 900") == (
        "Eve"
    )


# ---- Discord -------------------------------------------------------------------------------------------------------


async def test_discord_message_with_nul_in_name_and_text_is_answered_and_the_next_one_too(
    dcbot: DcBot,  # noqa: F811
) -> None:
    bot = dcbot
    mallory = bot.dc.user(BOB, "Mal\x00lory")
    bot.llm.script(Reply(text="first"), Reply(text="second"))
    [sent] = await asyncio.wait_for(bot.say("what\x00 now", author=mallory, mention_bot=True), 10)
    assert sent["content"].split("\n")[0] == "first"
    assert NUL not in last_user_text(bot.llm) and "what now" in last_user_text(bot.llm)
    [sent] = await asyncio.wait_for(bot.say("and now", mention_bot=True), 10)
    assert sent["content"].split("\n")[0] == "second"
    assert await dead_letters(bot.pool) == []


# ---- the inbox and retention ---------------------------------------------------------------------------------------


async def test_a_stored_update_that_cannot_be_parsed_any_more_is_a_dead_letter(tgbot: TgBot) -> None:  # noqa: F811
    bot = tgbot
    core = bot.adapter.core
    await core.inbox.receive("telegram:old", 77, "telegram:5", {"stored by": "an older version"}, None)
    core.inbox.serve("telegram:old", lambda payload: payload["message"], bot.adapter.routes.route)
    for _ in range(200):
        if await bot.pool.fetchval("SELECT done_at IS NOT NULL FROM inbox WHERE update_id = 77"):
            break
        await asyncio.sleep(0.025)
    [dead] = await dead_letters(bot.pool)
    assert (dead["platform"], dead["update_id"]) == ("telegram:old", 77)
    assert dead["reason"].startswith("could not be parsed: KeyError")


async def test_dead_letters_are_pruned_with_the_retention_setting(pool: Pool) -> None:
    await pool.execute(
        "INSERT INTO dead_letters (platform, update_id, reason, payload, created_at) VALUES"
        " ('telegram:1', 1, 'old', '{}', now() - interval '40 days'), ('telegram:1', 2, 'new', '{}', now())"
    )
    now = await pool.fetchval("SELECT now()")
    pruned = await prune(pool, now, timedelta(days=30))
    assert pruned.dead_letters == 1
    assert [r["reason"] for r in await dead_letters(pool)] == ["new"]


@pytest.mark.parametrize("reason", ["could not be stored: x\x00y", "é" * 1000])
async def test_a_dead_letter_keeps_any_reason_and_a_capped_payload(pool: Pool, reason: str) -> None:
    from core.storage import dead_letters as store

    assert await store.add(pool, "discord:1", 5, reason, {"text": "\x00" + "z" * 100_000})
    assert not await store.add(pool, "discord:1", 5, reason, {})  # the same update again: kept once
    [dead] = await dead_letters(pool)
    assert len(dead["payload"]) <= DEAD_LETTER_PAYLOAD_CHARS + 1 and dead["payload"].startswith('{"text": "\\u0000zz')
    assert len(dead["reason"]) <= DEAD_LETTER_REASON_CHARS


# ---- text from the model, the speech server and commands ----------------------------------------------------------


async def test_nul_in_the_models_answer_and_tool_arguments_is_not_a_failed_turn(tgbot: TgBot) -> None:  # noqa: F811
    bot = tgbot
    bot.llm.script(
        Reply(
            tool_calls=[("manage_tasks", {"action": "create", "title": "Call\x00 mum", "due_at": "2030-01-02T10:00"})]
        ),
        Reply(text="Done\x00 — noted."),
    )
    [sent] = await bot.say("note it")
    assert sent["text"].startswith("Done — noted.")
    assert await bot.pool.fetchval("SELECT title FROM tasks") == "Call mum"
    assert await bot.pool.fetchval("SELECT content FROM messages WHERE role = 'assistant' AND content <> ''") == (
        "Done — noted."
    )


async def test_a_transcript_with_nul_is_heard_without_it(tgbot: TgBot) -> None:  # noqa: F811
    bot = tgbot
    bot.llm.script_transcripts(Reply(text="water\x00 the plants"))
    bot.llm.script(Reply(text="ok"))
    before = len(bot.tg.sent)
    bot.tg.push_update(bot.tg.voice_update(b"OggS\x00\x02" + bytes(range(50)), duration=1))
    await bot.tg.wait_sent(before + 1)
    assert last_user_text(bot.llm) == "water the plants"
    assert await bot.pool.fetchval("SELECT pages FROM attachments") == ["water the plants"]


async def test_a_command_argument_with_nul_is_read_without_it(tgbot: TgBot) -> None:  # noqa: F811
    bot = tgbot
    [sent] = await bot.say("/timezone Europe/Par\x00is")
    assert "Europe/Paris" in sent["text"]
    assert await bot.pool.fetchval("SELECT timezone FROM accounts") == "Europe/Paris"
