"""Per-person accounts at an MCP server (`credentials: per_person`): an OAuth-protected server written with the SDK
(its own authorization server in memory) on 127.0.0.1, people connecting their own accounts with /mcp connect and
the bot's callback route, each call going out with the speaker's own token, the tokens kept in PostgreSQL across a
restart, never in a group, and /mcp disconnect forgetting them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from bot.web import WebServer
from core.accounts.own_data import FileAnswer
from core.front_door import Core
from tests.conftest import FakeClock, MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import incoming, run, tool_messages, tool_names, until
from tests.mcp_servers import AuthServer, HttpServer, build_oauth_server, free_port
from tests.test_linking import new_code, say

WHOAMI = "mcp__mail__whoami"


@dataclass
class Mail:
    """The OAuth-protected server and its authorization server."""

    server: HttpServer
    auth: AuthServer


@pytest.fixture
async def mail() -> AsyncIterator[Mail]:
    """An MCP server that needs each person's own OAuth token."""
    port = free_port()
    auth = AuthServer(f"http://127.0.0.1:{port}")
    async with HttpServer(port, build=lambda: build_oauth_server(port, auth)) as server:
        yield Mail(server, auth)


@dataclass
class Bot:
    """A core with its HTTP server (the OAuth callback's home) at PUBLIC_BASE_URL."""

    core: Core
    web: WebServer
    base: str


@pytest.fixture
async def bots(make_core: MakeCore, mail: Mail, tmp_path: Path) -> AsyncIterator[list[Bot]]:
    """Cores started on demand (start_bot) on the same database and port: a restart is a new one."""
    made: list[Bot] = []
    yield made
    for bot in made:
        await bot.web.stop()


async def start_bot(make_core: MakeCore, bots: list[Bot], mail: Mail, tmp_path: Path, port: int = 0) -> Bot:
    """A core whose MCP_CONFIG has the per-person server `mail`, its web server listening, its servers started."""
    path = tmp_path / "mcp.json"
    server = {"url": mail.server.url, "access": "everyone", "credentials": "per_person", "trust": "trusted"}
    path.write_text(json.dumps({"mcpServers": {"mail": server}}))
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    core = make_core(MCP_CONFIG=path, PUBLIC_BASE_URL=base)
    web = WebServer(core, (), port, host="127.0.0.1")
    await web.start()
    bot = Bot(core, web, base)
    bots.append(bot)
    core.mcp.start()
    return bot


async def connect(bot: Bot, user: str, who: str) -> str:
    """`user` sends /mcp connect mail, opens the link, signs in at the server as `who` and approves: the page's line."""
    said = await bot.core.command(incoming("/mcp connect mail", user=user), "mcp", "connect mail")
    assert isinstance(said, str) and "Open this link" in said, said
    link = said.splitlines()[-1]
    async with httpx.AsyncClient() as browser:
        login = await browser.get(link)  # the server's /authorize: to its login page
        assert login.status_code == 302, login.text
        back = await browser.get(login.headers["location"] + f"&user={who}")  # approved: back to the bot
        assert back.status_code == 302
        callback = back.headers["location"]
        assert callback.startswith(f"{bot.base}/mcp/oauth/callback?"), callback
        page = await browser.get(callback)
    assert page.headers["content-type"].startswith("text/plain")
    return page.text.strip()


async def whoami(bot: Bot, fake_llm: FakeOpenAI, user: str, **kw: str) -> dict[str, object]:
    """`user` asks; the model calls whoami: the tool's envelope."""
    fake_llm.script(Reply(tool_calls=[(WHOAMI, {})]), Reply(text="done"))
    before = len(fake_llm.requests)
    await run(bot.core, incoming("who am I at mail?", user=user, **kw))
    result: dict[str, object] = tool_messages(fake_llm.requests[before + 1])[-1]
    return result


async def tools_offered(bot: Bot) -> None:
    """Wait until the per-person server's tools are registered."""
    await until(lambda: bot.core.registry.get(WHOAMI) is not None, timeout=10)
    await bot.core.mcp.settled()


async def test_two_people_each_use_their_own_account_and_never_see_the_others(
    make_core: MakeCore, fake_llm: FakeOpenAI, mail: Mail, bots: list[Bot], tmp_path: Path
) -> None:
    bot = await start_bot(make_core, bots, mail, tmp_path)
    assert bot.core.registry.get(WHOAMI) is None, "no one connected yet: nothing lists its tools"
    assert await connect(bot, "1", "alice") == "Connected mail. You can close this tab."
    await tools_offered(bot)
    assert await connect(bot, "2", "bob") == "Connected mail. You can close this tab."
    assert mail.auth.authorized == 2

    alice, bob = await whoami(bot, fake_llm, "1"), await whoami(bot, fake_llm, "2")
    assert (alice["ok"], alice["result"]) == (True, "you are alice")
    assert (bob["ok"], bob["result"]) == (True, "you are bob")
    assert await whoami(bot, fake_llm, "1") == alice, "again: still her own"

    carol = await whoami(bot, fake_llm, "3")
    error = carol["error"]
    assert not carol["ok"] and isinstance(error, dict) and error["code"] == "not_connected"
    assert error["message"] == (
        "You have not connected your mail account: send /mcp connect mail in a private chat with me."
    )

    rows = await bot.core.pool.fetch("SELECT account_id, tokens FROM mcp_credentials WHERE server = 'mail'")
    assert len(rows) == 2 and all(r["tokens"]["access_token"] for r in rows), "the tokens are in PostgreSQL"
    assert await bot.core.mcp.sweep(idle_s=0) == 2, "idle connections are closed"
    assert (await whoami(bot, fake_llm, "2"))["result"] == "you are bob", "opened again on use"

    # a restart: a new core on the same database reuses the stored tokens (no new authorization)
    await bot.web.stop()
    await bot.core.mcp.close()
    again = await start_bot(make_core, bots, mail, tmp_path)
    await tools_offered(again)
    assert (await whoami(again, fake_llm, "2"))["result"] == "you are bob"
    assert (await whoami(again, fake_llm, "1"))["result"] == "you are alice"
    assert mail.auth.authorized == 2, "no one was asked to authorize again"


async def test_a_group_turn_gets_no_per_person_tool_and_disconnect_forgets(
    make_core: MakeCore, fake_llm: FakeOpenAI, mail: Mail, bots: list[Bot], tmp_path: Path
) -> None:
    bot = await start_bot(make_core, bots, mail, tmp_path)
    assert await connect(bot, "1", "alice") == "Connected mail. You can close this tab."
    await tools_offered(bot)

    in_group = await whoami(bot, fake_llm, "1", chat="-100", kind="group")
    assert WHOAMI not in tool_names(fake_llm.requests[-2]), "not offered in a group"
    assert not in_group["ok"] and "alice" not in json.dumps(in_group), "and refused when named anyway"
    group_connect = await bot.core.command(incoming("/mcp connect mail", user="1", chat="-100", kind="group"),
                                           "mcp", "connect mail")  # fmt: skip
    assert group_connect == "Send /mcp connect mail in a private chat with me: the link is yours alone."
    admins_only = await bot.core.command(incoming("/mcp", user="1"), "mcp", "")
    assert admins_only == "Only an admin can see and manage the tool servers.", "the rest of /mcp stays for admins"

    assert (await whoami(bot, fake_llm, "1"))["result"] == "you are alice"
    said = await bot.core.command(incoming("/mcp disconnect mail", user="1"), "mcp", "disconnect mail")
    assert said == "Forgot your mail account."
    assert await bot.core.pool.fetchval("SELECT count(*) FROM mcp_credentials") == 0
    gone = await whoami(bot, fake_llm, "1")
    assert not gone["ok"] and "/mcp connect mail" in json.dumps(gone)


async def test_a_link_works_once_and_the_account_moves_on_link_and_shows_in_the_export(
    make_core: MakeCore, fake_llm: FakeOpenAI, mail: Mail, bots: list[Bot], tmp_path: Path
) -> None:
    bot = await start_bot(make_core, bots, mail, tmp_path)
    said = await bot.core.command(incoming("/mcp connect mail", user="3"), "mcp", "connect mail")
    assert isinstance(said, str)
    async with httpx.AsyncClient() as browser:
        login = await browser.get(said.splitlines()[-1])
        callback = (await browser.get(login.headers["location"] + "&user=carol")).headers["location"]
        assert (await browser.get(callback)).text.strip() == "Connected mail. You can close this tab."
        again = await browser.get(callback)
        assert again.status_code == 400 and "expired or was used already" in again.text
        state = dict(p.split("=", 1) for p in urlsplit(callback).query.split("&"))["state"]
        forged = await browser.get(f"{bot.base}/mcp/oauth/callback?state={state}x&code=stolen")
        assert forged.status_code == 400

    export = await bot.core.command(incoming("/export", user="3"), "export", "", must_answer=True)
    assert isinstance(export, FileAnswer)
    data = json.loads(export.data)
    assert [m["server"] for m in data["mcp_accounts"]] == ["mail"]
    assert "access_token" not in export.data.decode() and "refresh" not in export.data.decode()

    # carol's account is merged into dave's (/link with dave's code): her connection comes along
    code = await new_code(bot.core, incoming("", user="4", name="Dave"))
    await say(bot.core, incoming("", user="3", name="Carol"), "link", code)
    await tools_offered(bot)
    assert (await whoami(bot, fake_llm, "4"))["result"] == "you are carol"
    await bot.core.command(incoming("/forget_me confirm", user="4"), "forget_me", "confirm")
    assert await bot.core.pool.fetchval("SELECT count(*) FROM mcp_credentials") == 0, "gone with the account"


async def test_tokens_the_server_no_longer_takes_ask_the_person_to_connect_again(
    make_core: MakeCore, fake_llm: FakeOpenAI, mail: Mail, bots: list[Bot], tmp_path: Path
) -> None:
    bot = await start_bot(make_core, bots, mail, tmp_path)
    assert await connect(bot, "1", "alice") == "Connected mail. You can close this tab."
    await tools_offered(bot)
    assert (await whoami(bot, fake_llm, "1"))["result"] == "you are alice"
    mail.auth.tokens.clear()  # the server forgot them (revoked, expired)
    mail.auth.refresh.clear()
    refused = await whoami(bot, fake_llm, "1")
    assert not refused["ok"] and "/mcp connect mail" in json.dumps(refused), refused


async def test_an_access_token_that_expired_while_unused_is_refreshed_not_refused(
    make_core: MakeCore, fake_llm: FakeOpenAI, mail: Mail, bots: list[Bot], tmp_path: Path, clock: FakeClock
) -> None:
    bot = await start_bot(make_core, bots, mail, tmp_path)
    assert await connect(bot, "1", "alice") == "Connected mail. You can close this tab."
    await tools_offered(bot)
    await bot.core.mcp.sweep(idle_s=0)  # her connection idles out
    clock.advance(hours=2)  # past the access token's hour: the server no longer takes it
    mail.auth.tokens.clear()
    assert (await whoami(bot, fake_llm, "1"))["result"] == "you are alice", "refreshed with her refresh token"
    assert mail.auth.authorized == 1 and len(mail.auth.tokens) == 1
