"""Accounts end to end (issue 21, "Done means"): the real Telegram and Discord adapters on one core, against the fake
Telegram, the fake Discord and the fake model. Ann links her two identities with /link; a reminder made on Discord is
listed on Telegram and arrives in the Discord DM, once; memory written on Telegram is in the Discord DM's prompt; the
daily budget is the account's and resets at midnight in her time zone; /export holds both identities and /forget_me
leaves nothing of her, while Bob (on both platforms, not linked) keeps everything."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.discord.adapter import DiscordAdapter
from adapters.telegram import TelegramAdapter
from core.front_door import Core
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_discord import FakeDiscord, FakeInteraction
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import until
from tests.test_own_data import tables_of, traces
from tests.test_reminder_fallback import engine
from tests.test_usage import used

# Ann and Bob, each on Telegram and on Discord, with ids and words nobody else has (the table scan looks for them)
ANN_TG, ANN_DC, ANN_NAME, ANN_WORDS = 7770001, 880000000000000001, "Annzebra", "zebraquartz"
BOB_TG, BOB_DC, BOB_NAME, BOB_WORDS = 7770002, 880000000000000002, "Bobwalrus", "walrusopal"
CODE = re.compile(r"\b([2-9A-Z]{4}-[2-9A-Z]{4})\b")
FIRST_ID = 910000  # identities and accounts get ids above this (no other row's number comes near)
TOKYO = "Asia/Tokyo"  # 10:00 UTC on the test clock is 19:00 there; midnight there is 15:00 UTC


def cheap(text: str = "", tools: list[tuple[str, dict[str, Any]]] | None = None) -> Reply:
    """A model reply that reports 10 prompt tokens (so the budget counts only what a test means it to)."""
    return Reply(text=text, tool_calls=list(tools or []), usage=used(10))


@dataclass
class Bot:
    """One process: the real Telegram and Discord adapters on one core, and the fakes they talk to."""

    core: Core
    tg: FakeTelegram
    dc: FakeDiscord
    telegram: TelegramAdapter
    discord: DiscordAdapter
    llm: FakeOpenAI

    async def tg_say(self, text: str, user: int = ANN_TG, name: str = ANN_NAME) -> dict[str, Any]:
        """`user` writes in their private Telegram chat; the one message the bot sends back (`shown`: its text as
        Telegram shows it)."""
        before = len(self.tg.sent)
        self.tg.push_update(self.tg.message_update(text, chat_id=user, user_id=user, first_name=name))
        await self.tg.wait_sent(before + 1)
        [sent] = self.tg.sent[before:]
        assert sent["chat_id"] == user
        return {**sent, "shown": sent["message"].get("text")}

    async def dc_say(self, text: str, user: int = ANN_DC, name: str = ANN_NAME) -> str:
        """`user` writes in their Discord DM; the text the bot answers there."""
        author = self.dc.user(user, name)
        before = len(self.dc.sent)
        await self.dc.post_message(author, text, dm=True)
        await self.dc.wait_sent(before + 1)
        [sent] = self.dc.sent[before:]
        assert sent["channel_id"] == self.dc.dm_channel_id(user)
        return str(sent["content"])

    async def dc_slash(self, name: str, options: dict[str, Any] | None = None) -> FakeInteraction:
        """Ann uses a slash command in her Discord DM; the answered interaction."""
        return await (await self.dc.slash(name, options, self.dc.user(ANN_DC, ANN_NAME), dm=True)).wait_done()

    async def requests_made(self) -> int:
        """How many model requests the fake model got (after the usage written so far)."""
        await self.core.spending.flush()
        return len(self.llm.requests)


@pytest.fixture
async def bot(
    tg: FakeTelegram, dc: FakeDiscord, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool
) -> AsyncIterator[Bot]:
    """Both adapters started on one core with a daily budget of 1,000 tokens per account. The adapters are the core's
    outboxes (as `Core.running` makes them, for the link code's issuer); reminders are sent by the test's own engine on
    the test's clock (`Core.running`'s scheduler keeps the real time)."""
    await pool.execute("SELECT setval('users_id_seq', $1)", FIRST_ID)
    core = make_core(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        USER_DAILY_TOKENS="1000",
    )
    fake_llm.default = cheap("noted")
    telegram = TelegramAdapter(core, core.settings, poll_timeout=1)
    discord = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    await telegram.start()
    try:
        await discord.start()
        try:
            core.outboxes.update({"telegram": telegram, "discord": discord})
            yield Bot(core, tg, dc, telegram, discord, fake_llm)
        finally:
            await discord.stop()
    finally:
        await telegram.stop()


async def link(bot: Bot) -> None:
    """Ann asks for a code in her Telegram chat and sends it with /link from her Discord DM; both sides are told."""
    shown = await bot.tg_say("/link")
    found = CODE.search(shown["shown"])
    assert found is not None, shown["shown"]
    told_before = len(bot.tg.sent)
    slash = await bot.dc_slash("link", {"code": found.group(1)})
    assert slash.texts()[0].startswith(f"🔗 Linked with `telegram:{ANN_TG}` ({ANN_NAME}): you are one account now")
    [told] = await until_sent(bot.tg, told_before + 1)
    assert told["chat_id"] == ANN_TG
    assert told["message"]["text"].startswith(f"🔗 discord:{ANN_DC} ({ANN_NAME}) used your link code")


async def until_sent(tg: FakeTelegram, count: int) -> list[dict[str, Any]]:
    """Wait for Telegram's `count`th sent message; the ones from there on."""
    await tg.wait_sent(count)
    return tg.sent[count - 1 :]


async def accounts(pool: Pool) -> dict[tuple[str, str], int]:
    """(platform, platform id) → account id, of every identity."""
    rows = await pool.fetch("SELECT platform, platform_user_id, account_id FROM users")
    return {(r["platform"], r["platform_user_id"]): r["account_id"] for r in rows}


async def test_ann_links_telegram_and_discord_then_tasks_reminders_memory_export_and_forget_me_span_both(
    bot: Bot, pool: Pool, clock: FakeClock
) -> None:
    # Bob writes on both platforms first (and is never linked): his data must survive everything Ann does
    await bot.tg_say(f"{BOB_WORDS} on telegram", user=BOB_TG, name=BOB_NAME)
    bob_line = f"Collects {BOB_WORDS} stones"
    bot.llm.script(cheap(tools=[("core_memory_append", {"block": "human", "content": bob_line})]), cheap("Noted."))
    await bot.dc_say(f"{BOB_WORDS} on discord: remember my stones", user=BOB_DC, name=BOB_NAME)
    await bot.tg_say(f"{ANN_WORDS} hello from telegram")
    await bot.tg_say(f"/timezone {TOKYO}")

    # 1. the link, told on both sides
    await link(bot)
    owners = await accounts(pool)
    ann = owners["telegram", str(ANN_TG)]
    assert ann > FIRST_ID  # the table scan below looks for her ids in every integer column
    assert owners["discord", str(ANN_DC)] == ann
    assert len({owners["telegram", str(BOB_TG)], owners["discord", str(BOB_DC)], ann}) == 3

    # 2. a reminder made in the Discord DM is listed on Telegram and arrives in the DM, once
    bot.llm.script(
        cheap(tools=[("manage_tasks", {"action": "create", "title": "Call mum", "due_at": "2026-11-21T19:05"})]),
        cheap("I'll remind you at 19:05."),
    )
    assert (await bot.dc_say(f"{ANN_WORDS} remind me to call mum at 19:05")).startswith("I'll remind you at 19:05.")
    listed = (await bot.tg_say("/tasks"))["shown"]
    assert f"Your open tasks ({TOKYO}):" in listed and "Call mum — " in listed and "19:05" in listed
    outboxes = {"telegram": bot.telegram, "discord": bot.discord}
    assert await engine(pool, clock, outboxes).tick() == 0  # not yet
    clock.advance(minutes=5)
    tg_before, dc_before = len(bot.tg.sent), len(bot.dc.sent)
    assert await engine(pool, clock, outboxes).tick() == 1
    assert await engine(pool, clock, outboxes, "b").tick() == 0  # another process: nothing left to send
    [reminder] = bot.dc.sent[dc_before:]
    assert reminder["channel_id"] == bot.dc.dm_channel_id(ANN_DC)
    assert reminder["content"] == "⏰ Call mum — due 19:05"
    assert len(bot.tg.sent) == tg_before  # not on Telegram

    # 3. memory written on Telegram is in the system prompt of the next request from the Discord DM
    line = f"Drinks {ANN_WORDS} tea"
    bot.llm.script(cheap(tools=[("core_memory_append", {"block": "human", "content": line})]), cheap("Noted."))
    assert (await bot.tg_say("remember: I drink zebraquartz tea"))["shown"].startswith("Noted.")
    bot.llm.script(cheap("Tea, I know."))
    assert (await bot.dc_say("what do I drink?")).startswith("Tea, I know.")
    prompt = bot.llm.requests[-1]["messages"][0]
    assert prompt["role"] == "system" and line in prompt["content"] and bob_line not in prompt["content"]
    # and one more reminder, made on Telegram, still waiting when she leaves
    bot.llm.script(
        cheap(tools=[("manage_tasks", {"action": "create", "title": "Water plants", "due_at": "2026-11-21T20:00"})]),
        cheap("Sure."),
    )
    await bot.tg_say("remind me to water the plants at 20:00")

    # 5. /export on Telegram holds both identities and the messages of both
    before = len(bot.tg.sent)
    bot.tg.push_update(bot.tg.message_update("/export", chat_id=ANN_TG, user_id=ANN_TG, first_name=ANN_NAME))
    [sent] = await until_sent(bot.tg, before + 1)
    assert sent["chat_id"] == ANN_TG and sent["message"]["document"]["file_name"].endswith(".json")
    exported = sent["document_data"].decode()
    data = json.loads(exported)
    assert [(i["platform"], i["platform_user_id"]) for i in data["identities"]] == [
        ("telegram", str(ANN_TG)),
        ("discord", str(ANN_DC)),
    ]
    said = {(c["platform"], m["content"]) for c in data["chats"] for m in c["messages"] if m["role"] == "user"}
    assert {
        ("telegram", f"{ANN_WORDS} hello from telegram"),
        ("telegram", "remember: I drink zebraquartz tea"),
        ("discord", f"{ANN_WORDS} remind me to call mum at 19:05"),
        ("discord", "what do I drink?"),
    } <= said
    tasks = {t["title"]: t for t in data["tasks"]}
    assert tasks["Call mum"]["created_by"] == f"discord:{ANN_DC}"
    assert [o["status"] for o in tasks["Call mum"]["occurrences"]] == ["delivered"]
    assert tasks["Water plants"]["created_by"] == f"telegram:{ANN_TG}" and tasks["Water plants"]["occurrences"] == []
    assert data["memory"]["blocks"][0]["lines"] == [line]
    assert BOB_WORDS not in exported and str(BOB_TG) not in exported

    # 5. then /forget_me in the Discord DM, with its button: nothing of Ann is left in any table, Bob keeps his data
    await bot.core.spending.flush()
    bob_before = tables_of(await traces(pool, [BOB_WORDS], []))
    ann_ids = [ann, *[r["id"] for r in await pool.fetch("SELECT id FROM users WHERE account_id = $1", ann)]]
    needles = (ANN_WORDS, ANN_NAME, str(ANN_TG), str(ANN_DC), bot.dc.dm_channel_id(ANN_DC))
    assert await traces(pool, needles, ann_ids)
    ask = await bot.dc_slash("forget_me")
    assert ask.ephemeral and "cannot be undone" in ask.texts()[0]
    assert "2 identities, " in ask.texts()[0] and " 2 tasks, 1 memory line" in ask.texts()[0]
    assert ask.message is not None
    done = await (
        await bot.dc.click(ask.message, f"forget:{ANN_DC}", bot.dc.user(ANN_DC, ANN_NAME), dm=True)
    ).wait_done()
    assert done.texts()[0].startswith("Done — I deleted your account")
    await until(lambda: bot.core.inbox.held == 0)
    assert await traces(pool, needles, ann_ids) == []
    assert tables_of(await traces(pool, [BOB_WORDS], [])) == bob_before
    assert set(await accounts(pool)) == {("telegram", str(BOB_TG)), ("discord", str(BOB_DC))}
    # her waiting reminder never comes; Bob's memory is still in his Discord prompt
    clock.advance(hours=1)  # 20:05 in Tokyo
    tg_before, dc_before = len(bot.tg.sent), len(bot.dc.sent)
    assert await engine(pool, clock, outboxes).tick() == 0
    assert (len(bot.tg.sent), len(bot.dc.sent)) == (tg_before, dc_before)
    bot.llm.script(cheap("Hi Bob."))
    assert (await bot.dc_say("hello again", user=BOB_DC, name=BOB_NAME)).startswith("Hi Bob.")
    assert bob_line in bot.llm.requests[-1]["messages"][0]["content"]


async def test_the_daily_budget_is_the_accounts_on_every_platform_and_resets_at_midnight_in_its_zone(
    bot: Bot, clock: FakeClock
) -> None:
    await link(bot)
    said = await bot.dc_slash("timezone", {"zone": TOKYO})  # set on Discord: the account's zone
    assert TOKYO in said.texts()[0]
    bot.llm.script(  # a plain reminder for later (two calls of 10 tokens)
        cheap(tools=[("manage_tasks", {"action": "create", "title": "Stretch", "due_at": "2026-11-21T19:30"})]),
        cheap("Sure."),
    )
    await bot.dc_say("remind me to stretch at 19:30")
    # Ann spends her day on Telegram (19:00 in Tokyo)
    bot.llm.script(Reply(text="Here is a long answer.", usage=used(1400, 100)))
    assert (await bot.tg_say("tell me everything"))["shown"].startswith("Here is a long answer.")
    requests = await bot.requests_made()
    limit_line = "You have used your daily budget: 1,520 of 1,000 tokens. It resets at 00:00 (in 5 h)."
    assert await bot.dc_say("and on discord?") == limit_line  # the budget is the account's
    assert (await bot.tg_say("and here?"))["shown"] == limit_line
    assert await bot.requests_made() == requests  # no model request was made
    usage = await bot.dc_slash("usage")  # the Telegram spending, shown on Discord
    assert "fake-model: 1,520 tokens" in usage.texts()[0] and f"({TOKYO})" in usage.texts()[0]
    # Bob's budget is his own
    bot.llm.script(cheap("Hi Bob."))
    assert (await bot.dc_say("hello", user=BOB_DC, name=BOB_NAME)).startswith("Hi Bob.")
    requests = await bot.requests_made()
    # a plain reminder never uses the model: it still arrives, in the DM where it was made
    clock.now = datetime(2026, 11, 21, 10, 30, tzinfo=UTC)
    assert await engine(bot.core.pool, clock, {"telegram": bot.telegram, "discord": bot.discord}).tick() == 1
    reminder = bot.dc.sent[-1]
    assert reminder["content"] == "⏰ Stretch — due 19:30" and reminder["channel_id"] == bot.dc.dm_channel_id(ANN_DC)
    # one minute before midnight in Tokyo it still holds; after it, the model answers again (on either platform)
    clock.now = datetime(2026, 11, 21, 14, 59, tzinfo=UTC)
    assert await bot.dc_say("still?") == limit_line.replace("(in 5 h)", "(in 1 min)")
    assert await bot.requests_made() == requests
    clock.now = datetime(2026, 11, 21, 15, 0, 30, tzinfo=UTC)  # 00:00:30 on the 22nd in Tokyo
    bot.llm.script(cheap("Good morning!"))
    assert (await bot.dc_say("good morning")).startswith("Good morning!")
    assert await bot.requests_made() == requests + 1
