"""Connections to real MCP servers (tests/mcp_servers.py, the SDK's MCPServer): in memory, a stdio child and
Streamable HTTP on 127.0.0.1; killed, restarted and absent servers; timeouts; results made safe for the prompt."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from mcp import types
from mcp.client import Client
from mcp.shared.exceptions import MCPError

from core.constants import MCP_RESULT_CHARS
from core.mcp_servers.config import ServerConfig
from core.mcp_servers.connection import INHERITED_ENV, CallFailed, Connection, RemoteTool
from core.mcp_servers.results import cap, clean, outcome
from core.media.images import prepare
from tests.mcp_servers import DIES_AFTER_LISTING, DIES_AT_ONCE, PNG, HttpServer, build_server, free_port

ROOT = Path(__file__).resolve().parent.parent
CHILD = ServerConfig(
    name="kid", command=sys.executable, args=("-m", "tests.mcp_servers", "stdio"), cwd=str(ROOT), env={"KID": "on"}
)
FAST: dict[str, Any] = {"backoff": (0.001,), "pause_s": 0.05}  # no real waiting between attempts
LOGGER = "core.mcp_servers.connection"


class MemoryConnection(Connection):
    """A Connection to an in-process server (the SDK's in-memory transport; `mode` legacy: the handshake era)."""

    def __init__(self, config: ServerConfig, mode: str = "auto", **kw: Any) -> None:
        """A connection to a fresh build_server()."""
        super().__init__(config, **kw)
        self.server, self.mode = build_server("memory"), mode

    def _make_client(self, number: int) -> Client:
        """The SDK's Client on the server itself."""
        return Client(self.server, mode=self.mode, message_handler=self._on_message, cache=None)


class LegacyConnection(Connection):
    """A Connection that speaks the handshake era (sessions the server keeps: a restart loses them)."""

    def _make_client(self, number: int) -> Client:
        """The SDK's Client on the usual transport, mode legacy."""
        return Client(self._transport(number), mode="legacy", message_handler=self._on_message, cache=None)


@asynccontextmanager
async def running(conn: Connection, timeout: float = 10.0) -> AsyncIterator[Connection]:
    """`conn` started and ready; closed afterwards."""
    conn.start()
    try:
        assert await conn.ready(timeout), conn.last_error
        yield conn
    finally:
        await conn.close()


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait until `predicate()` holds (checked every few milliseconds)."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 (states of a connection and files of another process: no event)
            await asyncio.sleep(0.002)


def dead(pid: int) -> bool:
    """Whether process `pid` is gone, or only its zombie is left (every thread exited: its pipes are closed); read
    without yielding to the loop. Not the leader's "Z" alone: it shows while other threads still hold the files."""
    states = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").glob("*"))
    except OSError:  # the process went while its threads were being listed
        return True
    for task in tasks:
        try:
            states.append(task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):  # that thread is just going
            return False
    return all(state in ("Z", "X") for state in states)


def kill_and_wait(pid: int) -> None:
    """kill -9 `pid` and wait (blocking: the event loop sees nothing meanwhile) until it is gone."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not dead(pid):
        assert time.monotonic() < deadline, "the child did not die"


async def text(conn: Connection, name: str, /, **arguments: Any) -> str:
    """A call's text, which must be ok."""
    result = await conn.call(name, arguments)
    assert result.ok, result.text
    return result.text


# In memory: listing, calling, filtering, both protocol eras.


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_tools_are_listed_filtered_and_called(mode: str) -> None:
    seen: list[tuple[str, tuple[RemoteTool, ...]]] = []
    config = ServerConfig(name="mem", include=("*",), exclude=("big", "pic*"))
    async with running(MemoryConnection(config, mode, on_tools=lambda s, t: seen.append((s, t)))) as conn:
        names = {t.name for t in conn.tools}
        assert {"echo", "forget", "slow", "weather"} <= names and not names & {"big", "picture"}
        assert seen == [("mem", conn.tools)]
        echo = next(t for t in conn.tools if t.name == "echo")
        forget = next(t for t in conn.tools if t.name == "forget")
        assert (echo.read_only, forget.destructive, echo.description) == (True, True, "Say `text` back.")
        assert echo.input_schema["properties"]["text"]["type"] == "string"
        assert await text(conn, "echo", text="hi") == "hi"
        with pytest.raises(CallFailed, match="excluded by its configuration") as failed:
            await conn.call("big", {"chars": 1})
        assert failed.value.reached is False


async def test_a_tool_that_needs_task_support_is_not_offered() -> None:
    """Issue 31, 6: a 2025-11-25 tool marked taskSupport required (server-everything's simulate-research-query) can
    only be called as a task, which the bot does not do."""
    async with running(MemoryConnection(ServerConfig(name="mem"), "legacy")) as conn:
        names = {t.name for t in conn.tools}
        assert "echo" in names and "research" not in names


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_changed_tool_list_is_read_again(mode: str) -> None:
    seen: list[tuple[RemoteTool, ...]] = []
    async with running(MemoryConnection(ServerConfig(name="mem"), mode, on_tools=lambda _, t: seen.append(t))) as conn:
        assert "fresh" not in {t.name for t in conn.tools}
        assert await text(conn, "grow", tool="fresh") == "grown"
        await until(lambda: "fresh" in {t.name for t in conn.tools}, "the new tool listed")
        assert len(seen) == 2 and "fresh" in {t.name for t in seen[-1]}
        assert await text(conn, "fresh") == "new"


async def test_results_are_made_safe_for_the_prompt() -> None:
    async with running(MemoryConnection(ServerConfig(name="mem"))) as conn:
        assert await text(conn, "tagged") == "sum is 3"  # tag characters, zero-width and bidi controls gone
        assert await text(conn, "weather", city="Oslo") == '{"city":"Oslo","temp_c":21,"sky":"clear"}'
        assert await text(conn, "echo", text="plain") == "plain"  # {"result": "plain"} only wraps the text
        long = await text(conn, "big", chars=50_000)
        assert len(long) <= MCP_RESULT_CHARS and long.startswith("HEAD") and long.endswith("TAIL")
        assert "characters cut …]" in long
        failed = await conn.call("broken", {})
        assert (failed.ok, failed.text) == (False, "Error executing tool broken: the disk is on fire")
        picture = await conn.call("picture", {})
        assert picture.ok and picture.images == ((PNG, "image/png"),)
        assert picture.text.startswith("a dot")


async def test_an_image_with_a_bad_checksum_in_its_colour_profile_is_kept() -> None:
    """Issue 31, 6: server-everything's sample PNG (a wrong iCCP checksum): image viewers skip that chunk, Pillow
    refused the whole file ("not an image"); it is made ready for the model like a photo now."""
    async with running(MemoryConnection(ServerConfig(name="mem"))) as conn:
        profiled = await conn.call("profiled", {})
        assert profiled.ok and len(profiled.images) == 1
        photo = await prepare(profiled.images[0][0])  # the media store's own step before keeping it
        assert (photo.width, photo.height) == (4, 4)


async def test_an_embedded_text_resource_comes_with_its_text() -> None:
    """Issue 31, 6: the model reads the text; a binary resource stays a line."""
    async with running(MemoryConnection(ServerConfig(name="mem"))) as conn:
        assert await text(conn, "embedded") == "\n".join(
            [
                "[resource: mem://note.md (text/markdown)]",
                "# Note",
                "body",
                "[resource: mem://a.bin (application/octet-stream)]",
            ]
        )


async def test_a_result_holds_no_nul_character() -> None:
    """Issue 31, 1: U+0000 in structured content (a key, a value) is gone, not kept as the JSON escape \\u0000 that
    PostgreSQL's jsonb refuses."""
    async with running(MemoryConnection(ServerConfig(name="mem"))) as conn:
        assert await text(conn, "nul") == '{"name":"ab"}'
    raw = types.CallToolResult(content=[types.TextContent(type="text", text="a\x00b")], structured_content={"k": 1})
    assert outcome(raw).text == 'ab\n{"k":1}'


async def test_reconnect_leaves_the_session_and_lists_again() -> None:
    seen: list[tuple[RemoteTool, ...]] = []
    async with running(MemoryConnection(ServerConfig(name="mem"), on_tools=lambda _, t: seen.append(t))) as conn:
        await conn.reconnect()
        assert conn.state == "connecting"
        assert await conn.ready(5) and len(seen) == 2
        assert await text(conn, "echo", text="hi") == "hi"


def test_outcome_mentions_resources_and_keeps_structured_content_beside_other_text() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="found 2\u2066"),
            types.ResourceLink(type="resource_link", name="notes.md", uri="file:///notes.md?x=1\nnext"),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(uri="mem://a", mime_type="text/plain", text="the note"),
            ),
            types.ImageContent(type="image", data="not base64!", mime_type="image/png"),
        ],
        structured_content={"count": 2, "names": ["a", "b"]},
    )
    done = outcome(result)
    assert done.text.splitlines() == [
        "found 2",
        "[resource link: notes.md file:///notes.md?x=1 next]",
        "[resource: mem://a (text/plain)]",
        "the note",
        "[an image (image/png) that could not be read]",
        '{"count":2,"names":["a","b"]}',
    ]
    assert done.ok and done.images == ()
    image = types.ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png")
    assert outcome(types.CallToolResult(content=[image], is_error=True)).images == ((PNG, "image/png"),)


def test_the_cap_keeps_head_and_tail_and_says_the_cut() -> None:
    body = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    cut = cap(body, 1000)
    assert len(cut) == 1000 and cut.startswith(body[:500]) and cut.endswith(body[-300:])
    head, marker, tail = cut.split("\n")
    assert marker == f"[… {10_000 - len(head) - len(tail)} characters cut …]"
    assert cap("short", 1000) == "short"
    assert clean("a\U000e0041\u200bb\u202ec\x07\td\ne\U000e0101") == "abc\td\ne"


# A stdio child: its environment, a timeout, a kill between calls and one during a call.


async def test_a_stdio_child_gets_only_its_own_environment_and_the_ways_to_the_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing of the bot's but PATH, HOME, LANG and, when set, the certificate and proxy variables (issue 31, 6: uvx
    and npx behind a proxy or a private CA)."""
    for name in ("LLM_API_KEY", "TELEGRAM_BOT_TOKEN", "DATABASE_URL", "SHELL", "USER", "LOGNAME"):
        monkeypatch.setenv(name, "parent-secret")
    for name in INHERITED_ENV[3:]:
        monkeypatch.delenv(name, raising=False)
    network = {"SSL_CERT_FILE": "/etc/ca.pem", "NODE_EXTRA_CA_CERTS": "/etc/ca.pem", "HTTPS_PROXY": "http://p:3128"}
    for name, value in {**network, "no_proxy": "localhost"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")  # not C: the child's Python adds no LC_CTYPE of its own
    async with running(Connection(CHILD, extra_env={"PERSON_TOKEN": "p"})) as conn:
        keys = set((await text(conn, "env_keys")).split())
        expected = {"PATH", "LANG", "KID", "PERSON_TOKEN", "no_proxy", *network}
        assert keys == expected | ({"HOME"} & set(os.environ))


async def test_a_slow_tool_times_out_and_the_session_stays_usable() -> None:
    async with running(Connection(replace(CHILD, timeout=0.4))) as conn:
        pid = await text(conn, "pid")
        started = time.monotonic()
        with pytest.raises(CallFailed) as failed:
            await conn.call("slow", {"seconds": 30})
        assert time.monotonic() - started < 0.4 + 5  # its own timeout, not the 30 s the tool takes
        assert str(failed.value) == "slow on server 'kid' gave no answer within 0.4 s: the outcome is unknown"
        assert failed.value.reached is True
        assert await text(conn, "echo", text="still here") == "still here"
        assert await text(conn, "pid") == pid and conn.failures == 0  # the same session, not a new one


async def test_a_killed_child_is_started_again_and_a_call_that_never_reached_it_is_sent_again() -> None:
    async with running(Connection(CHILD, **FAST)) as conn:
        first = int(await text(conn, "pid"))
        kill_and_wait(first)  # the loop has not seen it die: the next call writes into the dead child's pipe
        second = int(await text(conn, "pid"))
        assert second != first and conn.state == "ready"
        kill_and_wait(second)
        await until(lambda: conn.state != "ready" or conn.tools == (), "the death noticed", timeout=2)
        assert int(await text(conn, "pid")) not in (first, second)


async def test_a_call_cut_by_the_child_dying_has_an_unknown_outcome(tmp_path: Path) -> None:
    async with running(Connection(CHILD, **FAST)) as conn:
        pid = int(await text(conn, "pid"))
        mark = tmp_path / "arrived"
        call = asyncio.create_task(conn.call("slow", {"seconds": 30, "mark": str(mark)}))
        await until(mark.exists, "the call at the server")
        kill_and_wait(pid)
        with pytest.raises(CallFailed) as failed:
            await call
        assert failed.value.reached is True and str(failed.value).endswith("the outcome is unknown")
        assert await text(conn, "echo", text="again") == "again"


async def test_close_while_connecting_and_a_server_that_never_answers() -> None:
    mute = ServerConfig(name="mute", command=sys.executable, args=("-c", "import sys; sys.stdin.read()"))
    conn = Connection(replace(mute, connect_timeout=0.3), backoff=(30,))
    conn.start()
    assert conn.state == "connecting"  # start() does not wait for the server
    await until(lambda: conn.failures == 1, "the connect timeout")
    assert (conn.state, conn.last_error) == ("failing", "no answer within 0.3 s")
    started = time.monotonic()
    await conn.close()  # in the middle of its backoff
    assert (conn.state, time.monotonic() - started < 5) == ("closed", True)  # not after the 30 s backoff
    stuck = Connection(mute)
    stuck.start()
    await asyncio.sleep(0)
    started = time.monotonic()
    await stuck.close()  # in the middle of connecting: the child's stdin closes and it exits
    assert stuck.state == "closed" and time.monotonic() - started < 5  # not after a connect timeout
    with pytest.raises(CallFailed, match="is not running") as failed:
        await stuck.call("echo", {"text": "x"})
    assert failed.value.reached is False


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warning lines the connections logged."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


async def test_a_child_that_dies_while_connecting_gets_the_backoff_and_the_pause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 31, 4: its death is noticed by the transport first (the session "lost"), which must not skip the wait."""
    starts = tmp_path / "starts"
    dying = ServerConfig(name="dying", command=sys.executable, args=("-c", DIES_AT_ONCE, str(starts)))
    conn = Connection(dying, backoff=(0.05,), pause_s=30)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    conn.start()
    try:
        await until(lambda: conn.state == "paused", "paused")
        await asyncio.sleep(0.3)  # a loop without the pause would start dozens more meanwhile
        assert (starts.read_text(), conn.failures, conn.state) == ("...", 3, "paused")
        assert warnings(caplog) == [f"MCP server 'dying': {conn.last_error}"], "one line for the whole streak"
        await conn.reconnect()  # the operator's /mcp reconnect does not wait for the pause
        await until(lambda: starts.read_text() == "....", "a fourth start")
    finally:
        await conn.close()


async def test_a_server_that_dies_after_each_handshake_gets_the_backoff_and_the_pause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ready and gone at once, again and again: the first time it is connected again at once (a restart), from the
    second on the sessions count as failures."""
    starts = tmp_path / "starts"
    brief = ServerConfig(name="brief", command=sys.executable, args=("-c", DIES_AFTER_LISTING, str(starts)))
    conn = Connection(brief, backoff=(0.05,), pause_s=30, stable_s=5)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    conn.start()
    try:
        await until(lambda: conn.state == "paused", "paused")
        await asyncio.sleep(0.3)
        assert (starts.read_text(), conn.failures, conn.state) == ("....", 3, "paused")
        assert conn.last_error is not None and conn.last_error.endswith("after connecting, 4 times in a row")
        assert len(warnings(caplog)) == 1
    finally:
        await conn.close()


async def test_errors_are_one_line_without_secrets() -> None:
    config = ServerConfig(
        name="gone", command="/nonexistent/bin/mcp-thing", env={"API_TOKEN": "s3cret-value"}, headers={}
    )
    conn = Connection(config, extra_headers={"Authorization": "Bearer t0ken-value"}, **FAST)
    conn.start()
    try:
        await until(lambda: conn.failures >= 1, "the failed start")
        assert conn.last_error == "cannot start mcp-thing: No such file or directory"
        leaky = MCPError(-1, "denied for s3cret-value (t0ken-value)\nat https://u:pw@h.example/x?key=k9#f")
        assert conn.describe(leaky) == "denied for … (…) at https://h.example/x"
    finally:
        await conn.close()


# Streamable HTTP: headers, a restarted server, a server that is down.


@pytest.mark.parametrize("kind", [Connection, LegacyConnection])
async def test_http_sends_the_headers_and_survives_a_restart(kind: type[Connection]) -> None:
    async with HttpServer() as server:
        config = ServerConfig(name="web", url=server.url, headers={"X-Operator": "op"})
        async with running(kind(config, extra_headers={"X-Person": "p1"}, **FAST)) as conn:
            assert await text(conn, "header", name="x-operator") == "op"
            assert await text(conn, "header", name="x-person") == "p1"
            await server.stop()
            await server.start()  # the same port, a new server: whatever it knew of us is gone
            assert await text(conn, "echo", text="after the restart") == "after the restart"
            await server.stop()
            with pytest.raises(CallFailed) as failed:
                await conn.call("echo", {"text": "nobody home"})
            assert failed.value.reached is False
            await server.start()
            assert await conn.ready(5)
            assert await text(conn, "echo", text="back") == "back"


async def test_a_restarted_server_that_says_400_for_the_lost_session_is_reached_again() -> None:
    """Issue 31, 5: server-everything answers a session it does not know with 400 "No valid session ID provided";
    the call never ran, so it goes again on a new session (once)."""
    calls: list[str] = []
    async with HttpServer(build=lambda: build_server("http", calls), lost_session=400) as server:
        config = ServerConfig(name="web", url=server.url)
        async with running(LegacyConnection(config, **FAST)) as conn:
            assert await text(conn, "forget", what="before") == "forgot before"
            await server.stop()
            await server.start()
            assert await text(conn, "forget", what="after") == "forgot after"
            assert calls == ["before", "after"] and conn.state == "ready"


async def test_a_server_that_is_down_pauses_after_three_failures_then_comes_back() -> None:
    server = HttpServer(free_port())
    config = ServerConfig(name="down", url=f"{server.url}?key=hunter22", timeout=0.5)
    conn = Connection(config, **FAST)
    conn.start()
    try:
        await until(lambda: conn.state == "paused", "paused")
        assert conn.failures >= 3
        assert conn.last_error == f"cannot connect to http://127.0.0.1:{server.port}"
        with pytest.raises(CallFailed, match="is paused after") as failed:
            await conn.call("echo", {"text": "x"})
        assert failed.value.reached is False and "hunter22" not in str(failed.value)
        await server.start()
        assert await conn.ready(5)
        assert conn.failures == 0 and conn.last_error is None
        assert await text(conn, "echo", text="up") == "up"
    finally:
        await conn.close()
        await server.stop()
