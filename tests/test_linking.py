"""Linking identities into one account (/link, /link CODE, /unlink; core/accounts/linking.py and merge.py, sql/021):
the merge, both sides told, codes that expire and work once, the lock after wrong codes, and the attacks: guessing,
strangers, admin rights, racing links, linking while a turn runs, and isolation between linked people."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from adapters.discord.adapter import DiscordAdapter
from adapters.telegram import TelegramAdapter
from core.accounts.linking import (
    ALREADY,
    BUSY,
    LOCKED,
    NOT_A_CODE,
    ONLY_IN_PRIVATE,
    OWN_CODE,
    RETIRED,
    UNLINK_USAGE,
)
from core.front_door import Core
from core.reminders.engine import DeliveryRefused
from core.reminders.messages import ReminderMessage
from core.storage.db import Pool
from core.types import Error, Incoming
from tests.conftest import FakeClock, MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import answer, incoming, run, tool_names

ADMIN_TOOLS = {"execute_sql", "write_capability", "manage_capability", "restart"}
CODE = re.compile(r"\b([2-9A-Z]{4}-[2-9A-Z]{4})\b")
WRONG_START = "That code is wrong, expired or already used."


class Recorder:
    """An outbox that keeps what it is given (or refuses it)."""

    def __init__(self, refuse: str | None = None) -> None:
        """Record, or refuse every message with `refuse`."""
        self.sent: list[ReminderMessage] = []
        self.refuse = refuse

    async def send_reminder(self, msg: ReminderMessage) -> str | None:
        """Keep the message (or refuse it for good)."""
        if self.refuse is not None:
            raise DeliveryRefused(self.refuse)
        self.sent.append(msg)
        return "1"


def tg(user: str = "100", name: str = "Ann", **kw: Any) -> Incoming:
    """A Telegram identity in its private chat."""
    return incoming("", user=user, name=name, **kw)


def dc(user: str = "200", name: str = "ann#0", **kw: Any) -> Incoming:
    """A Discord identity in its DM."""
    return incoming("", user=user, name=name, platform="discord", chat=kw.pop("chat", f"dm{user}"), **kw)


async def say(core: Core, inc: Incoming, name: str, arg: str = "") -> str:
    """A command's text answer."""
    got = await core.command(inc, name, arg)
    assert isinstance(got, str), got
    return got


async def new_code(core: Core, inc: Incoming) -> str:
    """`/link` → the code it shows."""
    found = CODE.search(await say(core, inc, "link"))
    assert found is not None
    return found.group(1)


async def account(pool: Pool, inc: Incoming) -> int:
    """The account an identity belongs to now."""
    got = await pool.fetchval(
        "SELECT account_id FROM users WHERE platform = $1 AND platform_user_id = $2", inc.platform, inc.user_id
    )
    assert isinstance(got, int)
    return got


async def remember(pool: Pool, account_id: int, block: str, *lines: str) -> None:
    """Write a memory block of an account."""
    await pool.execute(
        "INSERT INTO memory_blocks (user_id, name, lines) VALUES ($1, $2, $3)", account_id, block, list(lines)
    )


async def note(pool: Pool, account_id: int, text: str) -> None:
    """Store an archival note of an account (as the memory tool does)."""
    await pool.execute("SELECT * FROM archival_insert($1, $2, now(), gen_random_uuid(), 1000)", account_id, text)


async def task(pool: Pool, account_id: int, title: str, identity: int | None = None) -> None:
    """A task of an account, made by one of its identities."""
    await pool.execute(
        "INSERT INTO tasks (user_id, title, created_by) VALUES ($1, $2, $3)", account_id, title, identity or account_id
    )


async def blocks(pool: Pool, account_id: int) -> dict[str, list[str]]:
    """An account's memory blocks."""
    rows = await pool.fetch("SELECT name, lines FROM memory_blocks WHERE user_id = $1", account_id)
    return {r["name"]: list(r["lines"]) for r in rows}


async def notes(pool: Pool, account_id: int) -> list[tuple[int, str]]:
    """An account's archival notes by number."""
    rows = await pool.fetch(
        "SELECT number, content FROM archival_memory WHERE user_id = $1 ORDER BY number", account_id
    )
    return [(r["number"], r["content"]) for r in rows]


@pytest.fixture
def core(make_core: MakeCore) -> Core:
    """A core that lets everyone in, with a recording Telegram outbox for the issuers' notes."""
    made = make_core(DEFAULT_TIMEZONE="UTC")
    made.outboxes["telegram"] = Recorder()
    return made


@pytest.fixture
async def core_b(core: Core, pool_b: Pool, clock: FakeClock) -> AsyncIterator[Core]:
    """A second process on the same database."""
    other = Core(core.settings, pool_b, core.llm, clock=clock)
    yield other
    await other.drain(0)


def recorded(core: Core) -> list[ReminderMessage]:
    """What the core's Telegram outbox was given."""
    outbox = core.outboxes["telegram"]
    assert isinstance(outbox, Recorder)
    return outbox.sent


async def test_link_merges_the_redeemers_account_into_the_issuers_and_tells_both(
    core: Core, pool: Pool, fake_llm: FakeOpenAI
) -> None:
    ann, ann_dc = tg(), dc()
    await say(core, ann, "timezone", "Europe/Berlin")
    await say(core, ann_dc, "timezone", "Asia/Tokyo")
    kept, merged = await account(pool, ann), await account(pool, ann_dc)
    await remember(pool, kept, "human", "Name: Ann", "Likes tea")
    await remember(pool, merged, "human", "likes  TEA", "Has a cat")  # the same line, spelled differently
    await remember(pool, merged, "projects", "Writing a bot")
    for text in ("note A", "note B"):
        await note(pool, kept, text)
    for text in ("note B", "note C", "Gardening plans"):
        await note(pool, merged, text)
    await task(pool, kept, "Dentist")
    await task(pool, merged, "Call mum")
    await task(pool, merged, "Buy milk")

    code = await new_code(core, ann)
    said = await say(core, ann_dc, "link", code.lower().replace("-", " "))  # any case, a space for the dash
    summary = (
        "merged 2 memory lines, 2 archival notes and 2 tasks (2 duplicates left out); time zone Europe/Berlin kept."
    )
    assert said.startswith(f"🔗 Linked with `telegram:100` (Ann): you are one account now — {summary}")
    [told] = recorded(core)  # the issuer, in the private chat where they asked
    assert (told.platform, told.chat_id, told.chat_kind, told.buttons) == ("telegram", "100", "private", ())
    assert told.text.startswith(f"🔗 `discord:200` (ann#0) used your link code: you are one account now — {summary}")

    assert await account(pool, ann_dc) == kept
    assert await pool.fetchval("SELECT count(*) FROM accounts WHERE id = $1", merged) == 0
    assert await blocks(pool, kept) == {"human": ["Name: Ann", "Likes tea", "Has a cat"], "projects": ["Writing a bot"]}
    assert await notes(pool, kept) == [(1, "note A"), (2, "note B"), (3, "note C"), (4, "Gardening plans")]
    assert await pool.fetchval("SELECT timezone FROM accounts WHERE id = $1", kept) == "Europe/Berlin"
    assert await pool.fetchval(
        "SELECT count(*) FROM memory_search_words WHERE user_id = $1 AND word = 'gardening'", kept
    )
    made_by = await pool.fetch("SELECT title, created_by FROM tasks WHERE user_id = $1 ORDER BY id", kept)
    assert [(r["title"], r["created_by"]) for r in made_by] == [
        ("Dentist", kept),
        ("Call mum", merged),
        ("Buy milk", merged),
    ]
    listed = await say(core, ann, "tasks")  # on Telegram: the tasks made on Discord too
    assert all(title in listed for title in ("Dentist", "Call mum", "Buy milk"))
    # memory written on Telegram is in the Discord DM's prompt
    fake_llm.script(Reply(text="hi"))
    answer(await run(core, incoming("hello", user="200", platform="discord", chat="dm200")))
    prompt = fake_llm.requests[-1]["messages"][0]["content"]
    assert "Name: Ann" in prompt and "Has a cat" in prompt and "Europe/Berlin" in prompt


async def test_the_time_zone_comes_from_the_redeemer_only_when_the_issuer_has_none_and_overflow_becomes_notes(
    make_core: MakeCore, pool: Pool
) -> None:
    core = make_core(MEMORY_BLOCK_WORDS=10)
    ann, ann_dc = tg(), dc()
    await say(core, ann_dc, "timezone", "Asia/Tokyo")
    code = await new_code(core, ann)
    kept, merged = await account(pool, ann), await account(pool, ann_dc)
    await remember(pool, kept, "human", "one two three four five six seven eight")
    await remember(pool, merged, "human", "nine ten", "eleven twelve")
    said = await say(core, ann_dc, "link", code)
    assert (
        "merged 1 memory line; time zone Asia/Tokyo taken over from the joining account. 1 memory line did not fit in"
        " 10 words of a block: it was kept as an archival note." in said
    )
    assert await blocks(pool, kept) == {"human": ["one two three four five six seven eight", "nine ten"]}
    assert await notes(pool, kept) == [(1, "[human] eleven twelve")]
    assert await pool.fetchval("SELECT timezone FROM accounts WHERE id = $1", kept) == "Asia/Tokyo"


async def test_link_lists_the_identities_and_unlink_separates_one_with_an_empty_account(core: Core, pool: Pool) -> None:
    ann, ann_dc = tg(), dc()
    await say(core, ann, "timezone", "Europe/Berlin")
    shown = await say(core, ann, "link")
    assert shown.endswith("Linked to this account now:\n- `telegram:100` (Ann) — this one")
    await say(core, ann_dc, "link", CODE.findall(shown)[0])
    kept = await account(pool, ann)
    await task(pool, kept, "Dentist")
    await remember(pool, kept, "human", "Name: Ann")
    listed = await say(core, ann_dc, "link")
    assert listed.endswith("Linked to this account now:\n- `telegram:100` (Ann)\n- `discord:200` (ann#0) — this one")

    assert await say(core, ann, "unlink") == UNLINK_USAGE
    assert "`discord:999` is not linked to your account" in await say(core, ann, "unlink", "discord:999")
    said = await say(core, ann, "unlink", "discord:200")
    assert said.startswith("Separated `discord:200` (ann#0): it starts again with an empty account of its own")
    assert "(time zone Europe/Berlin)" in said
    alone = await account(pool, ann_dc)
    assert alone != kept
    assert await pool.fetchval("SELECT timezone FROM accounts WHERE id = $1", alone) == "Europe/Berlin"
    assert "You have no open tasks" in await say(core, ann_dc, "tasks")
    assert "Name: Ann" not in await say(core, ann_dc, "memory")
    assert "Dentist" in await say(core, ann, "tasks") and "Name: Ann" in await say(core, ann, "memory")
    assert await say(core, ann, "unlink", "telegram:100") == (
        "`telegram:100` is the only identity of your account: there is nothing to separate it from."
    )
    # separating the identity one speaks from
    await say(core, ann_dc, "link", await new_code(core, ann))
    said = await say(core, ann_dc, "unlink", "`discord:200`")
    assert said.startswith("Separated `discord:200` (ann#0) — this one: from now on it has an empty account")
    assert "stay with the account of `telegram:100` (Ann)" in said
    assert await account(pool, ann_dc) != kept


async def test_whoami_says_the_id_to_allow_the_linked_accounts_and_the_zone(core: Core, pool: Pool) -> None:
    ann, ann_dc = tg(), dc()
    alone = await say(core, ann, "whoami")
    assert alone == (
        "You are `telegram:100` (Ann): the id ALLOWED_USERS and ADMINS name.\n"
        "No other platform is linked (/link does it).\nTime zone: UTC."
    )
    await say(core, ann, "timezone", "Europe/Berlin")
    await say(core, ann_dc, "link", await new_code(core, ann))
    said = await say(core, ann_dc, "whoami")
    assert said.splitlines() == [
        "You are `discord:200` (ann#0): the id ALLOWED_USERS and ADMINS name.",
        "Linked: `telegram:100`.",
        "Time zone: Europe/Berlin.",
    ]
    boss = await say(core, incoming("", user="local", platform="console"), "whoami")
    assert boss.endswith("You are an admin here.")  # the terminal's user


async def test_link_and_unlink_only_in_a_private_chat_and_no_code_in_a_group(core: Core, pool: Pool) -> None:
    code = await new_code(core, tg())
    in_group = tg(chat="-50", kind="group")
    assert await say(core, in_group, "link") == ONLY_IN_PRIVATE.format(command="/link")
    assert await say(core, dc(chat="g1", kind="group"), "link", "ZZZZ-ZZZZ") == "Send /link to me in a private chat."
    assert await say(core, in_group, "unlink", "discord:200") == "Send /unlink to me in a private chat."
    assert await pool.fetchval("SELECT count(*) FROM link_codes") == 1  # none made in the group
    leaked = await say(core, dc(chat="g1", kind="group"), "link", code)  # a code sent in a group: anyone saw it
    assert leaked == "Send /link to me in a private chat." + RETIRED
    assert (await say(core, dc(), "link", code)).startswith(WRONG_START)
    assert await pool.fetchval("SELECT count(*) FROM link_codes") == 0


async def test_a_code_works_once_within_ten_minutes_and_never_for_its_own_account(
    core: Core, pool: Pool, clock: FakeClock
) -> None:
    ann = tg()
    code = await new_code(core, ann)
    assert await say(core, ann, "link", code) == OWN_CODE
    clock.advance(minutes=10)
    assert (await say(core, dc(), "link", code)).startswith(WRONG_START)  # expired
    code = await new_code(core, ann)
    clock.advance(minutes=9, seconds=59)
    assert (await say(core, dc(), "link", code)).startswith("🔗 Linked")
    assert await say(core, dc(), "link", code) == ALREADY  # the same code again: already linked, not a wrong try
    assert (await say(core, dc("300", "bob"), "link", code)).startswith(WRONG_START)  # used
    wrong = await pool.fetch(
        "SELECT u.platform_user_id AS who, wrong FROM link_tries t JOIN users u ON u.id = t.user_id"
    )
    assert {r["who"]: r["wrong"] for r in wrong} == {"100": 0, "200": 0, "300": 1}  # own code, ALREADY: no try


async def test_five_wrong_codes_lock_linking_for_an_hour_across_processes(
    core: Core, core_b: Core, pool: Pool, clock: FakeClock
) -> None:
    code = await new_code(core, tg())
    mallory = dc("666", "mallory")
    assert await say(core, mallory, "link", "hello") == NOT_A_CODE  # cannot be a code: not counted
    for i in range(4):
        guessed = await say(core if i % 2 else core_b, mallory, "link", "AAAA-AAA" + "23456789"[i])
        left = 4 - i
        assert guessed == f"{WRONG_START} {left} more wrong {'try' if left == 1 else 'tries'} lock linking for an hour."
    locked = await say(core_b, mallory, "link", "BBBB-BBBB")
    assert locked == f"{WRONG_START[:-1]} — too many wrong codes: linking is locked until 11:00 UTC."
    assert await say(core, mallory, "link", code) == LOCKED.format(until="11:00 UTC")  # even the right code
    assert await pool.fetchval("SELECT count(*) FROM link_codes WHERE used_at IS NOT NULL") == 0
    clock.advance(hours=1)
    assert (await say(core, mallory, "link", await new_code(core, tg()))).startswith("🔗 Linked")


async def test_wrong_codes_guessed_at_once_still_lock_after_five(core: Core, core_b: Core) -> None:
    mallory = dc("666", "mallory")
    guesses = [f"CCCC-CC{a}{b}" for a in "23" for b in "2345"]
    said = await asyncio.gather(*(say(core if i % 2 else core_b, mallory, "link", g) for i, g in enumerate(guesses)))
    assert sum(s.startswith(WRONG_START) and "more wrong" in s for s in said) == 4
    assert sum("too many wrong codes: linking is locked" in s for s in said) == 1
    assert sum(s.startswith("Too many wrong codes") for s in said) == 3


async def test_wrong_codes_older_than_the_lock_time_are_forgotten(core: Core, clock: FakeClock) -> None:
    mallory = dc("666", "mallory")
    for _ in range(4):
        await say(core, mallory, "link", "DDDD-DDDD")
    clock.advance(hours=1, seconds=1)
    assert (await say(core, mallory, "link", "DDDD-DDDD")).endswith("4 more wrong tries lock linking for an hour.")


async def test_a_stranger_cannot_link(make_core: MakeCore, pool: Pool) -> None:
    core = make_core(ALLOWED_USERS="telegram:100")
    code = await new_code(core, tg())
    eve = dc("666", "eve")
    refused = await core.command(eve, "link", code, must_answer=True)
    assert isinstance(refused, Error) and refused.code == "not_allowed" and "discord:666" in refused.message
    assert isinstance(await core.command(eve, "link", code), Error | None)
    assert isinstance(await core.command(eve, "link", "", must_answer=True), Error)
    assert await pool.fetchval("SELECT count(*) FROM users WHERE platform = 'discord'") == 0
    assert await pool.fetchval("SELECT count(*) FROM link_codes WHERE used_at IS NULL") == 1


async def test_a_linked_identity_of_an_admin_gets_no_admin_tools(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(ADMINS="telegram:1", ALLOWED_USERS="*")
    root, root_dc = tg("1", "Root"), dc("2", "root#0")
    assert (await say(core, root_dc, "link", await new_code(core, root))).startswith("🔗 Linked")
    assert await account(pool, root_dc) == await account(pool, root)
    fake_llm.script(Reply(text="hi"), Reply(text="hi"))
    answer(await run(core, incoming("hello", user="2", platform="discord", chat="dm2")))
    answer(await run(core, incoming("hello", user="1")))
    assert not ADMIN_TOOLS & set(tool_names(fake_llm.requests[0]))  # the Discord identity is not in ADMINS
    assert ADMIN_TOOLS <= set(tool_names(fake_llm.requests[1]))
    assert "core_memory_append" in tool_names(fake_llm.requests[0])  # the same person: their memory is theirs


async def waiters(pool: Pool, n: int, *, not_by: int | None = None) -> None:
    """Wait until `n` backends of the test database wait for a lock held by someone (`not_by`: none of them for one
    held by that backend), at most 5 s."""
    for _ in range(500):
        rows = await pool.fetch(
            "SELECT pg_blocking_pids(pid) AS by FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if len(rows) >= n and all(r["by"] and not_by not in r["by"] for r in rows):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} backends did not wait for a lock within 5 s")


async def test_the_same_code_sent_by_two_identities_at_once_links_exactly_one(
    core: Core, core_b: Core, pool: Pool, db_dsn: str
) -> None:
    ann, bob, carl = tg(), dc("200", "bob"), dc("300", "carl")
    code = await new_code(core, ann)
    await say(core, bob, "tasks")
    await say(core, carl, "tasks")
    holder = await asyncpg.connect(db_dsn)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", await account(pool, ann))
        racing = asyncio.gather(say(core, bob, "link", code), say(core_b, carl, "link", code))
        await waiters(pool, 2)
        await tx.rollback()
        said = await racing
    finally:
        await holder.close()
    assert said[0].startswith("🔗 Linked") != said[1].startswith("🔗 Linked")  # exactly one of them
    assert any(s.startswith(WRONG_START) for s in said)
    members = await pool.fetchval("SELECT count(*) FROM users WHERE account_id = $1", await account(pool, ann))
    assert members == 2


async def test_two_links_crosswise_at_once_end_in_one_account_without_a_deadlock(
    core: Core, core_b: Core, pool: Pool, db_dsn: str
) -> None:
    ann, ann_dc = tg(), dc()
    from_tg, from_dc = await new_code(core, ann), await new_code(core, ann_dc)
    first, second = sorted([await account(pool, ann), await account(pool, ann_dc)])
    # one holder per account row: released one after the other, a link that took them in another order than the other
    # link (the first row its own, say) would hold one and wait for the other's: a deadlock, every time
    holders = [await asyncpg.connect(db_dsn) for _ in range(2)]
    try:
        held = [h.transaction() for h in holders]
        for holder, tx, row in zip(holders, held, (first, second), strict=True):
            await tx.start()
            await holder.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", row)
        racing = asyncio.gather(say(core, ann, "link", from_dc), say(core_b, ann_dc, "link", from_tg))
        await waiters(pool, 2)
        await held[0].rollback()
        await waiters(pool, 2, not_by=holders[0].get_server_pid())  # both wait again, now for the second row
        await held[1].rollback()
        said = await racing
    finally:
        for holder in holders:
            await holder.close()
    assert sum(s.startswith("🔗 Linked") for s in said) == 1 and ALREADY in said
    assert await account(pool, ann) == await account(pool, ann_dc)
    assert await pool.fetchval("SELECT count(*) FROM accounts WHERE id = ANY($1)", [first, second]) == 1


async def test_linking_while_a_turn_of_the_redeemer_runs_waits_for_it_and_loses_nothing(
    core: Core, pool: Pool, fake_llm: FakeOpenAI
) -> None:
    ann, ann_dc = tg(), dc()
    code = await new_code(core, ann)
    asked, go = asyncio.Event(), asyncio.Event()

    async def slow(_: dict[str, Any]) -> Reply:
        asked.set()
        await go.wait()
        return Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Water plants"})])

    fake_llm.script(slow, Reply(text="Noted."))
    turn = asyncio.create_task(
        run(core, incoming("note: water plants", user="200", platform="discord", chat="g1", kind="group"))
    )
    await asyncio.wait_for(asked.wait(), 5)
    said = await say(core, ann_dc, "link", code)
    assert said == BUSY.format(where="discord", code=code, until="10:10 UTC")
    go.set()
    answer(await turn)
    assert (await say(core, ann_dc, "link", code)).startswith(
        "🔗 Linked with `telegram:100` (Ann): you are one account now — merged 1 task"
    )
    assert "Water plants" in await say(core, ann, "tasks")


async def test_the_link_stands_when_the_issuer_cannot_be_told(
    core: Core, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    core.outboxes["telegram"] = Recorder(refuse="Telegram: bot was blocked by the user")
    assert (await say(core, dc(), "link", await new_code(core, tg()))).startswith("🔗 Linked")
    assert any("telling telegram:100 failed" in r.getMessage() for r in caplog.records)
    del core.outboxes["telegram"]  # no Telegram in this process
    assert (await say(core, dc("300", "bob"), "link", await new_code(core, tg()))).startswith("🔗 Linked")
    assert any("telegram:100 cannot be told" in r.getMessage() for r in caplog.records)
    assert await pool.fetchval("SELECT count(DISTINCT account_id) FROM users") == 1


async def test_two_people_each_linked_on_two_platforms_see_only_their_own(
    core: Core, pool: Pool, fake_llm: FakeOpenAI
) -> None:
    ann, ann_dc, bob, bob_dc = tg(), dc(), tg("300", "Bob"), dc("400", "bob#0")
    await say(core, ann_dc, "link", await new_code(core, ann))
    await say(core, bob_dc, "link", await new_code(core, bob))
    await remember(pool, await account(pool, ann), "human", "Ann's secret")
    await remember(pool, await account(pool, bob), "human", "Bob's secret")
    for who, title in ((ann_dc, "Ann's task"), (bob, "Bob's task")):
        fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "create", "title": title})]), Reply(text="ok"))
        answer(await run(core, incoming("a task", user=who.user_id, platform=who.platform, chat=who.chat_id)))
    for inc, mine, theirs in ((ann, "Ann", "Bob"), (ann_dc, "Ann", "Bob"), (bob, "Bob", "Ann"), (bob_dc, "Bob", "Ann")):
        listed, memory = await say(core, inc, "tasks"), await say(core, inc, "memory")
        assert f"{mine}'s task" in listed and f"{theirs}'s task" not in listed
        assert f"{mine}'s secret" in memory and f"{theirs}'s secret" not in memory
        fake_llm.script(Reply(text="hi"))
        answer(await run(core, incoming("hi", user=inc.user_id, platform=inc.platform, chat=inc.chat_id)))
        prompt = fake_llm.requests[-1]["messages"][0]["content"]
        assert f"{mine}'s secret" in prompt and f"{theirs}'s secret" not in prompt


async def test_link_through_the_fake_telegram_and_discord(
    tg: FakeTelegram, dc: FakeDiscord, fake_llm: FakeOpenAI, make_core: MakeCore
) -> None:
    core = make_core(
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.base_url,
        DISCORD_BOT_TOKEN=dc.token,
        DISCORD_API_BASE_URL=dc.api_base,
        DISCORD_GATEWAY_URL=dc.gateway_url,
        DEFAULT_TIMEZONE="Europe/Berlin",
    )
    telegram = TelegramAdapter(core, core.settings, poll_timeout=1)
    discord = DiscordAdapter(core, core.settings, guild_ready_timeout=0.05)
    await telegram.start()
    await discord.start()
    alice = dc.user(2001, "Alice")
    try:
        async with core.running({"telegram": telegram, "discord": discord}):
            tg.push_update(tg.message_update("/link@test_bot", chat_id=-100, chat_type="supergroup"))
            [in_group] = await tg.wait_sent(1)
            assert in_group["chat_id"] == -100 and in_group["text"] == "Send /link to me in a private chat."
            tg.push_update(tg.message_update("/link"))
            shown = (await tg.wait_sent(2))[1]
            found = CODE.search(shown["text"])
            assert shown["chat_id"] == 1001 and found is not None
            slash = await (await dc.slash("link", {"code": found.group(1)}, alice, dm=True)).wait_done()
            assert slash.texts()[0].startswith("🔗 Linked with `telegram:1001` (Ann): you are one account now")
            told = (await tg.wait_sent(3))[2]
            assert (
                told["chat_id"] == 1001
                and "discord:2001" in told["text"]
                and "(Alice) used your link code" in told["text"]
            )
            assert "reply_markup" not in told
            # a task made on Discord is listed on Telegram
            fake_llm.script(
                Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum"})]), Reply(text="Will do.")
            )
            await dc.post_message(alice, "remind me to call mum", dm=True)
            await dc.wait_sent(1)
            tg.push_update(tg.message_update("/tasks"))
            assert "Call mum" in (await tg.wait_sent(4))[3]["text"]
    finally:
        await discord.stop()
        await telegram.stop()


async def test_a_link_or_an_unlink_never_lifts_an_admins_budget(core: Core, pool: Pool) -> None:
    ann, ann_dc = tg(), dc()
    await say(core, ann_dc, "tasks")
    await pool.execute(
        "UPDATE accounts SET daily_tokens = 1000, model = 'small' WHERE id = $1", await account(pool, ann_dc)
    )
    await say(core, ann_dc, "link", await new_code(core, ann))  # merged into an account without a budget of its own
    kept = await pool.fetchrow("SELECT daily_tokens, model FROM accounts WHERE id = $1", await account(pool, ann))
    assert kept is not None and (kept["daily_tokens"], kept["model"]) == (1000, "small")
    await say(core, ann, "unlink", "discord:200")
    assert await pool.fetchval("SELECT daily_tokens FROM accounts WHERE id = $1", await account(pool, ann_dc)) == 1000
