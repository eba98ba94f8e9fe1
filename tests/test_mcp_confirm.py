"""An untrusted MCP server's tools that change things wait for the person's OK, through whole agent turns against a
real MCP server over Streamable HTTP: the call is parked (the server never gets it), the answer carries an "Allow"
button on Telegram (and /mcp allow <id> where there are no buttons), only the person who was asked may allow it, once,
before it expires, and its result is shown and kept in the conversation as someone else's words. `confirm: false`, a
trusted server and a read-only tool run at once. Images a result brings are kept as photos and go to a vision model."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image as McpImage
from PIL import Image

from adapters.telegram import TelegramAdapter
from core.constants import MCP_CONFIRM_TTL_S
from core.media.photos import TOOL_IMAGES
from core.storage.db import Pool
from tests.conftest import FakeClock, MakeCore
from tests.fake_discord import FakeDiscord
from tests.fake_openai import FakeOpenAI, Reply
from tests.fake_telegram import FakeTelegram
from tests.helpers import answer, incoming, run, tool_messages, tool_names
from tests.mcp_servers import HttpServer, build_server
from tests.test_discord import Bot as DiscordBot
from tests.test_discord import button_ids
from tests.test_http_api import ANN, BOB, Serve, token_of
from tests.test_http_api import serve as serve  # the fixture: a server with the /v1 routes
from tests.test_mcp_agent import call, config_file, started
from tests.test_media_vision import images_of
from tests.test_telegram import assert_valid_html

EVERYONE = {"access": "everyone", "credentials": "none"}  # anyone may use it; untrusted unless said otherwise


@pytest.fixture
def calls() -> list[str]:
    """What the server's `forget` was called with."""
    return []


@pytest.fixture
async def mail(calls: list[str]) -> AsyncIterator[HttpServer]:
    """The test MCP server over Streamable HTTP, noting the calls of `forget`."""
    async with HttpServer(build=lambda: build_server("mail", calls)) as server:
        yield server


def parked_line(result: dict[str, Any]) -> bool:
    """Whether a tool result tells the model the call waits for the person's OK."""
    return bool(result["ok"]) and str(result["result"]).startswith("Waiting for the person's OK")


async def test_the_allow_button_runs_the_call_once_and_only_for_the_person_asked(
    tg: FakeTelegram, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, mail: HttpServer, calls: list[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    path = config_file(tmp_path, mail={"url": mail.url, **EVERYONE})
    core = make_core(
        TELEGRAM_BOT_TOKEN=tg.token, TELEGRAM_API_BASE_URL=tg.base_url, ADMINS="telegram:1001",
        ALLOWED_USERS="telegram:1002", MCP_CONFIG=path,
    )  # fmt: skip
    await started(core)
    adapter = TelegramAdapter(core, core.settings, poll_timeout=1)
    await adapter.start()
    try:
        fake_llm.script(call("mcp__mail__forget", what="the milk"), Reply(text="I asked you first."))
        before = len(tg.sent)
        tg.push_update(tg.message_update("forget the milk"))
        await tg.wait_sent(before + 1)
        ask = tg.sent[-1]
        assert ask["text"].startswith("I asked you first.") and "Waiting for your OK to run mail: forget" in ask["text"]
        [[button]] = ask["reply_markup"]["inline_keyboard"]
        assert button == {"text": "✅ Allow mail: forget", "callback_data": button["callback_data"]}
        assert button["callback_data"].startswith("mcp:ok:")
        assert parked_line(tool_messages(fake_llm.requests[1])[0]), "the model is told, in one line"
        assert calls == [], "the server never got the call"

        # Bob presses Ann's button: refused, nothing runs
        tg.push_update(tg.callback_update(button["callback_data"], message=ask, user_id=1002, first_name="Bob"))
        await tg.wait_for(lambda: len(tg.callback_answers) == 1)
        assert "not for you" in tg.callback_answers[0]["text"] and calls == []

        # Ann presses it: the call runs once and its result comes as a message of its own
        sent = len(tg.sent)
        tg.push_update(tg.callback_update(button["callback_data"], message=ask))
        await tg.wait_sent(sent + 1)
        assert calls == ["the milk"]
        assert assert_valid_html(tg.sent[-1]["text"]) == "Ran mail: forget after your OK:\n> forgot the milk"

        # a second press: one line, nothing runs again
        tg.push_update(tg.callback_update(button["callback_data"], message=ask))
        await tg.wait_for(lambda: len(tg.callback_answers) == 3)
        assert "run already" in tg.callback_answers[2]["text"] and calls == ["the milk"]

        # the next turn knows, and holds the server's words: no admin tools for Ann in it
        fake_llm.script(Reply(text="It is forgotten."))
        tg.push_update(tg.message_update("did it work?"))
        await tg.wait_sent(sent + 2)
        said = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "assistant"]
        assert "Ran mail: forget after your OK:\n> forgot the milk" in said
        assert "execute_sql" not in tool_names(fake_llm.requests[-1])
        assert await pool.fetchval("SELECT state FROM mcp_confirmations") == "done"
    finally:
        await adapter.stop()


async def test_discord_shows_the_allow_button_and_only_the_person_asked_runs_the_call(
    dc: FakeDiscord, fake_llm: FakeOpenAI, make_core: MakeCore, pool: Pool, mail: HttpServer, calls: list[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    path = config_file(tmp_path, mail={"url": mail.url, **EVERYONE})
    core = make_core(
        DISCORD_BOT_TOKEN=dc.token, DISCORD_API_BASE_URL=dc.api_base, DISCORD_GATEWAY_URL=dc.gateway_url,
        ADMINS="discord:2001", ALLOWED_USERS="discord:2002", MCP_CONFIG=path,
    )  # fmt: skip
    await started(core)
    bot = DiscordBot(dc, fake_llm, core, pool)
    await bot.adapter.start()
    try:
        fake_llm.script(call("mcp__mail__forget", what="the cake"), Reply(text="Asked."))
        [sent] = await bot.say("forget the cake", dm=True)
        assert "Waiting for your OK to run mail: forget" in sent["content"] and calls == []
        allow = next(c for c in button_ids(sent) if c.startswith("mcp:ok:"))
        other = await dc.click(sent, allow, bot.bob)
        await other.wait_done()
        assert other.ephemeral and "not for you" in other.texts()[0] and calls == []
        pressed = await dc.click(sent, allow, bot.alice, dm=True)
        await pressed.wait_done()
        assert not pressed.ephemeral and "forgot the cake" in pressed.texts()[0] and calls == ["the cake"]
        again = await dc.click(sent, allow, bot.alice, dm=True)
        await again.wait_done()
        assert again.ephemeral and again.texts() == ["That call was run already."] and calls == ["the cake"]
    finally:
        await bot.adapter.stop()


async def test_where_there_are_no_buttons_mcp_allow_does_it_and_a_late_one_has_expired(
    make_core: MakeCore, fake_llm: FakeOpenAI, mail: HttpServer, calls: list[str], clock: FakeClock, tmp_path: Path
) -> None:
    path = config_file(tmp_path, mail={"url": mail.url, **EVERYONE})
    core = await started(make_core(MCP_CONFIG=path))
    fake_llm.script(call("mcp__mail__forget", what="the keys"), Reply(text="Asked."))
    done = answer(await run(core, incoming("forget the keys", user="local", platform="console", message_id="1")))
    assert done.asks == () and "send /mcp allow 1 to run it" in done.text and calls == []
    other = await core.command(incoming("/mcp allow 1", user="other", platform="console"), "mcp", "allow 1")
    assert "not for you" in str(other) and calls == []
    ran = await core.command(incoming("/mcp allow 1", user="local", platform="console"), "mcp", "allow 1")
    assert ran == "Ran mail: forget after your OK:\n> forgot the keys" and calls == ["the keys"]
    again = await core.command(incoming("/mcp allow 1", user="local", platform="console"), "mcp", "allow 1")
    assert again == "That call was run already." and calls == ["the keys"]

    fake_llm.script(call("mcp__mail__forget", what="the door"), Reply(text="Asked again."))
    await run(core, incoming("forget the door", user="local", platform="console", message_id="2"))
    clock.advance(seconds=MCP_CONFIRM_TTL_S + 1)
    late = await core.command(incoming("/mcp allow 2", user="local", platform="console"), "mcp", "allow 2")
    assert "expired" in str(late) and calls == ["the keys"]


async def test_confirm_false_a_trusted_server_and_a_read_only_tool_run_at_once(
    make_core: MakeCore, fake_llm: FakeOpenAI, mail: HttpServer, calls: list[str], tmp_path: Path
) -> None:
    path = config_file(
        tmp_path,
        mail={"url": mail.url, **EVERYONE},
        bold={"url": mail.url, **EVERYONE, "confirm": False},
        home={"url": mail.url, **EVERYONE, "trust": "trusted"},
    )
    core = await started(make_core(MCP_CONFIG=path))
    fake_llm.script(
        call("mcp__mail__forget", what="parked"),
        call("mcp__mail__echo", text="read only"),
        call("mcp__bold__forget", what="no confirm"),
        call("mcp__home__forget", what="trusted"),
        Reply(text="Done."),
    )
    done = answer(await run(core, incoming("go", user="1", message_id="1")))
    results = tool_messages(fake_llm.requests[-1])
    assert parked_line(results[0]), "an untrusted tool that changes things waits"
    assert [r["result"] for r in results[1:]] == ["read only", "forgot no confirm", "forgot trusted"]
    assert calls == ["no confirm", "trusted"]
    assert [a.label for a in done.asks] == ["Allow mail: forget"] and "press its button below" in done.text


def camera() -> MCPServer:
    """The test server with a tool whose result is a real photo (and `picture`, whose image is cut short)."""
    server = build_server("cam")
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(buf, "PNG")
    png = buf.getvalue()

    def snapshot() -> list[Any]:
        """A caption and a photo."""
        return ["the front door", McpImage(data=png, format="png")]

    server.add_tool(snapshot, name="snapshot", description="A photo of the front door.", structured_output=False)
    return server


async def test_an_image_result_is_kept_as_a_photo_and_a_vision_model_sees_it_next_turn(
    make_core: MakeCore, fake_llm: FakeOpenAI, pool: Pool, tmp_path: Path
) -> None:
    async with HttpServer(build=camera) as server:
        path = config_file(tmp_path, cam={"url": server.url, **EVERYONE, "trust": "trusted"})
        core = await started(make_core(MCP_CONFIG=path, LLM_VISION="on"))
        fake_llm.script(call("mcp__cam__snapshot"), call("mcp__cam__picture"), Reply(text="A red door."))
        await run(core, incoming("show me the door", user="1", message_id="1"))
        shot, broken = tool_messages(fake_llm.requests[-1])
        row = await pool.fetchrow("SELECT id, kind, data, account_id FROM attachments")
        assert row is not None and row["kind"] == "photo" and row["data"]
        assert shot["result"].endswith(f"image 1: [photo #{row['id']}]")
        assert broken["result"].splitlines()[-1].startswith("image 1: not kept: "), "a failed image: one line"

        fake_llm.script(Reply(text="Still red."))
        await run(core, incoming("and now?", user="1", message_id="2"))
        request = fake_llm.requests[-1]
        assert images_of(request) == [bytes(row["data"])], "the kept photo goes to the model as an image"
        roles = [m["role"] for m in request["messages"]]
        note = next(i for i, m in enumerate(request["messages"]) if isinstance(m["content"], list))
        assert roles[note - 2 : note + 2] == ["assistant", "tool", "user", "assistant"], "right after the tool result"
        assert request["messages"][note]["content"][0]["text"] == TOOL_IMAGES.format(marks=f"[photo #{row['id']}]")


async def test_over_the_http_api_the_route_allows_it_for_the_person_asked_only(
    serve: Serve, fake_llm: FakeOpenAI, mail: HttpServer, calls: list[str], tmp_path: Path
) -> None:
    path = config_file(tmp_path, mail={"url": mail.url, **EVERYONE})
    s = await serve(MCP_CONFIG=path)
    await started(s.core)
    fake_llm.script(call("mcp__mail__forget", what="the spare key"), Reply(text="Asked."))
    async with s.client(await token_of(s.core, ANN)) as ann, s.client(await token_of(s.core, BOB)) as bob:
        sid = (await ann.post("/v1/sessions", json={})).json()["id"]
        said = (await ann.post(f"/v1/sessions/{sid}/messages", json={"content": "forget the spare key"})).json()
        text = said["parts"][-1]["text"]
        assert "POST /v1/mcp/allow/1 runs it" in text and calls == []
        refused = await bob.post("/v1/mcp/allow/1")
        assert refused.status_code == 200 and "not for you" in refused.json()["text"] and calls == []
        ran = await ann.post("/v1/mcp/allow/1")
        assert ran.json()["text"].endswith("> forgot the spare key") and calls == ["the spare key"]


async def test_the_waiting_line_streams_as_a_delta_too(
    serve: Serve, fake_llm: FakeOpenAI, mail: HttpServer, tmp_path: Path
) -> None:
    from tests.test_http_api import sse_events

    path = config_file(tmp_path, mail={"url": mail.url, **EVERYONE})
    s = await serve(MCP_CONFIG=path)
    await started(s.core)
    fake_llm.script(call("mcp__mail__forget", what="the spare key"), Reply(text="Asked."))
    async with s.client(await token_of(s.core, ANN)) as ann:
        sid = (await ann.post("/v1/sessions", json={})).json()["id"]
        async with ann.stream(
            "POST",
            f"/v1/sessions/{sid}/messages",
            json={"content": "forget the spare key"},
            headers={"Accept": "text/event-stream"},
        ) as r:
            events = await sse_events(r)
    streamed = "".join(e[2]["delta"] for e in events if e[1] == "message.part.delta")
    completed = events[-1][2]["message"]["parts"][-1]["text"]
    assert "⏳ Waiting for your OK" in streamed and "POST /v1/mcp/allow/1 runs it" in streamed
    assert streamed == completed, "the stream says what the answer says"
