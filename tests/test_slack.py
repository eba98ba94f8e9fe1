"""What only Slack has, beyond the kit: a message is acked only once stored; a process killed mid-turn leaves it to
another that answers once; a 429 storm loses nothing; the HTTP Events API checks signatures and stores a retry
once; threads the bot spoke in are found again by another process; the settings are checked before start."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack import config_problem
from adapters.slack.adapter import EVENTS_PATH, SlackAdapter
from adapters.slack.commands import on_slack
from adapters.slack.send import patiently
from bot.web import WebServer
from core import StartupError
from core.front_door import Core
from core.inbox import Pace
from core.reminders.engine import ReminderEngine
from core.settings import load_settings
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_slack import BOT_USER, GROUP, TEAM, FakeSlack
from tests.helpers import WAIT_S, die, incoming
from tests.mcp_servers import HttpServer, free_port
from tests.test_inbox import Hold, echo
from tests.test_linking import CODE
from tests.test_mcp_agent import call, config_file, started
from tests.test_mcp_confirm import EVERYONE
from tests.test_mcp_confirm import calls as calls  # the fixture: what the server's `forget` got
from tests.test_mcp_confirm import mail as mail  # the fixture: the test MCP server
from tests.test_media_discord import OGG
from tests.test_media_photos_stickers import a_jpeg, asked, image_and_text, picture

ALICE, BOB = "U0ALICE1", "U0BOB001"


@dataclass
class Proc:
    """One bot process: a core (with its inbox) and its Slack adapter."""

    core: Core
    adapter: SlackAdapter


StartProc = Callable[..., Awaitable[Proc]]


@pytest.fixture
async def sl() -> AsyncIterator[FakeSlack]:
    """A fake Slack with Alice and Bob."""
    async with FakeSlack() as fake:
        fake.person(ALICE, "Alice")
        fake.person(BOB, "Bob")
        yield fake


@pytest.fixture
async def start_proc(sl: FakeSlack, make_core: MakeCore) -> AsyncIterator[StartProc]:
    """Start Socket Mode processes on one database and one fake Slack (stopped at the end); or, with `http`, Events
    API processes behind the bot's web server."""
    async with AsyncExitStack() as stack:

        async def start(lease_s: float = 30.0, *, http: bool = False, **settings: Any) -> Proc:
            mode = {"SLACK_SIGNING_SECRET": sl.signing_secret} if http else {"SLACK_APP_TOKEN": sl.app_token}
            core = make_core(
                SLACK_BOT_TOKEN=sl.token,
                SLACK_API_BASE_URL=sl.api_base,
                inbox_pace=Pace(lease_s=lease_s, poll_s=0.05),
                **mode,
                **settings,
            )
            adapter = SlackAdapter(core, core.settings)
            if http:
                port = free_port()
                web = WebServer(core, ["slack"], port, host="127.0.0.1")
                assert adapter.webhook_path == EVENTS_PATH
                web.add_webhook(EVENTS_PATH, adapter.on_webhook)
                await web.start()
                stack.push_async_callback(web.stop)
                sl.events_url = f"http://127.0.0.1:{port}{EVENTS_PATH}"
            await adapter.start()
            stack.push_async_callback(adapter.stop)
            return Proc(core, adapter)

        yield start


def texts(sl: FakeSlack) -> list[str]:
    """What the bot posted, in order."""
    return [m["text"] for m in sl.sent]


async def test_a_message_is_acked_only_once_it_is_stored(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = hold = Hold()
    await start_proc()
    envelope = await sl.push("events_api", sl.post(ALICE, "hello", channel=sl.dm_of(ALICE)))
    await sl.wait_for(lambda: envelope in sl.acks, WAIT_S, what="the ack")
    assert await pool.fetchval("SELECT count(*) FROM inbox") == 1  # stored before Slack was told
    await asyncio.wait_for(hold.asked.wait(), WAIT_S)
    hold.release.set()
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer")


async def test_a_process_killed_mid_turn_leaves_the_message_to_another_that_answers_once(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = hold = Hold()
    first = await start_proc(lease_s=0.5)
    await sl.push("events_api", sl.post(ALICE, f"<@{BOT_USER}> are you there?", channel=GROUP))
    await asyncio.wait_for(hold.asked.wait(), WAIT_S)
    await die(first.core)  # kill -9 mid-turn: the message stays in the inbox, its lease runs out
    assert sl.sent == []
    await start_proc(lease_s=0.5)  # never saw the message: takes it from the inbox
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer of the second process")
    hold.release.set()  # the first process's model call ends: nobody is there to send its answer
    [answer] = sl.sent
    assert answer["text"] == "re: Alice: are you there?" and answer["channel"] == GROUP
    assert answer["thread_ts"] == sl.messages[0]["ts"]  # in the mention's thread
    assert await pool.fetchval("SELECT attempts FROM inbox") == 2


async def test_a_429_storm_delays_the_answer_and_loses_nothing(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(Reply(text="first"), Reply(text="second"))
    await start_proc()
    sl.rate_limit["chat.postMessage"] = [0] * 6  # Retry-After: 0, six times in a row
    await sl.push("events_api", sl.post(ALICE, "one", channel=sl.dm_of(ALICE)))
    await sl.push("events_api", sl.post(ALICE, "two", channel=sl.dm_of(ALICE)))
    await sl.wait_for(lambda: len(sl.sent) == 2, WAIT_S, what="both answers")
    assert texts(sl) == ["first", "second"]
    assert sum(1 for method, _ in sl.calls if method == "chat.postMessage") == 2 + 6


async def test_a_wait_past_the_budget_gives_up_and_waits_within_it_otherwise(sl: FakeSlack) -> None:
    web = AsyncWebClient(token=sl.token, base_url=sl.api_base, retry_handlers=[])
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    sl.rate_limit["auth.test"] = [3, 4]
    assert (await patiently(web.auth_test, budget=10, sleep=sleep))["ok"]
    assert slept == [3.0, 4.0]
    sl.rate_limit["auth.test"] = [3, 8]
    with pytest.raises(SlackApiError):
        await patiently(web.auth_test, budget=10, sleep=sleep)
    assert slept == [3.0, 4.0, 3.0]


async def test_a_thread_the_bot_spoke_in_is_followed_also_by_a_process_that_did_not_see_it(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = echo()
    first = await start_proc()
    await sl.push("events_api", sl.post(ALICE, f"<@{BOT_USER}> start", channel=GROUP))
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer in the thread")
    thread = sl.sent[0]["thread_ts"]
    await first.adapter.stop()
    await start_proc()  # knows nothing of the thread: asks conversations.replies
    await sl.push("events_api", sl.post(BOB, "and me?", channel=GROUP, thread_ts=thread))
    await sl.wait_for(lambda: len(sl.sent) == 2, WAIT_S, what="the answer to Bob in the thread")
    assert sl.sent[1]["text"] == "re: Bob: and me?" and sl.sent[1]["thread_ts"] == thread
    assert "conversations.replies" in [method for method, _ in sl.calls]
    other = sl.post(BOB, "unrelated thread", channel=GROUP, thread_ts="1600000000.000100")
    await sl.push("events_api", other)  # a thread without the bot: not answered
    await sl.push("events_api", sl.post(ALICE, f"<@{BOT_USER}> last", channel=GROUP))
    await sl.wait_for(lambda: len(sl.sent) == 3, WAIT_S, what="the answer to the last mention")
    assert texts(sl)[2] == "re: Alice: last"


async def test_the_events_api_checks_signatures_and_stores_a_retry_once(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo()
    await start_proc(http=True)
    event = sl.post(ALICE, "over http", channel=sl.dm_of(ALICE))
    assert await sl.deliver(event, headers={"X-Slack-Signature": "v0=" + "0" * 64}) == 401
    old = sl.sign(json.dumps(event).encode(), int(time.time()) - 600)  # a replay, 10 minutes late
    assert await sl.deliver(event, headers=old) == 401
    assert await pool.fetchval("SELECT count(*) FROM inbox") == 0
    assert await sl.deliver(event) == 200
    assert await sl.deliver(event, retry=1) == 200  # Slack's retry: stored once
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer")
    assert texts(sl) == ["re: over http"] and await pool.fetchval("SELECT count(*) FROM inbox") == 1
    assert await sl.deliver({"type": "url_verification", "challenge": "abc"}) == 200


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ({"SLACK_BOT_TOKEN": "xoxp-user"}, "SLACK_BOT_TOKEN: does not look like the Bot User OAuth Token"),
        ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xoxb-2"}, "SLACK_APP_TOKEN: does not look like"),
        ({"SLACK_BOT_TOKEN": "xoxb-1"}, "SLACK_BOT_TOKEN needs SLACK_APP_TOKEN (Socket Mode"),
        ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s"}, None),
        ({}, None),
    ],
)
def test_the_settings_are_checked_before_start_in_one_line(
    given: dict[str, Any], line: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    problem = config_problem(load_settings(**given))
    assert (problem is None) if line is None else (problem is not None and problem.startswith(line))
    assert problem is None or "xoxb-1" not in problem  # a token is never repeated


async def test_the_home_tab_shows_the_persons_tasks(start_proc: StartProc, sl: FakeSlack) -> None:
    await start_proc()
    made = await sl.interact("slash_commands", sl.command(ALICE, sl.dm_of(ALICE), "/assistant", "remind 9:00 Buy milk"))
    await sl.wait_answered(made, WAIT_S)
    opened = {"type": "app_home_opened", "user": ALICE, "channel": sl.dm_of(ALICE), "tab": "home"}
    await sl.push("events_api", sl.event(opened))
    await sl.wait_for(lambda: ALICE in sl.views, WAIT_S, what="the Home tab")
    shown = json.dumps(sl.views[ALICE])
    assert sl.views[ALICE]["type"] == "home" and "Buy milk" in shown
    assert sl.sent == []  # nothing posted into a chat


@pytest.mark.parametrize(
    ("token", "line"),
    [
        ("SLACK_BOT_TOKEN", "SLACK_BOT_TOKEN was refused by Slack (invalid_auth)"),
        ("SLACK_APP_TOKEN", "SLACK_APP_TOKEN could not open Socket Mode (invalid_auth)"),
    ],
)
async def test_a_refused_token_is_a_one_line_start_error(
    sl: FakeSlack, make_core: MakeCore, token: str, line: str
) -> None:
    given = {"SLACK_BOT_TOKEN": sl.token, "SLACK_APP_TOKEN": sl.app_token, token: f"{sl.token[:5]}wrong"}
    given["SLACK_APP_TOKEN"] = given["SLACK_APP_TOKEN"].replace("xoxb-", "xapp-")
    core = make_core(SLACK_API_BASE_URL=sl.api_base, **given)
    adapter = SlackAdapter(core, core.settings)
    with pytest.raises(StartupError) as failed:
        await adapter.start()
    assert str(failed.value) == line and "wrong" not in str(failed.value)
    assert adapter.web.session is not None and adapter.web.session.closed


async def test_over_http_a_slash_command_is_answered_through_its_response_url(
    start_proc: StartProc, sl: FakeSlack
) -> None:
    await start_proc(http=True)
    command = sl.command(ALICE, GROUP, "/assistant", "tasks")
    assert await sl.deliver_form("slash_commands", command) == 200
    [it] = [i for i in sl.interactions.values() if i.payload is command]
    await sl.wait_answered(it, WAIT_S)
    assert it.responses[0]["response_type"] == "ephemeral"  # a personal command in a channel: only to its person


def test_command_answers_name_the_commands_as_slack_runs_them() -> None:
    said = on_slack("Send /tasks or /remind tomorrow 9:00 milk; see https://example.org/help and /tasksx.")
    assert said == (
        "Send /assistant tasks or /assistant remind tomorrow 9:00 milk; see https://example.org/help and /tasksx."
    )


async def test_a_reply_under_the_bots_own_message_is_answered_without_asking_slack(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = echo()
    proc = await start_proc()
    posted = await proc.adapter.web.chat_postMessage(channel=GROUP, text="⏰ Call mum")  # e.g. a reminder
    await sl.push("events_api", sl.post(ALICE, "done already", channel=GROUP, thread_ts=posted["ts"]))
    await sl.wait_for(lambda: len(sl.sent) == 2, WAIT_S, what="the answer in the reminder's thread")
    assert sl.sent[1]["text"] == "re: Alice: done already" and sl.sent[1]["thread_ts"] == posted["ts"]
    assert "conversations.replies" not in [method for method, _ in sl.calls]


async def test_link_joins_a_slack_identity_with_a_telegram_one_and_tells_the_slack_dm(
    start_proc: StartProc, sl: FakeSlack
) -> None:
    proc = await start_proc()
    proc.core.outboxes["slack"] = proc.adapter  # as bot/ runs it: the issuer's note goes out through the adapter
    asked = await sl.interact("slash_commands", sl.command(ALICE, sl.dm_of(ALICE), "/assistant", "link"))
    found = CODE.search((await sl.wait_answered(asked, WAIT_S)).responses[0]["text"])
    assert found is not None
    ann_tg = incoming("", user="100", name="Ann")
    said = await proc.core.command(ann_tg, "link", found.group(1))
    assert isinstance(said, str) and said.startswith(f"🔗 Linked with `slack:{TEAM}:{ALICE}` (Alice)")
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the note in Alice's Slack DM")
    assert sl.sent[0]["channel"] == sl.dm_of(ALICE) and "`telegram:100` (Ann) used your link code" in sl.sent[0]["text"]
    assert "/assistant unlink separates" in sl.sent[0]["text"]  # the note names the command as typed on Slack
    asked = await sl.interact("slash_commands", sl.command(ALICE, sl.dm_of(ALICE), "/assistant", "whoami"))
    shown = (await sl.wait_answered(asked, WAIT_S)).responses[0]["text"]
    assert f"slack:{TEAM}:{ALICE}" in shown and "telegram:100" in shown


async def test_a_reminder_made_in_the_dm_arrives_there_without_a_mention_and_done_closes_it(
    start_proc: StartProc, sl: FakeSlack, clock: FakeClock, pool: Pool
) -> None:
    proc = await start_proc()
    made = await sl.interact(
        "slash_commands", sl.command(ALICE, sl.dm_of(ALICE), "/assistant", "remind in 5 minutes Tea")
    )
    await sl.wait_answered(made, WAIT_S)
    engine = ReminderEngine(pool, {"slack": proc.adapter}, clock)
    clock.advance(minutes=5)
    assert await engine.tick() == 1
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the reminder")
    [reminder] = sl.sent
    assert reminder["channel"] == sl.dm_of(ALICE) and "Tea" in reminder["text"] and "<@" not in reminder["text"]
    done = next(b for b in reminder["blocks"][-1]["elements"] if b["value"].startswith("rem:done:"))
    pressed = await sl.interact("interactive", sl.block_action(ALICE, reminder, done["action_id"]))
    await sl.wait_answered(pressed, WAIT_S)
    assert pressed.responses[0]["replace_original"] and await pool.fetchval("SELECT status FROM tasks") == "done"
    assert not [b for b in reminder["blocks"] if b["type"] == "actions"]  # the buttons are gone


async def test_a_message_arriving_while_stopping_is_stored_for_the_next_start(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    fake_llm.default = echo()
    first = await start_proc()
    first.adapter.running.stopping = True  # stop() has begun: its turns are declined, messages still stored
    first.core.unserve(first.adapter.source)
    envelope = await sl.push("events_api", sl.post(ALICE, "still there?", channel=sl.dm_of(ALICE)))
    await sl.wait_for(lambda: envelope in sl.acks, WAIT_S, what="the ack")
    assert sl.sent == [] and await pool.fetchval("SELECT count(*) FROM inbox") == 1
    await first.adapter.stop()
    await start_proc()  # the next start answers it
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer after the restart")
    assert texts(sl) == ["re: still there?"]


async def test_the_events_api_refuses_what_is_neither_an_event_a_command_nor_a_press(
    start_proc: StartProc, sl: FakeSlack
) -> None:
    await start_proc(http=True)
    assert sl.events_url is not None
    async with aiohttp.ClientSession() as session:
        for body, kind in ((b"[1, 2]", "application/json"), (b"text=hi", "application/x-www-form-urlencoded")):
            headers = {"Content-Type": kind, **sl.sign(body)}
            async with session.post(sl.events_url, data=body, headers=headers) as resp:
                assert resp.status == 400


async def test_an_mcp_call_waits_for_the_allow_button_that_only_the_person_asked_can_press(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI, mail: HttpServer, calls: list[str], tmp_path: Path
) -> None:
    path = config_file(tmp_path, mail={"url": mail.url, **EVERYONE})
    proc = await start_proc(MCP_CONFIG=path, ALLOWED_USERS=f"slack:{TEAM}:{ALICE},slack:{TEAM}:{BOB}")
    await started(proc.core)
    fake_llm.script(call("mcp__mail__forget", what="the tea"), Reply(text="Asked."))
    await sl.push("events_api", sl.post(ALICE, "forget the tea", channel=sl.dm_of(ALICE)))
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer")
    [asked] = sl.sent
    assert "Waiting for your OK to run mail: forget" in asked["text"] and calls == []
    [allow] = [e for b in asked["blocks"] for e in b.get("elements") or [] if e.get("value", "").startswith("mcp:ok:")]
    other = await sl.wait_answered(
        await sl.interact("interactive", sl.block_action(BOB, asked, allow["action_id"])), WAIT_S
    )
    assert "not for you" in json.dumps(other.responses) and calls == []
    pressed = await sl.interact("interactive", sl.block_action(ALICE, asked, allow["action_id"]))
    await sl.wait_for(lambda: calls == ["the tea"] and "forgot the tea" in json.dumps(pressed.responses), WAIT_S)


async def test_a_person_who_never_set_a_zone_has_their_slack_profiles_and_one_they_set_stays(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    sl.person(ALICE, "Alice", tz="America/New_York")
    sl.person(BOB, "Bob", tz="Not/AZone")  # a profile's zone that is no IANA name is not taken
    await start_proc()
    asked = await sl.interact("slash_commands", sl.command(ALICE, sl.dm_of(ALICE), "/assistant", "whoami"))
    assert "Time zone: America/New_York." in (await sl.wait_answered(asked, WAIT_S)).responses[0]["text"]
    fake_llm.script(Reply(text="hi"))
    await sl.push("events_api", sl.post(ALICE, "hello", channel=sl.dm_of(ALICE)))
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the answer")
    assert "America/New_York" in fake_llm.requests[-1]["messages"][0]["content"]  # the turn's clock is hers
    assert await pool.fetchval("SELECT timezone FROM accounts") == "America/New_York"  # reminders' too

    sl.person(ALICE, "Alice", tz="Asia/Tokyo")  # she set one: her profile no longer decides
    await pool.execute("UPDATE accounts SET timezone = 'Europe/Lisbon'")
    fake_llm.script(Reply(text="hi again"))
    await sl.push("events_api", sl.post(ALICE, "hello again", channel=sl.dm_of(ALICE)))
    await sl.wait_for(lambda: len(sl.sent) == 2, WAIT_S, what="the second answer")
    assert "Europe/Lisbon" in fake_llm.requests[-1]["messages"][0]["content"]
    assert await pool.fetchval("SELECT timezone FROM accounts") == "Europe/Lisbon"

    asked = await sl.interact("slash_commands", sl.command(BOB, sl.dm_of(BOB), "/assistant", "whoami"))
    assert "Time zone: UTC." in (await sl.wait_answered(asked, WAIT_S)).responses[0]["text"]


async def test_a_voice_clip_is_heard_and_a_photo_reaches_the_model_as_an_image(
    start_proc: StartProc, sl: FakeSlack, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    await start_proc()
    fake_llm.script_transcripts(Reply(text="remind me to water the plants"))
    fake_llm.script(Reply(text="I'll remind you."))
    clip = {**sl.shared_file("audio_message.webm", OGG, "audio/webm"), "subtype": "slack_audio"}
    await sl.push("events_api", sl.post(ALICE, "", channel=sl.dm_of(ALICE), files=[clip]))
    await sl.wait_for(lambda: len(sl.sent) == 1, WAIT_S, what="the voice clip's answer")
    [upload] = fake_llm.uploads
    assert upload.data == OGG
    assert fake_llm.requests[-1]["messages"][-1] == {"role": "user", "content": "remind me to water the plants"}
    assert await pool.fetchval("SELECT kind FROM attachments") == "voice"

    fake_llm.script(Reply(text="A red square."))
    photo = sl.shared_file("square.png", picture("PNG"), "image/png")
    await sl.push("events_api", sl.post(ALICE, "what is this?", channel=sl.dm_of(ALICE), files=[photo]))
    await sl.wait_for(lambda: len(sl.sent) == 2, WAIT_S, what="the photo's answer")
    urls, text = image_and_text(asked(fake_llm.requests[-1]))
    assert len(urls) == 1 and a_jpeg(urls[0]).size == (64, 48) and "what is this?" in text
