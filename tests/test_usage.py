"""Token usage and spending limits (issue 21): every model call's usage per account and model, the budgets checked
before each call (daily in the account's zone, monthly, the bot's daily), agent jobs falling back to their plain text,
/usage, /budget, the admins' /status line, and a budget raced by two processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from adapters.telegram import TelegramAdapter
from core.accounts.usage import BUDGET_ADMINS_ONLY, BUDGET_USAGE, WEB_SPENT
from core.agent.llm import LLM
from core.front_door import Core
from core.storage import conversations
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore, MakeSettings
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import answer, final, incoming, run
from tests.test_reminders import Outbox, create, engine


def used(prompt: int, completion: int = 0, cached: int = 0) -> dict[str, Any]:
    """The usage a scripted reply reports."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def usage_rows(core: Core) -> list[tuple[int, str, str, int, int, int, int]]:
    """(account, day, model, prompt, completion, cached, calls) summed per account, day and model, once written."""
    await core.spending.flush()
    rows = await core.pool.fetch(
        "SELECT account_id, day::text AS day, model, sum(prompt_tokens) AS p, sum(completion_tokens) AS c,"
        " sum(cached_tokens) AS k, sum(calls) AS n FROM token_usage GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )
    return [(r["account_id"], r["day"], r["model"], r["p"], r["c"], r["k"], r["n"]) for r in rows]


async def account_of(pool: Pool, platform: str, uid: str) -> int:
    """The account id of an identity."""
    found = await pool.fetchval(
        "SELECT account_id FROM users WHERE platform = $1 AND platform_user_id = $2", platform, uid
    )
    assert found is not None
    return int(found)


# ---- recording


async def test_a_streamed_answer_records_its_usage_per_account_and_model_with_cached_tokens(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core()
    fake_llm.script(Reply(text="Hello there", usage=used(900, 40, cached=512)))
    assert answer(await run(core, incoming("hi"), stream=True)).text == "Hello there"
    assert fake_llm.requests[-1]["stream_options"] == {"include_usage": True}  # a stream asks for its usage
    # a whole (not streamed) answer, a tool step and the corrective retry of an empty reply count as calls too
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "list"})], usage=used(1000, 20)),
        Reply(text="", usage=used(1100, 1)),
        Reply(text="Nothing open.", usage=used(1200, 5, cached=1024)),
    )
    assert answer(await run(core, incoming("my list?"))).text == "Nothing open."
    ann = await account_of(pool, "telegram", "100")
    assert await usage_rows(core) == [(ann, "2026-11-21", "fake-model", 4200, 66, 1536, 4)]
    # another model (as a person's /model choice would use) has rows of its own; another person too
    other = make_core(LLM_MODEL="other-model")
    fake_llm.script(Reply(text="ok", usage=used(300, 7)), Reply(text="ok", usage=used(10, 1)))
    answer(await run(other, incoming("again")))
    answer(await run(other, incoming("hello", user="200")))
    bob = await account_of(pool, "telegram", "200")
    assert await usage_rows(other) == [
        (ann, "2026-11-21", "fake-model", 4200, 66, 1536, 4),
        (ann, "2026-11-21", "other-model", 300, 7, 0, 1),
        (bob, "2026-11-21", "other-model", 10, 1, 0, 1),
    ]
    bot = await pool.fetchrow("SELECT day::text, prompt_tokens, completion_tokens, calls FROM token_usage_bot")
    assert bot is not None and tuple(bot) == ("2026-11-21", 4510, 74, 6)


async def test_a_server_that_reports_no_usage_breaks_nothing(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(USER_DAILY_TOKENS="1000")
    fake_llm.send_usage = False
    fake_llm.script(Reply(text="streamed"), Reply(tool_calls=[("manage_tasks", {"action": "list"})]), Reply(text="ok"))
    assert answer(await run(core, incoming("hi"), stream=True)).text == "streamed"
    assert answer(await run(core, incoming("list?"))).text == "ok"
    assert await usage_rows(core) == []
    assert await pool.fetchval("SELECT count(*) FROM token_reservations") == 0  # every admitted call was let go


async def test_a_server_that_refuses_stream_options_is_asked_without_them(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core()
    fake_llm.script(
        Reply(status=400, text="property 'stream_options' is unsupported, did you mean 'stream'?"),  # Groq's answer
        Reply(text="streamed anyway"),
        Reply(text="and again"),
    )
    assert answer(await run(core, incoming("hi"), stream=True)).text == "streamed anyway"
    assert answer(await run(core, incoming("more"), stream=True)).text == "and again"
    assert ["stream_options" in r for r in fake_llm.requests] == [True, False, False]  # never asked again


async def test_a_failed_usage_write_is_logged_and_the_answer_still_arrives(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    core = make_core()
    await pool.execute("ALTER TABLE token_usage ADD CONSTRAINT refuse_all CHECK (calls < 0) NOT VALID")
    fake_llm.script(Reply(text="still here", usage=used(10, 2)))
    assert answer(await run(core, incoming("hi"), stream=True)).text == "still here"
    assert await usage_rows(core) == []
    assert any("token usage not recorded" in r.getMessage() for r in caplog.records)


# ---- budgets


async def test_past_the_daily_budget_the_model_is_not_called_and_one_line_says_so(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core(USER_DAILY_TOKENS="1,000")
    fake_llm.script(Reply(text="first", usage=used(1100, 100)))  # under the budget when it starts: one call over
    assert answer(await run(core, incoming("hi"))).text == "first"
    await core.spending.flush()
    requests = len(fake_llm.requests)
    refused = final(await run(core, incoming("and now?"), stream=True))
    assert (refused.type, refused.message) == (  # type: ignore[union-attr]
        "error",
        "You have used your daily budget: 1,200 of 1,000 tokens. It resets at 00:00 (in 14 h).",
    )
    assert len(fake_llm.requests) == requests  # no model call
    fake_llm.script(Reply(text="yours", usage=used(10)))
    assert answer(await run(core, incoming("hi", user="200"))).text == "yours"  # another person's budget is theirs


async def test_the_daily_budget_resets_at_midnight_in_the_accounts_time_zone(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_core(USER_DAILY_TOKENS="1000")
    assert "Asia/Tokyo" in str(await core.command(incoming("/timezone"), "timezone", "Asia/Tokyo"))
    fake_llm.script(Reply(text="first", usage=used(1500)))  # 19:00 in Tokyo
    answer(await run(core, incoming("hi")))
    await core.spending.flush()
    requests = len(fake_llm.requests)
    clock.now = datetime(2026, 11, 21, 14, 59, tzinfo=UTC)  # 23:59 in Tokyo
    refused = final(await run(core, incoming("still?")))
    assert refused.message == (  # type: ignore[union-attr]
        "You have used your daily budget: 1,500 of 1,000 tokens. It resets at 00:00 (in 1 min)."
    )
    assert len(fake_llm.requests) == requests
    clock.now = datetime(2026, 11, 21, 15, 0, 30, tzinfo=UTC)  # 00:00 in Tokyo (still the 21st in UTC)
    fake_llm.script(Reply(text="a new day", usage=used(10)))
    assert answer(await run(core, incoming("now?"))).text == "a new day"


async def test_the_monthly_budget_lasts_until_the_first_of_the_next_month(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_core(USER_MONTHLY_TOKENS="1000", USER_DAILY_TOKENS="5000")
    fake_llm.script(Reply(text="first", usage=used(800, 200)))
    answer(await run(core, incoming("hi")))
    await core.spending.flush()
    clock.now = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)  # another day: the daily budget is fresh, the month is not
    refused = final(await run(core, incoming("still?")))
    assert refused.message == (  # type: ignore[union-attr]
        "You have used your monthly budget: 1,000 of 1,000 tokens. It resets on Tue 1 Dec at 00:00 (in 5 d 14 h)."
    )
    clock.now = datetime(2026, 12, 1, 0, 0, 1, tzinfo=UTC)
    fake_llm.script(Reply(text="December", usage=used(10)))
    assert answer(await run(core, incoming("now?"))).text == "December"


async def test_the_bots_daily_budget_counts_everyone_and_resets_in_the_default_zone(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core(BOT_DAILY_TOKENS="1000", DEFAULT_TIMEZONE="Europe/Berlin")  # 11:00 in Berlin
    fake_llm.script(Reply(text="first", usage=used(700)), Reply(text="second", usage=used(400)))
    answer(await run(core, incoming("hi")))
    answer(await run(core, incoming("hi", user="200")))
    await core.spending.flush()
    requests = len(fake_llm.requests)
    await core.command(incoming("/timezone", user="300"), "timezone", "Asia/Tokyo")
    refused = final(await run(core, incoming("me too?", user="300")))
    assert refused.message == (  # type: ignore[union-attr]  # midnight in Berlin is 08:00 in Tokyo
        "The bot has used its daily budget: 1,100 of 1,000 tokens. It resets at 08:00 (in 13 h)."
    )
    assert len(fake_llm.requests) == requests


async def test_a_budget_crossed_mid_turn_stops_the_tool_loop_and_keeps_what_was_done(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(USER_DAILY_TOKENS="1000")
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk"})], usage=used(1200)),
        Reply(text="never asked"),
    )
    done = answer(await run(core, incoming("remind me to buy milk")))
    assert len(fake_llm.requests) == 1
    assert done.text.startswith(
        "You have used your daily budget: 1,200 of 1,000 tokens. It resets at 00:00 (in 14 h).\n"
        "What I did before stopping:\n- ✅ manage_tasks"
    )
    assert done.cut_short is not None and len(done.steps) == 1
    assert await pool.fetchval("SELECT title FROM tasks") == "Buy milk"


async def test_an_agent_job_over_budget_sends_its_plain_text_and_plain_reminders_still_arrive(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, clock: FakeClock
) -> None:
    core = make_core(USER_DAILY_TOKENS="1000")
    await create(
        core, fake_llm, {"title": "Morning summary", "job": "summarise my tasks", "due_at": "2026-11-21T11:00"}
    )
    await create(core, fake_llm, {"title": "Buy milk", "due_at": "2026-11-21T11:00"})
    await pool.execute(  # the person used their day's tokens since
        "INSERT INTO token_usage (account_id, day, model, prompt_tokens, calls) SELECT account_id, '2026-11-21',"
        " 'fake-model', 5000, 1 FROM users"
    )
    requests = len(fake_llm.requests)
    out = Outbox()
    eng = engine(pool, clock, out, agent=core.answer_text)
    clock.now = datetime(2026, 11, 21, 11, 0, 1, tzinfo=UTC)
    assert await eng.tick() == 1  # the plain reminder
    assert await eng.drain() == 1  # the agent job
    assert sorted(m.text for m in out.sent) == ["⏰ Buy milk — due 11:00", "⏰ Morning summary — due 11:00"]
    assert len(fake_llm.requests) == requests  # neither called the model


# ---- commands


async def test_usage_shows_today_and_this_month_per_model_with_money_and_the_budget_left(
    make_core: MakeCore, fake_llm: FakeOpenAI, clock: FakeClock
) -> None:
    core = make_core(USER_DAILY_TOKENS="100000", LLM_PRICE_INPUT="0.15", LLM_PRICE_OUTPUT="0.6")
    assert await core.command(incoming("/usage"), "usage") == (
        "**Your token usage** (UTC)\n**Today:** nothing yet\n**This month:** nothing yet\n"
        "Budget today: 100,000 of 100,000 tokens left; it resets at 00:00 (in 14 h)."
    )
    fake_llm.script(Reply(text="a", usage=used(20000, 1000, cached=8000)))
    answer(await run(core, incoming("yesterday")))
    clock.now = datetime(2026, 11, 22, 9, 30, tzinfo=UTC)
    fake_llm.script(Reply(text="b", usage=used(3000, 500)), Reply(text="c", usage=used(2000, 250, cached=1000)))
    answer(await run(core, incoming("today")))
    answer(await run(core, incoming("again")))
    await core.spending.flush()
    assert await core.command(incoming("/usage"), "usage") == (
        "**Your token usage** (UTC)\n"
        "**Today:**\n"
        "- fake-model: 5,750 tokens (5,000 prompt, 1,000 of them cached; 750 completion) in 2 calls ≈ 0.0012 USD\n"
        "**This month:**\n"
        "- fake-model: 26,750 tokens (25,000 prompt, 9,000 of them cached; 1,750 completion) in 3 calls"
        " ≈ 0.0048 USD\n"
        "Budget today: 94,250 of 100,000 tokens left; it resets at 00:00 (in 14 h 30 min)."
    )
    plain = make_core(USER_MONTHLY_TOKENS="20000")
    assert str(await plain.command(incoming("/usage", user="300"), "usage")).endswith(
        "Budget this month: 20,000 of 20,000 tokens left; it resets on Tue 1 Dec at 00:00 (in 8 d 14 h)."
    )
    assert str(await make_core().command(incoming("/usage", user="300"), "usage")).endswith(
        "No token budget applies to you."
    )


async def test_budget_is_set_by_admins_only_and_off_restores_the_default(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    core = make_core(ADMINS="telegram:1", USER_DAILY_TOKENS="100000")
    fake_llm.script(Reply(text="hi", usage=used(600)), Reply(text="again"))
    answer(await run(core, incoming("hi", user="100")))  # Ann has written once
    ann = incoming("/budget", user="100")
    assert await core.command(ann, "budget", "telegram:100 999999") == BUDGET_ADMINS_ONLY
    admin = incoming("/budget", user="1")
    assert await core.command(admin, "budget", "telegram:100") == BUDGET_USAGE
    assert await core.command(admin, "budget", "telegram:555 500") == (
        "I don't know telegram:555 yet: they have to write to me once first."
    )
    assert await core.command(admin, "budget", "telegram:100 500") == (
        "The daily budget of telegram:100 (their whole account) is now 500 tokens."
    )
    await core.spending.flush()
    requests = len(fake_llm.requests)
    refused = final(await run(core, incoming("more?", user="100")))
    assert refused.message.startswith("You have used your daily budget: ")  # type: ignore[union-attr]
    assert refused.message.endswith(" of 500 tokens. It resets at 00:00 (in 14 h).")  # type: ignore[union-attr]
    assert len(fake_llm.requests) == requests
    assert await core.command(admin, "budget", {"identity": "telegram:100", "tokens": "off"}) == (
        "The daily budget of telegram:100 is the default again: 100,000 tokens (USER_DAILY_TOKENS)."
    )
    assert answer(await run(core, incoming("now?", user="100"))).type == "assistant"


async def test_status_shows_the_whole_bots_spend_today_to_admins_only(
    make_core: MakeCore, fake_llm: FakeOpenAI
) -> None:
    core = make_core(ADMINS="telegram:1", BOT_DAILY_TOKENS="1000000", LLM_PRICE_INPUT="1", LLM_PRICE_OUTPUT="2")
    fake_llm.script(Reply(text="a", usage=used(400_000, 50_000)), Reply(text="b", usage=used(100_000)))
    answer(await run(core, incoming("hi", user="100")))
    answer(await run(core, incoming("hi", user="200")))
    await core.spending.flush()
    line = "- spend today (UTC): 550,000 tokens of 1,000,000 (BOT_DAILY_TOKENS) in 2 model calls ≈ 0.60 USD"
    assert line in str(await core.command(incoming("/status", user="1"), "status")).splitlines()
    assert "spend today" not in str(await core.command(incoming("/status", user="100"), "status"))


# ---- two processes


async def test_a_budget_raced_by_two_processes_is_passed_by_one_call_at_most(
    make_core: MakeCore,
    make_settings: MakeSettings,
    make_llm: Callable[..., LLM],
    fake_llm: FakeOpenAI,
    pool: Pool,
    pool_b: Pool,
    clock: FakeClock,
) -> None:
    a = make_core(USER_DAILY_TOKENS="100")
    settings = make_settings(USER_DAILY_TOKENS="100")
    b = Core(settings, pool_b, make_llm(settings), clock=clock)  # another process on the same database
    await a.command(incoming("/usage"), "usage")  # Ann exists: six turns of hers start at once in six groups
    turns = 6

    async def respond(body: dict[str, Any]) -> Reply:
        # the first call waits until every turn has started (and checked its budget): a check that let them all
        # through would have them all here by then
        await pool.execute(
            f"DO $$ BEGIN WHILE (SELECT count(*) FROM turns) < {turns} LOOP PERFORM pg_sleep(0.005); END LOOP; END $$"
        )
        return Reply(text="ok", usage=used(60))

    fake_llm.default = respond
    chats = [incoming("go", chat=f"-{i}", kind="group", message_id=str(i)) for i in range(turns)]
    ends = await asyncio.gather(*(run(a if i % 2 else b, inc) for i, inc in enumerate(chats)))
    answered = [final(e) for e in ends]
    assert len(fake_llm.requests) == 2  # 0 → 60 (under 100) → 120: one call over, never more
    assert sorted(x.type for x in answered) == ["assistant"] * 2 + ["error"] * 4
    await b.spending.flush()
    assert sum(r[3] for r in await usage_rows(a)) == 120
    await b.drain(0)


@pytest.mark.parametrize("budget", ["USER_DAILY_TOKENS", "BOT_DAILY_TOKENS"])
async def test_two_processes_admitting_calls_at_the_same_moment_never_both_pass(
    make_core: MakeCore,
    make_settings: MakeSettings,
    make_llm: Callable[..., LLM],
    pool: Pool,
    pool_b: Pool,
    db_dsn: str,
    clock: FakeClock,
    budget: str,
) -> None:
    a = make_core(**{budget: "100"})
    settings = make_settings(**{budget: "100"})
    b = Core(settings, pool_b, make_llm(settings), clock=clock)  # another process
    # the same account in both (its daily budget), or two people (the bot's)
    people = ["100", "100"] if budget == "USER_DAILY_TOKENS" else ["100", "200"]
    for uid in people:
        await a.command(incoming("/usage", user=uid), "usage")
    accounts = [await account_of(pool, "telegram", uid) for uid in people]
    holder = await asyncpg.connect(db_dsn)  # holds the account rows: an admission stops where it writes
    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM accounts WHERE id = ANY($1::bigint[]) FOR UPDATE", accounts)
        both = asyncio.gather(a.spending.admit(accounts[0]), b.spending.admit(accounts[1]))
        await holder.execute(  # both admissions wait (for the row, or for the other admission)
            "DO $$ BEGIN WHILE (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock') < 2 LOOP PERFORM pg_sleep(0.002); PERFORM pg_stat_clear_snapshot();"
            " END LOOP; END $$"
        )
        await holder.execute("ROLLBACK")
        verdicts = await both
    finally:
        await holder.close()
    assert sorted(next(iter(v)) for v in verdicts) == ["busy", "ok"]  # the second waits for the first's usage
    await b.drain(0)


async def test_through_telegram_the_budget_stops_the_model_and_resets_at_midnight_in_the_persons_zone(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore, clock: FakeClock
) -> None:
    core = make_core(TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, USER_DAILY_TOKENS="1000")
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    await adapter.start()

    async def say(text: str) -> str:
        before = len(tg.sent)
        tg.push_update(tg.message_update(text, chat_id=1001, user_id=1001))
        await tg.wait_sent(before + 1)
        return str(tg.sent[before]["text"])

    try:
        assert "Asia/Tokyo" in await say("/timezone Asia/Tokyo")
        fake_llm.script(Reply(text="Hello!", usage=used(1400, 100)))  # 19:00 in Tokyo
        assert await say("hi") == "Hello!"
        await core.spending.flush()
        requests = len(fake_llm.requests)
        assert await say("and now?") == (
            "You have used your daily budget: 1,500 of 1,000 tokens. It resets at 00:00 (in 5 h)."
        )
        assert len(fake_llm.requests) == requests
        assert "1,500 tokens" in await say("/usage")
        clock.now = datetime(2026, 11, 21, 15, 0, 1, tzinfo=UTC)  # the next day in Tokyo
        fake_llm.script(Reply(text="Good morning!", usage=used(10)))
        assert await say("good morning") == "Good morning!"
    finally:
        await adapter.stop()


async def test_web_calls_are_counted_per_person_and_day_and_capped_across_processes(
    make_core: MakeCore, clock: FakeClock, pool: Pool
) -> None:
    core = make_core(USER_DAILY_WEB_CALLS="3")
    other = make_core(USER_DAILY_WEB_CALLS="3")  # another process on the same database
    ann = incoming("/usage")
    await core.command(ann, "usage")  # Ann is known (an account)
    user, _ = await conversations.identify(pool, ann, "UTC")
    said = await asyncio.gather(*(c.spending.web_call(user) for c in (core, other, core, other, core)))
    assert sorted(said, key=str) == [None, None, None, WEB_SPENT.format(cap=3), WEB_SPENT.format(cap=3)]
    assert said.count(None) == 3, "never more than the cap, however many processes ask at once"
    assert "Web searches and fetches today: 3 of 3." in str(await core.command(ann, "usage"))
    bob, _ = await conversations.identify(pool, incoming("hi", user="200"), "UTC")
    assert await core.spending.web_call(bob) is None, "per person"
    clock.now = clock.now + timedelta(days=1)
    assert await core.spending.web_call(user) is None, "a new day of theirs"
