"""The sessions API over real HTTP (issue 22): a WebServer with the /v1 routes on 127.0.0.1, httpx as the client, the
fake model, the real PostgreSQL. Sessions, messages with parts, SSE in order and resumed by Last-Event-ID, the same
parts in GET …/messages and in the journal, one-shot, the 401/404 rules, artifacts, rate and size limits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest

from adapters.http import HttpApi, serve_api
from bot.web import WebServer
from core import Core
from core.storage.db import Pool
from tests.conftest import MakeCore
from tests.fake_openai import FakeOpenAI, Reply
from tests.helpers import incoming

ANN, BOB = "8100", "8200"


@dataclass
class Served:
    """A running server with its core, and a client per person."""

    core: Core
    server: WebServer
    http: HttpApi
    url: str

    def client(self, secret: str | None) -> httpx.AsyncClient:
        """A client that sends `secret` as its bearer token."""
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=10)


Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(make_core: MakeCore) -> AsyncIterator[Serve]:
    """Start the HTTP server with the API for a Core (settings overrides by name)."""
    started: list[WebServer] = []

    async def start(**overrides: Any) -> Served:
        core = make_core(**overrides)
        server = WebServer(core, (), 0, host="127.0.0.1")
        http = serve_api(server.app, core)  # as bot/ serves it: the API, its errors, the web page
        await server.start()
        started.append(server)
        return Served(core, server, http, f"http://127.0.0.1:{server.port}")

    yield start
    for server in started:
        await server.stop()


async def token_of(core: Core, user: str, name: str = "laptop") -> str:
    """A new API token of a Telegram user (as /token new makes it)."""
    secret = await core.new_api_token(incoming("/token", user=user, name=f"user{user}"), name)
    assert isinstance(secret, str), secret
    return secret


async def sse_events(
    response: httpx.Response, lines: AsyncIterator[str] | None = None
) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of every event of a stream (read on from `lines` when given), until it ends."""
    out: list[tuple[str | None, str, dict[str, Any]]] = []
    eid, event, data = None, "", ""
    async for line in lines or response.aiter_lines():
        if line.startswith("id: "):
            eid = line[4:]
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line == "" and event:
            out.append((eid, event, json.loads(data)))
            eid, event, data = None, "", ""
    return out


async def test_session_message_streams_in_order_and_is_stored_with_the_same_parts(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    s = await serve()
    fake_llm.script(
        Reply(text="Let me note that.", tool_calls=[("manage_tasks", {"action": "create", "title": "Buy milk"})]),
        Reply(text="Noted: **Buy milk** is on your list."),
    )
    async with s.client(await token_of(s.core, ANN)) as c:
        made = await c.post("/v1/sessions", json={"title": "Groceries\nand more"})
        assert made.status_code == 201, made.text
        session = made.json()
        assert session["title"] == "Groceries and more" and session["id"].startswith("ses_")
        sid = session["id"]
        async with c.stream(
            "POST",
            f"/v1/sessions/{sid}/messages",
            json={"content": "add buy milk"},
            headers={"Accept": "text/event-stream"},
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = await sse_events(r)
        kinds = [e[1] for e in events]
        assert kinds[:2] == ["message.created", "message.created"]
        assert kinds[-1] == "message.completed"
        assert kinds.index("tool.call") < kinds.index("tool.result") < len(kinds) - 1
        assert all(e[0] for e in events), "every event has an id"
        numbers = [int(e[0].rpartition(":")[2]) for e in events if e[0]]
        assert numbers == sorted(numbers)
        streamed_text = "".join(e[2]["delta"] for e in events if e[1] == "message.part.delta")
        assert streamed_text == "Let me note that.Noted: **Buy milk** is on your list."
        completed = events[-1][2]["message"]
        assert completed["role"] == "assistant" and completed["status"] == "done"
        assert [p["type"] for p in completed["parts"]] == ["text", "tool_call", "tool_result", "text"]
        call = next(e[2] for e in events if e[1] == "tool.call")
        assert call["name"] == "manage_tasks" and call["args"]["title"] == "Buy milk" and call["part"] == 1
        # the same message, the same parts, in GET …/messages
        listed = (await c.get(f"/v1/sessions/{sid}/messages")).json()
        assert [m["role"] for m in listed["messages"]] == ["user", "assistant"]
        assert listed["messages"][0]["parts"] == [{"type": "text", "text": "add buy milk"}]
        assert listed["messages"][1] == completed
        assert listed["before"] is None
    # and in PostgreSQL: the turn, its tool row, its answer, in the api chat owned by Ann's identity
    rows = await pool.fetch(
        "SELECT m.role, m.content FROM messages m JOIN chats c ON c.id = m.chat_id"
        " WHERE c.platform = 'api' AND c.platform_chat_id = $1 ORDER BY m.id",
        sid,
    )
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[-1]["content"] == "Noted: **Buy milk** is on your list."
    assert await pool.fetchval("SELECT title FROM tasks WHERE title = 'Buy milk'") == "Buy milk"


async def test_json_answer_without_event_stream_and_one_shot(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.default = Reply(text="Hello there.")
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"})
        assert r.status_code == 200
        body = r.json()
        assert body["role"] == "assistant" and body["session_id"] == sid
        assert body["parts"] == [{"type": "text", "text": "Hello there."}]
        one = await c.post("/v1/one-shot", json={"prompt": "what's up?"})
        assert one.status_code == 200
        shot = one.json()
        assert shot["session_id"] != sid and shot["parts"] == [{"type": "text", "text": "Hello there."}]
        listed = (await c.get("/v1/sessions")).json()["sessions"]
        assert [x["id"] for x in listed] == [shot["session_id"], sid]
        assert listed[0]["title"] == "what's up?"


async def test_a_client_that_goes_away_loses_nothing_and_resumes_by_last_event_id(
    serve: Serve, fake_llm: FakeOpenAI
) -> None:
    s = await serve()
    release = asyncio.Event()

    async def slow(body: dict[str, Any]) -> Reply:
        await release.wait()
        return Reply(text="The long answer, finally.")

    fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "list"})]), slow)
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        seen: list[tuple[str | None, str, dict[str, Any]]] = []
        async with c.stream(
            "POST",
            f"/v1/sessions/{sid}/messages",
            json={"content": "list and think"},
            headers={"Accept": "text/event-stream"},
        ) as r:
            eid, event = None, ""
            async for line in r.aiter_lines():  # read until the tool's result, then hang up
                if line.startswith("id: "):
                    eid = line[4:]
                elif line.startswith("event: "):
                    event = line[7:]
                elif line == "" and event:
                    seen.append((eid, event, {}))
                    if event == "tool.result":
                        break
        last = seen[-1][0]
        assert last is not None
        release.set()
        async with c.stream("GET", f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": last}) as r:
            rest = await sse_events(r)
        assert rest[0][1] != "message.created", "a resumed stream goes on from where it was"
        assert "tool.result" not in [e[1] for e in rest]
        assert rest[-1][1] == "message.completed"
        assert rest[-1][2]["message"]["parts"][-1] == {"type": "text", "text": "The long answer, finally."}
        stored = (await c.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        assert stored[-1] == rest[-1][2]["message"]


async def test_401_404_and_no_existence_leak(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    ann_secret, bob_secret = await token_of(s.core, ANN), await token_of(s.core, BOB)
    async with s.client(None) as nobody, s.client("abt_" + "x" * 32) as wrong:
        for c in (nobody, wrong):
            r = await c.get("/v1/sessions")
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "unauthorized" and "/token new" in r.json()["error"]["message"]
    async with s.client(ann_secret) as ann, s.client(bob_secret) as bob:
        sid = (await ann.post("/v1/sessions", json={"title": "Ann's"})).json()["id"]
        for method, path, body in (
            ("GET", f"/v1/sessions/{sid}", None),
            ("GET", f"/v1/sessions/{sid}/messages", None),
            ("POST", f"/v1/sessions/{sid}/messages", {"content": "what did Ann say?"}),
            ("DELETE", f"/v1/sessions/{sid}", None),
            ("GET", f"/v1/sessions/{sid}/stream", None),
        ):
            theirs = await bob.request(method, path, json=body)
            never = await bob.request(method, path.replace(sid, "ses_doesnotexist0000000000"), json=body)
            assert theirs.status_code == never.status_code == 404, (method, path)
            assert theirs.json() == never.json() == {"error": {"type": "not_found", "message": "No such session."}}
        assert (await bob.get("/v1/sessions")).json() == {"sessions": []}
        assert (await ann.get(f"/v1/sessions/{sid}")).status_code == 200
        # revoked: 401 at once
        assert await s.core.command(incoming("/token", user=ANN), "token", "revoke laptop") is not None
        assert (await ann.get("/v1/sessions")).status_code == 401


async def test_bad_requests_get_one_clear_line(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve(LLM_MODELS="fake-model,other-model", API_REQUESTS_PER_MINUTE=8)
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "hi", "model": "gpt-secret"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("Unknown model `gpt-secret`")
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"text": "hi"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request"
        assert "\n" not in r.json()["error"]["message"]
        r = await c.post("/v1/sessions", content=b"{" + b" " * (2 << 20) + b"}")  # files: tests/test_http_uploads.py
        assert r.status_code == 413 and r.json()["error"]["type"] == "too_large"
        models = (await c.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["fake-model", "other-model"]
        statuses = [(await c.get("/v1/sessions")).status_code for _ in range(6)]
        assert statuses[-1] == 429
        limited = await c.get("/v1/sessions")
        assert limited.json()["error"]["type"] == "rate_limited" and int(limited.headers["Retry-After"]) >= 1


async def test_long_tool_result_is_cut_with_the_whole_as_an_artifact(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    long_title = "Milk " + "x" * 480
    fake_llm.script(
        *[Reply(tool_calls=[("manage_tasks", {"action": "create", "title": f"{i} {long_title}"})]) for i in range(5)],
        Reply(tool_calls=[("manage_tasks", {"action": "list"})]),
        Reply(text="Done."),
    )
    async with s.client(await token_of(s.core, ANN)) as c, s.client(await token_of(s.core, BOB)) as bob:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        answer = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": "make five and list"})).json()
        results = [p for p in answer["parts"] if p["type"] == "tool_result"]
        listing = results[-1]
        assert listing["artifact"] is not None and len(listing["result"]) <= 2001
        whole = await c.get(f"/v1/artifacts/{listing['artifact']}")
        assert whole.status_code == 200
        assert whole.json()["name"] == "manage_tasks" and len(whole.json()["content"]) > 2001
        assert whole.json()["content"].startswith(listing["result"].rstrip("…"))
        assert (await bob.get(f"/v1/artifacts/{listing['artifact']}")).status_code == 404


async def test_tokens_act_as_their_person_not_as_an_admin(serve: Serve, fake_llm: FakeOpenAI, pool: Pool) -> None:
    s = await serve(ADMINS=f"telegram:{ANN}")
    fake_llm.default = Reply(text="ok")
    async with s.client(await token_of(s.core, ANN)) as ann:
        sid = (await ann.post("/v1/sessions", json={})).json()["id"]
        await ann.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"})
    offered = {t["function"]["name"] for t in fake_llm.requests[-1].get("tools", [])}
    assert "execute_sql" in offered, "Ann is an admin: her token has her admin tools"
    console = await s.core.new_api_token(incoming("/token", platform="console", user="local"), "cli")
    assert isinstance(console, str)
    async with s.client(console) as cli:
        sid = (await cli.post("/v1/sessions", json={})).json()["id"]
        await cli.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"})
    offered = {t["function"]["name"] for t in fake_llm.requests[-1].get("tools", [])}
    assert "execute_sql" not in offered, "the terminal's token is no admin over HTTP unless ADMINS names it"


async def test_tasks_memory_and_reminders_in_a_session(serve: Serve, fake_llm: FakeOpenAI, pool: Pool) -> None:
    s = await serve()
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum"})]),
        Reply(text="Added."),
    )
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        await c.post(f"/v1/sessions/{sid}/messages", json={"content": "remind me to call mum"})
        tasks = (await c.get("/v1/tasks")).json()["text"]
        assert "Call mum" in tasks
        # the same account over Telegram sees the same task
        said = await s.core.command(incoming("/tasks", user=ANN), "tasks")
        assert isinstance(said, str) and "Call mum" in said
        assert "remember" in (await c.get("/v1/memory")).json()["text"].lower()
        # a reminder delivered into the session is shown there and never replayed to the model
        from core import ReminderMessage

        task_id = await pool.fetchval("SELECT id FROM tasks WHERE title = 'Call mum'")
        msg = ReminderMessage(task_id, s.core.now(), "api", sid, "", "private", ANN, "Ann", "⏰ Call mum")
        assert await s.http.api.send_reminder(msg)
        assert await s.http.api.send_reminder(msg), "delivered again (a retry): stored once"
        listed = (await c.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        assert [m["role"] for m in listed][-1] == "reminder"
        assert sum(m["role"] == "reminder" for m in listed) == 1
        fake_llm.script(Reply(text="fine"))
        await c.post(f"/v1/sessions/{sid}/messages", json={"content": "next"})
        sent = json.dumps(fake_llm.requests[-1]["messages"])
        assert "⏰ Call mum" not in sent
        assert (await c.delete(f"/v1/sessions/{sid}")).status_code == 204
        from core import DeliveryRefused

        with pytest.raises(DeliveryRefused):
            await s.http.api.send_reminder(msg)


async def test_idempotency_key_answers_once(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.default = Reply(text="Once.")
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        first = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers={"Idempotency-Key": "k1"})
        again = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers={"Idempotency-Key": "k1"})
        assert first.json() == again.json()
        calls = len(fake_llm.requests)
        s.http.api.feeds._by_message.clear()  # as after a restart: the stored answer comes back
        third = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers={"Idempotency-Key": "k1"})
        assert third.json() == first.json() and len(fake_llm.requests) == calls
        listed = (await c.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        assert len(listed) == 2


async def test_sessions_follow_the_person_across_link_export_and_forget_me(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from tests.test_accounts_attacks import link

    s = await serve()
    fake_llm.default = Reply(text="Sure.")
    ann_tg = incoming("/link", user=ANN, name="Ann")
    ann_dc = incoming("/link", platform="discord", user="99" + ANN, name="Ann")
    tg_secret = await token_of(s.core, ANN)
    dc_secret = await s.core.new_api_token(ann_dc, "desk")
    assert isinstance(dc_secret, str)
    async with s.client(tg_secret) as tg, s.client(dc_secret) as dc:
        sid = (await tg.post("/v1/sessions", json={"title": "Ann's plans"})).json()["id"]
        await tg.post(f"/v1/sessions/{sid}/messages", json={"content": "my secret plan is Marmalade"})
        assert (await dc.get(f"/v1/sessions/{sid}")).status_code == 404, "another account until linked"
        await link(s.core, ann_tg, ann_dc)
        assert (await dc.get(f"/v1/sessions/{sid}")).status_code == 200, "one person: one set of sessions"
        exported = await s.core.command(ann_tg, "export")
        from core import FileAnswer

        assert isinstance(exported, FileAnswer)
        data = json.loads(exported.data)
        api_chats = [c for c in data["chats"] if c["platform"] == "api"]
        assert api_chats and "Marmalade" in json.dumps(api_chats)
        said = await s.core.command(ann_tg, "forget_me", {"confirm": "true"}, must_answer=True)
        assert isinstance(said, str)
        assert (await tg.get("/v1/sessions")).status_code == 401, "forgotten: the tokens are gone"
    assert await pool.fetchval("SELECT count(*) FROM chats WHERE platform = 'api'") == 0
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE content LIKE '%Marmalade%'") == 0


async def test_too_long_a_message_and_a_session_deleted_mid_answer(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    s = await serve(MAX_MESSAGE_CHARS=100)
    release = asyncio.Event()

    async def slow(body: dict[str, Any]) -> Reply:
        await release.wait()
        return Reply(text="too late")

    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        long = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": "x" * 150})).json()
        assert long["status"] == "failed" and long["parts"][0]["type"] == "error"
        assert long["parts"][0]["message"].startswith("That message is 150 characters long; I can take up to 100.")
        fake_llm.script(slow)
        async with c.stream(
            "POST",
            f"/v1/sessions/{sid}/messages",
            json={"content": "think slowly"},
            headers={"Accept": "text/event-stream"},
        ) as r:
            lines = r.aiter_lines()
            async for line in lines:
                if line.startswith("event: message.created"):
                    break
            assert (await c.delete(f"/v1/sessions/{sid}")).status_code == 204
            release.set()
            rest = await sse_events(r, lines)
        assert rest[-1][1] == "message.completed"
        assert rest[-1][2]["message"]["status"] == "failed", "the answer had nowhere to go"
    assert await pool.fetchval("SELECT count(*) FROM chats WHERE platform = 'api'") == 0


async def test_resume_where_the_feed_is_gone_gets_the_stored_answer(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.default = Reply(text="Stored and done.")
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        async with c.stream(
            "POST", f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers={"Accept": "text/event-stream"}
        ) as r:
            first = await sse_events(r)
        s.http.api.feeds._by_message.clear()  # as in another process, or after API_FEED_KEEP_S
        mid = first[0][0]
        assert mid is not None
        async with c.stream("GET", f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": mid}) as r:
            again = await sse_events(r)
        assert [e[1] for e in again] == ["message.completed"]
        assert again[0][2]["message"] == first[-1][2]["message"]
        unknown = await c.get(f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": "msg_nope:3"})
        assert "No such message" in unknown.text


async def test_pages_of_messages_go_back_by_cursor(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.default = Reply(text="ok")
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        for i in range(5):
            await c.post(f"/v1/sessions/{sid}/messages", json={"content": f"message {i}"})
        said: list[str] = []
        before: str | None = None
        pages = 0
        while True:
            params = {"limit": "2", **({"before": before} if before else {})}
            page = (await c.get(f"/v1/sessions/{sid}/messages", params=params)).json()
            pages += 1
            said = [m["parts"][0]["text"] for m in page["messages"] if m["role"] == "user"] + said
            before = page["before"]
            if before is None:
                break
        assert pages == 3 and said == [f"message {i}" for i in range(5)]
        bad = await c.get(f"/v1/sessions/{sid}/messages", params={"limit": "1000"})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request"


async def test_a_stream_says_it_is_alive_while_the_model_thinks() -> None:
    from adapters.http import sse
    from core import Assistant, Feed
    from core.timeutil import system_clock

    feed = Feed("ses_x", "msg_1", "hi", system_clock, system_clock())

    async def final(f: Feed) -> Any:
        from adapters.http.models import MessageOut

        return MessageOut(
            id="msg_1-reply", session_id="ses_x", role="assistant", status="done", created_at=f.started_at, parts=[]
        )

    got: list[bytes] = []

    async def read() -> None:
        async for chunk in sse.events(feed, -1, final, idle_s=0.01):
            got.append(chunk)
            if chunk == sse.KEEPALIVE and got.count(sse.KEEPALIVE) == 2:
                feed.push(Assistant("done", None))
                feed.finish()

    await asyncio.wait_for(read(), 5)
    assert got.count(sse.KEEPALIVE) >= 2 and got[-1].startswith(b"id: msg_1:3\nevent: message.completed")


async def test_commands_in_a_session_are_answered_as_the_terminal_answers_them(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    s = await serve(ADMINS=f"telegram:{ANN}")
    fake_llm.script(Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum"})]), Reply(text="Ok."))
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        await c.post(f"/v1/sessions/{sid}/messages", json={"content": "remind me to call mum"})
        asked = len(fake_llm.requests)
        listed = await c.post(f"/v1/sessions/{sid}/messages", json={"content": "  /tasks  "})
        assert listed.status_code == 200, listed.text
        answer = listed.json()
        assert answer["role"] == "assistant" and answer["status"] == "done" and answer["session_id"] == sid
        [part] = answer["parts"]
        assert part["type"] == "text" and "Call mum" in part["text"]
        assert part["text"] == (await c.get("/v1/tasks")).json()["text"], "the chats' own /tasks answer"
        async with c.stream(
            "POST", f"/v1/sessions/{sid}/messages", json={"content": "/help"}, headers={"Accept": "text/event-stream"}
        ) as r:
            events = await sse_events(r)
        kinds = ["message.created", "message.created", "message.part.delta", "message.completed"]
        assert [e[1] for e in events] == kinds
        helped = events[-1][2]["message"]
        assert helped["status"] == "done" and helped["parts"][0]["text"].startswith("I'm your personal assistant")
        assert events[2][2]["delta"] == helped["parts"][0]["text"]
        said = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": "/nope at all"})).json()
        assert said["parts"] == [{"type": "text", "text": "Unknown command /nope — try /help."}]
        mcp = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": "/mcp reconnect nosuch"})).json()
        assert mcp["status"] == "done" and "nosuch" in mcp["parts"][0]["text"]
        # a confirmation says how the API takes it typed, and has its button among the message's choices
        wipe = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": "/memory wipe"})).json()
        text = wipe["parts"][0]["text"]
        assert "/memory wipe confirm" in text and "POST /v1/memory/wipe" in text and "button" not in text
        assert [c["label"] for c in wipe["choices"]] == ["🗑 Yes, wipe my memory"] and wipe["buttons"] == []
        shot = (await c.post("/v1/one-shot", json={"prompt": "/TASKS"})).json()
        assert shot["status"] == "done" and "Call mum" in shot["parts"][0]["text"]
        assert len(fake_llm.requests) == asked, "no command went to the model"
        # a path is a message, not a command; commands are not part of the session's conversation
        fake_llm.script(Reply(text="That is a path."))
        path = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": "/usr/bin/env is what?"})).json()
        assert path["parts"] == [{"type": "text", "text": "That is a path."}]
        sent = json.dumps(fake_llm.requests[-1]["messages"])
        assert "/tasks" not in sent and "/help" not in sent
        stored = (await c.get(f"/v1/sessions/{sid}/messages")).json()["messages"]
        assert [m["parts"][0]["text"] for m in stored if m["role"] == "user"] == [
            "remind me to call mum",
            "/usr/bin/env is what?",
        ]


async def test_a_confirmation_and_a_choice_are_pressed_by_the_caller_only(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from tests.test_memory_command import remember

    s = await serve(LLM_MODELS="fake-model, fake-big")
    await remember(s.core, incoming("/memory", user=ANN), ["Name: Ann"], ["old note"])
    async with s.client(await token_of(s.core, ANN)) as ann, s.client(await token_of(s.core, BOB)) as bob:
        sid = (await ann.post("/v1/sessions", json={})).json()["id"]
        asked = (await ann.post(f"/v1/sessions/{sid}/messages", json={"content": "/memory wipe"})).json()
        assert "It cannot be undone." in asked["parts"][0]["text"] and asked["buttons"] == []
        [wipe] = asked["choices"]
        assert wipe == {"label": "🗑 Yes, wipe my memory", "press": f"mem:wipe:{ANN}", "style": "danger"}
        press = f"/v1/sessions/{sid}/messages/{asked['id']}/press"
        # only the caller: Bob cannot reach Ann's session, nor press her button from his own
        assert (await bob.post(press, json={"press": wipe["press"]})).status_code == 404
        bobs = (await bob.post("/v1/sessions", json={})).json()["id"]
        theirs = await bob.post(f"/v1/sessions/{bobs}/messages/x/press", json={"press": wipe["press"]})
        assert theirs.status_code == 404 and theirs.json()["error"]["message"] == "This button is not for you."
        for bad in ({}, {"press": wipe["press"], "action": "undo"}, {"task_id": 1}, {"press": ""}):
            assert (await ann.post(press, json=bad)).status_code == 400, bad
        assert (await ann.post(press, json={"press": "rem:undo:1x"})).status_code == 404
        assert await pool.fetchval("SELECT count(*) FROM archival_memory") == 1
        wiped = await ann.post(press, json={"press": wipe["press"]})
        assert wiped.status_code == 200 and wiped.json()["text"].startswith("Done — I erased 1 line and 1 archival")
        assert await pool.fetchval("SELECT count(*) FROM archival_memory") == 0
        # the answer's stream, read again, ends without the pressed buttons
        async with ann.stream("GET", f"/v1/sessions/{sid}/stream") as r:
            events = await sse_events(r)
        assert events[-1][2]["message"]["id"] == asked["id"] and events[-1][2]["message"]["choices"] == []
        # a choice, streamed: the models as buttons in message.completed; a press switches
        async with ann.stream(
            "POST", f"/v1/sessions/{sid}/messages", json={"content": "/model"}, headers={"Accept": "text/event-stream"}
        ) as r:
            shown = (await sse_events(r))[-1][2]["message"]
        assert [(c["label"], c["style"]) for c in shown["choices"]] == [
            ("fake-model", "secondary"),
            ("fake-big", "secondary"),
        ]
        big = shown["choices"][1]["press"]
        picked = await ann.post(f"/v1/sessions/{sid}/messages/{shown['id']}/press", json={"press": big})
        assert picked.status_code == 200 and "**fake-big** answers you" in picked.json()["text"]
        assert (
            await pool.fetchval(
                "SELECT model FROM accounts a JOIN users u ON u.account_id = a.id WHERE u.platform_user_id = $1", ANN
            )
            == "fake-big"
        )
    assert fake_llm.requests == []


async def test_the_terminals_own_token_is_never_refused(serve: Serve, fake_llm: FakeOpenAI) -> None:
    from adapters.console import console_incoming

    s = await serve(ALLOWED_USERS=f"telegram:{BOB}")  # the terminal's identity is not named
    fake_llm.default = Reply(text="Hello, terminal.")
    secret = await s.core.new_api_token(console_incoming("/token new laptop"), "laptop")  # as `bot token laptop`
    assert isinstance(secret, str)
    async with s.client(secret) as cli:
        me = await cli.get("/v1/me")
        assert me.status_code == 200, me.text
        assert me.json()["identity"] == "console:local"
        said = (await cli.post("/v1/one-shot", json={"prompt": "hi"})).json()
        assert said["parts"] == [{"type": "text", "text": "Hello, terminal."}]
    offered = {t["function"]["name"] for t in fake_llm.requests[-1].get("tools", [])}
    assert "execute_sql" not in offered, "allowed, but no admin over HTTP unless ADMINS names it"
    admin = await serve(ALLOWED_USERS=f"telegram:{BOB}", ADMINS="console:local")
    async with admin.client(secret) as cli:
        await cli.post("/v1/one-shot", json={"prompt": "hi"})
    assert "execute_sql" in {t["function"]["name"] for t in fake_llm.requests[-1].get("tools", [])}


async def test_a_wrong_or_revoked_token_is_told_so(serve: Serve) -> None:
    s = await serve()
    secret = await token_of(s.core, ANN)
    assert await s.core.command(incoming("/token", user=ANN), "token", "revoke laptop") is not None
    for sent, says in (
        (None, "Send Authorization: Bearer <token>"),
        ("abt_" + "x" * 32, "That bearer token is wrong or revoked"),
        (secret, "That bearer token is wrong or revoked"),
    ):
        async with s.client(sent) as c:
            r = await c.get("/v1/sessions")
        assert r.status_code == 401 and r.json()["error"]["message"].startswith(says), (sent, r.text)
        assert "/token new <name>" in r.json()["error"]["message"]


async def test_a_session_made_without_a_title_is_titled_by_its_first_message(
    serve: Serve, fake_llm: FakeOpenAI
) -> None:
    s = await serve()
    fake_llm.default = Reply(text="ok")
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions")).json()["id"]  # no body at all
        named = (await c.post("/v1/sessions", json={"title": "Mine"})).json()["id"]
        assert (await c.get(f"/v1/sessions/{sid}")).json()["title"] == ""
        long = "Plan the garden:\nroses, tulips and " + "a very long list " * 10
        await c.post(f"/v1/sessions/{sid}/messages", json={"content": long})
        await c.post(f"/v1/sessions/{named}/messages", json={"content": "something else"})
        await c.post(f"/v1/sessions/{sid}/messages", json={"content": "and the second message"})
        titles = {x["id"]: x["title"] for x in (await c.get("/v1/sessions")).json()["sessions"]}
    assert titles[sid] == " ".join(long[:60].split()), "the first message's start, on one line"
    assert titles[named] == "Mine", "a title given is kept"


async def test_event_ids_are_unique_increasing_and_resume_after_each(serve: Serve, fake_llm: FakeOpenAI) -> None:
    s = await serve()
    fake_llm.script(
        Reply(text="Let me look.", tool_calls=[("manage_tasks", {"action": "list"})]), Reply(text="Nothing there.")
    )
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={})).json()["id"]
        async with c.stream(
            "POST", f"/v1/sessions/{sid}/messages", json={"content": "list"}, headers={"Accept": "text/event-stream"}
        ) as r:
            events = await sse_events(r)
        ids = [e[0] for e in events]
        assert all(ids) and len(set(ids)) == len(ids), ids
        numbers = [int(str(i).rpartition(":")[2]) for i in ids]
        assert numbers[:2] == [0, 1] and numbers == sorted(set(numbers)), numbers
        for at, (eid, _, _) in enumerate(events):  # a client that had every event up to this one gets the rest
            async with c.stream("GET", f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": str(eid)}) as r:
                rest = await sse_events(r)
            assert [e[0] for e in rest] == ids[at + 1 :], eid


async def test_tasks_and_memory_are_objects_with_their_markdown_too(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from tests.test_memory_command import remember

    s = await serve(DEFAULT_TIMEZONE="Europe/Berlin")
    fake_llm.script(
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Call mum", "due_at": "2026-11-22T18:00"})]),
        Reply(
            tool_calls=[
                (
                    "manage_tasks",
                    {
                        "action": "create",
                        "title": "Stretch",
                        "due_at": "2026-11-23T08:00",
                        "recurrence": {"kind": "cron", "time": "08:00", "days_of_week": "mon-fri"},
                    },
                )
            ]
        ),
        Reply(tool_calls=[("manage_tasks", {"action": "create", "title": "Someday"})]),
        Reply(text="Done."),
    )
    async with s.client(await token_of(s.core, ANN)) as c:
        await c.post("/v1/one-shot", json={"prompt": "three tasks"})
        body = (await c.get("/v1/tasks")).json()
        assert body["timezone"] == "Europe/Berlin" and "Call mum" in body["text"] and "Stretch" in body["text"]
        mum, stretch, someday = body["tasks"]
        assert mum["title"] == "Call mum" and mum["state"] == "pending" and mum["kind"] == "reminder"
        assert mum["due_at"] == "2026-11-22T17:00:00Z" and mum["due_local"] == "2026-11-22T18:00:00+01:00"
        assert mum["recurrence"] is None and mum["overdue"] is False and isinstance(mum["id"], int)
        assert stretch["recurrence"] == "every mon-fri at 08:00"
        assert someday["due_at"] is None and someday["due_local"] is None
        await remember(s.core, incoming("/memory", user=ANN), ["Name: Ann", "Likes: tea"], ["an old note"])
        memory = (await c.get("/v1/memory")).json()
    assert "1: Name: Ann" in memory["text"]
    human = next(b for b in memory["blocks"] if b["name"] == "human")
    assert human["lines"] == ["Name: Ann", "Likes: tea"] and human["words"] == 4 and human["description"]
    assert memory["word_limit"] == 500 and memory["archival"] == 1 and memory["files"] == 0


async def test_every_command_of_the_catalogue_is_answered_in_a_session_without_the_model(
    serve: Serve, fake_llm: FakeOpenAI
) -> None:
    from core import COMMANDS

    s = await serve(ADMINS=f"telegram:{ANN}")
    async with s.client(await token_of(s.core, ANN)) as c:
        sid = (await c.post("/v1/sessions", json={"title": "commands"})).json()["id"]
        for command in COMMANDS:
            said = (await c.post(f"/v1/sessions/{sid}/messages", json={"content": f"/{command.name}"})).json()
            assert said["status"] == "done", (command.name, said)
            [part] = said["parts"]
            assert part["type"] == "text" and part["text"] and "Unknown command" not in part["text"], command.name
    assert fake_llm.requests == []


async def test_reminder_and_undo_buttons_are_pressed_by_their_owner_only(
    serve: Serve, fake_llm: FakeOpenAI, pool: Pool
) -> None:
    from core import ReminderMessage

    s = await serve()
    async with s.client(await token_of(s.core, ANN)) as ann, s.client(await token_of(s.core, BOB)) as bob:
        sid = (await ann.post("/v1/sessions", json={})).json()["id"]
        # /remind typed in a session: its answer carries an Undo button
        made = (await ann.post(f"/v1/sessions/{sid}/messages", json={"content": "/remind in 10 minutes Tea"})).json()
        [undo] = made["buttons"]
        assert made["parts"][0]["text"].startswith(f"⏰ #{undo['task_id']} Tea")
        assert undo["action"] == "undo" and undo["label"] == "↩️ Undo"
        made_id = made["id"]
        # a reminder delivered into the session: Done and Snooze under it
        tea = undo["task_id"]
        msg = ReminderMessage(tea, s.core.now(), "api", sid, "", "private", ANN, "Ann", "⏰ Tea — due 10:10")
        await s.http.api.send_reminder(msg)
        reminder = (await ann.get(f"/v1/sessions/{sid}/messages")).json()["messages"][-1]
        assert reminder["role"] == "reminder"
        assert [(b["action"], b["label"], b["task_id"]) for b in reminder["buttons"]] == [
            ("done", "✅ Done", tea),
            ("snooze10", "😴 10 min", tea),
            ("snooze60", "😴 1 h", tea),
        ]
        press = f"/v1/sessions/{sid}/messages/{reminder['id']}/press"
        # only as the caller: Bob cannot reach Ann's session, nor press her task from his own
        assert (await bob.post(press, json={"task_id": tea, "action": "done"})).status_code == 404
        bobs = (await bob.post("/v1/sessions", json={})).json()["id"]
        theirs = await bob.post(f"/v1/sessions/{bobs}/messages/x/press", json={"task_id": tea, "action": "done"})
        assert theirs.status_code == 404 and "Only the person this reminder is for" in theirs.json()["error"]["message"]
        bad = await ann.post(press, json={"task_id": tea, "action": "explode"})
        assert bad.status_code == 400
        snoozed = await ann.post(press, json={"task_id": tea, "action": "snooze10"})
        assert snoozed.status_code == 200 and snoozed.json()["text"].startswith("😴 Snoozed: Tea — until ")
        assert await pool.fetchval("SELECT due_at FROM tasks WHERE id = $1", tea) == s.core.now() + timedelta(
            minutes=10
        )
        shown = (await ann.get(f"/v1/sessions/{sid}/messages")).json()["messages"][-1]
        assert shown["parts"][0]["text"] == "⏰ Tea — due 10:10\n\n" + snoozed.json()["text"]
        assert shown["buttons"] == [], "pressed: what it did instead of the buttons"
        # Undo under /remind's answer deletes the task
        undone = await ann.post(f"/v1/sessions/{sid}/messages/{made_id}/press", json={"task_id": tea, "action": "undo"})
        assert undone.status_code == 200 and undone.json()["text"].startswith("↩️ Undone")
        assert await pool.fetchval("SELECT count(*) FROM tasks WHERE id = $1", tea) == 0
    assert fake_llm.requests == []
