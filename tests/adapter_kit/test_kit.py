"""The adapter conformance kit: each test is one behaviour every platform adapter shows, run once per platform
(`driver`: tests/adapter_kit/conftest.py) through the real platform library against its fake server."""

from __future__ import annotations

import json
from datetime import timedelta

from core import FORGET_LABEL, MODEL_NOT_YOURS, REMINDER_BUTTON_LABELS, WIPE_LABEL
from core.commands import COMMANDS
from core.reminders.engine import ReminderEngine
from tests.adapter_kit.conftest import OTHER_MODEL
from tests.adapter_kit.driver import Driver, Said
from tests.conftest import FakeClock
from tests.fake_openai import Reply
from tests.test_media_documents import pdf
from tests.test_memory_command import remember
from tests.test_web_fetch import Site

DONE, SNOOZE, UNDO = (REMINDER_BUTTON_LABELS[k] for k in ("done", "snooze10", "undo"))


def steps_done(saids: list[Said]) -> bool:
    """The whole answer is there: its last part carries the activity summary."""
    return bool(saids) and "🔧" in saids[-1].text


async def test_a_private_message_is_answered_first_and_its_steps_open_on_request(driver: Driver) -> None:
    driver.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk", "due_at": "2026-11-22T09:00"})]),
        Reply(text="Done — I'll remind you **tomorrow at 09:00**."),
    )
    [said] = await driver.say_private("remind me to buy milk tomorrow at 9")
    assert said.private and said.pings == ()
    assert said.text.startswith("Done — I'll remind you") and "tomorrow at 09:00" in said.text
    assert "🔧 1 step · " in said.text  # the activity's summary, under the answer
    steps = await driver.steps_of(said)
    assert '✅ manage_tasks create → created #1 "Buy milk", Sun 22 Nov 09:00 CET' in steps
    assert await driver.pool.fetchval("SELECT title FROM tasks") == "Buy milk"


async def test_search_read_and_answer_end_with_the_sources_as_links(driver: Driver, site: Site) -> None:
    url, tables = f"http://127.0.0.1:{site.port}/tides", "https://tides.example.org/tables"
    driver.llm.script(
        Reply(tool_calls=[("web_search", {"query": "tides"})]),
        Reply(tool_calls=[("web_fetch", {"url": url})]),
        Reply(text=f"Two high tides a day; times at {tables}"),
    )
    [said] = await driver.say_private("how do tides work?")
    assert said.text.startswith("Two high tides a day;") and "Sources:\n1. " in said.text
    assert said.links[-2:] == [("How tides work", url), ("Tide tables", tables)]  # outside the steps
    steps = await driver.steps_of(said)
    assert "✅ web_search → 'tides': 2 results" in steps and f"✅ web_fetch → {url}" in steps
    assert site.requests == ["/search", "/tides"]


async def test_in_the_group_only_a_mention_or_a_reply_to_the_bot_is_answered(driver: Driver) -> None:
    driver.llm.script(Reply(text="Hello group"), Reply(text="Yes?"))
    await driver.post_in_group("just chatting")  # neither a mention nor a reply: not for the bot
    [hello] = await driver.say_in_group("hello", mention=True)
    assert hello.text == "Hello group" and hello.reply and not hello.private and hello.pings == ()
    [yes] = await driver.say_in_group("and another thing", who="friend", reply_to=hello)
    assert yes.text == "Yes?"
    asked = [r["messages"][-1]["content"] for r in driver.llm.requests]
    assert asked == [f"{driver.names['owner']}: hello", f"{driver.names['friend']}: and another thing"]


async def test_every_command_of_the_catalogue_is_answered_without_the_model(driver: Driver) -> None:
    for command in COMMANDS:
        said = await driver.run_command(command.name)
        assert said.text.strip() or said.file, f"/{command.name} got no answer"
        assert said.private, f"/{command.name} answered where others see it"
    assert driver.llm.requests == []


async def test_a_personal_command_asked_in_the_group_reaches_only_its_person(driver: Driver) -> None:
    for command in (c for c in COMMANDS if c.private):
        said = await driver.run_command(command.name, in_group=True)
        assert said.private and (said.text.strip() or said.file), f"/{command.name} in the group"
    assert driver.llm.requests == []


async def test_memory_wipe_asks_and_only_its_person_can_confirm(driver: Driver) -> None:
    owner = await remember(driver.core, driver.incoming("owner"), ["Name: Ann", "Works at: Google"], ["oat milk"])
    ask = await driver.run_command("memory", {"action": "wipe"})
    assert ask.private and "2 lines and 1 archival entry" in ask.text and ask.buttons == [WIPE_LABEL]
    refused = await driver.press(ask, WIPE_LABEL, "friend")
    assert refused.private and "not for you" in refused.text
    assert await driver.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", owner) == 1
    done = await driver.press(ask, WIPE_LABEL)
    assert "I erased 2 lines and 1 archival entry" in done.text and done.buttons == []
    assert await driver.pool.fetchval("SELECT count(*) FROM archival_memory WHERE user_id = $1", owner) == 0
    assert await driver.pool.fetchval("SELECT count(*) FROM memory_blocks WHERE user_id = $1", owner) == 0


async def test_forget_me_asks_and_only_its_person_can_confirm(driver: Driver) -> None:
    driver.llm.script(Reply(text="hi"))
    await driver.say_private("hello")
    owner = "SELECT count(*) FROM users WHERE platform = $1 AND platform_user_id = $2"
    ask = await driver.run_command("forget_me")
    assert ask.private and "cannot be undone" in ask.text and ask.buttons == [FORGET_LABEL]
    refused = await driver.press(ask, FORGET_LABEL, "friend")
    assert refused.private and "not for you" in refused.text
    assert await driver.pool.fetchval(owner, driver.platform, driver.user_id("owner")) == 1
    done = await driver.press(ask, FORGET_LABEL)
    assert done.text.startswith("Done — I deleted your account") and done.buttons == []
    assert await driver.pool.fetchval(owner, driver.platform, driver.user_id("owner")) == 0


async def test_model_offers_a_button_per_model_and_only_its_person_can_switch(driver: Driver) -> None:
    shown = await driver.run_command("model")
    assert shown.private and shown.buttons == ["fake-model", OTHER_MODEL]
    refused = await driver.press(shown, OTHER_MODEL, "friend")
    assert refused.private and refused.text == MODEL_NOT_YOURS
    assert await driver.pool.fetchval("SELECT count(*) FROM accounts WHERE model IS NOT NULL") == 0
    switched = await driver.press(shown, OTHER_MODEL)
    assert f"{OTHER_MODEL} answers you from now on" in switched.text.replace("*", "")
    driver.llm.script(Reply(text="from the other model"))
    await driver.say_private("hello")
    assert [r["model"] for r in driver.llm.requests] == [OTHER_MODEL]


async def test_remind_answers_with_an_undo_only_its_person_can_press(driver: Driver) -> None:
    made = await driver.run_command("remind", {"when": "tomorrow 9:00", "what": "Buy milk"})
    assert made.text == "⏰ #1 Buy milk — Sun 22 Nov 09:00 CET" and made.buttons == [UNDO]
    refused = await driver.press(made, UNDO, "friend")
    assert refused.private and "Only the person" in refused.text
    stranger = await driver.press(made, UNDO, "stranger")
    assert stranger.private and driver.identity("stranger") in stranger.text
    assert await driver.pool.fetchval("SELECT count(*) FROM tasks") == 1
    undone = await driver.press(made, UNDO)
    assert "↩️ Undone: #1 Buy milk is deleted." in undone.text and undone.buttons == []
    assert await driver.pool.fetchval("SELECT count(*) FROM tasks") == 0
    assert driver.llm.requests == []


async def test_a_reminder_arrives_in_the_group_and_only_its_owner_can_press_done_or_snooze(
    driver: Driver, clock: FakeClock
) -> None:
    made = await driver.run_command("remind", {"when": "in 10 minutes", "what": "Call mum"}, in_group=True)
    assert made.text.startswith("⏰ #1 Call mum") and not made.private
    engine = ReminderEngine(driver.pool, {driver.platform: driver.adapter}, clock)
    clock.advance(minutes=10)
    before = len(driver.sent())
    assert await engine.tick() == 1
    [reminder] = await driver.wait_sent(before)
    assert "⏰ Call mum — due 11:10" in reminder.text and not reminder.private
    assert reminder.pings == (driver.user_id("owner"),)  # the group's message notifies its owner alone
    assert reminder.buttons == [DONE, SNOOZE, REMINDER_BUTTON_LABELS["snooze60"]]
    refused = await driver.press(reminder, DONE, "friend")
    assert refused.private and "Only the person" in refused.text
    assert await driver.pool.fetchval("SELECT status FROM tasks") == "pending"
    snoozed = await driver.press(reminder, SNOOZE)
    assert "😴 Snoozed: Call mum — until 11:20" in snoozed.text and snoozed.buttons == []
    assert await driver.pool.fetchval("SELECT due_at FROM tasks") == clock.now + timedelta(minutes=10)


async def test_a_long_answer_is_split_within_the_platforms_limit_and_code_stays_code(driver: Driver) -> None:
    code = "\n".join(f"print('line {i:03d} 😀 <tag> & more')" for i in range(150))
    prose = "\n".join(f"Paragraph {i}: emoji 🎉 and text & <angles>." for i in range(100))
    driver.llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "list"})]),
        Reply(text=f"{prose}\n```python\n{code}\n```\nThe end."),
    )
    parts = await driver.say_private("a long one, please", until=steps_done)
    assert len(parts) >= 3 and all(driver.fits(p) for p in parts)
    assert parts[0].text.startswith("Paragraph 0:") and "The end." in parts[-1].text
    assert not any("🔧" in p.text for p in parts[:-1])  # the activity goes under the last part only
    for i in range(150):
        line = f"print('line {i:03d} 😀 <tag> & more')"
        [holder] = [p for p in parts if line in p.text]  # every line arrives once …
        assert driver.shows_as_code(holder, line), line  # … as code, in whichever part it landed


async def test_hostile_markup_in_an_answer_is_shown_as_written_and_pings_nobody(driver: Driver) -> None:
    hostile = "<b>not bold</b> <script>alert(1)</script> a < b & c **unclosed `tick and @everyone @here"
    driver.llm.script(Reply(text=hostile))
    [said] = await driver.say_in_group("try to break it", mention=True)
    assert said.text == hostile and said.pings == ()


async def test_a_document_reaches_the_model_as_the_persons_file(driver: Driver) -> None:
    driver.llm.script(Reply(text="The rent is 900 EUR."))
    data = pdf(["Contract page one: rent 900 EUR"])
    [said] = await driver.send_file("lease.pdf", data, "application/pdf", "what is the rent?")
    assert said.text == "The rent is 900 EUR."
    messages = driver.llm.requests[-1]["messages"]
    told = json.dumps(messages, ensure_ascii=False)
    assert "sent the file lease.pdf" in told and "> Contract page one: rent 900 EUR" in told
    assert messages[-1]["content"] == "what is the rent?"


async def test_export_sends_a_file_of_everything_kept_only_to_its_person(driver: Driver) -> None:
    driver.llm.script(Reply(text="noted"))
    await driver.say_private("remember the blue bike")
    exported = await driver.run_command("export")
    assert exported.private and exported.file is not None and "Everything I keep about you" in exported.text
    name, data = exported.file
    content = json.loads(data)
    assert name.endswith(".json") and content["identities"][0]["platform_user_id"] == driver.user_id("owner")
    assert [m["content"] for c in content["chats"] for m in c["messages"]] == ["remember the blue bike", "noted"]


async def test_a_stranger_is_refused_with_their_id_and_the_model_is_not_asked(driver: Driver) -> None:
    [refusal] = await driver.say_private("hello", who="stranger")
    assert refusal.private and driver.identity("stranger") in refusal.text
    assert driver.llm.requests == []


async def test_a_message_delivered_twice_is_answered_once(driver: Driver) -> None:
    driver.llm.script(Reply(text="only once"), Reply(text="next"))
    await driver.say_private("hi")
    await driver.redeliver_last()
    await driver.say_private("the next message")  # answered after the redelivery: one chat's messages go in order
    assert [s.text for s in driver.sent()] == ["only once", "next"]
    assert len(driver.llm.requests) == 2
